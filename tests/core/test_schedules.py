"""Schedules in the SQL Core: slots (cron in a time zone, every), firing exactly once under
concurrent firers, catch-up after an outage, overlap, pause and trigger.

Time never passes: the firing functions take the time they act for, and a schedule's next
slot is set directly where a test needs a known past."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.compiler import cron as crons
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _schedule(engine: Engine, name: str, flow: str = "f", **options: Any) -> dict[str, Any]:
    expression = options.pop("cron", None)
    if expression is not None:
        parsed = crons.parse(expression)
        options.update(cron=expression, cron_minutes=list(parsed.minutes),
                       cron_hours=list(parsed.hours),
                       cron_days=None if parsed.days is None else list(parsed.days),
                       cron_months=list(parsed.months),
                       cron_weekdays=None if parsed.weekdays is None else list(parsed.weekdays))
    if "input" in options:
        options["input"] = Jsonb(options["input"])
    return engine._call("set_schedule", {"schedule_name": name, "flow_name": flow, **options})


def _at(engine: Engine, name: str, slot: datetime) -> None:
    engine.conn.execute("update flowlane.schedules set next_slot = %s where schedule_name = %s",
                        (slot, name))


def _tick(engine: Engine, now: datetime) -> dict[str, int]:
    result: dict[str, int] = engine.scalar("select flowlane.maintenance_tick(%s)", (now,))
    return result


def _slots(engine: Engine, name: str) -> list[datetime]:
    return [r["schedule_slot"] for r in engine.rows(
        "select schedule_slot from flowlane.runs where schedule_name = %s and schedule_slot is not null "
        "order by schedule_slot", (name,))]


def _next(engine: Engine, name: str, after: datetime, forward: bool = True) -> datetime:
    slot: datetime = engine.scalar(
        "select flowlane._schedule_slot(s, %s, %s) from flowlane.schedules s where schedule_name = %s",
        (after, forward, name))
    return slot


@pytest.fixture
def flow(engine: Engine) -> Engine:
    engine.define("f", [("a", [], {})])
    return engine


# -- slots -----------------------------------------------------------------------------------------


def test_every_slots_are_multiples_of_the_interval_since_the_epoch(flow: Engine) -> None:
    _schedule(flow, "s", every_seconds=600)
    assert _next(flow, "s", T0) == T0 + timedelta(minutes=10)
    assert _next(flow, "s", T0 + timedelta(seconds=1)) == T0 + timedelta(minutes=10)
    assert _next(flow, "s", T0, forward=False) == T0
    assert _next(flow, "s", T0 - timedelta(seconds=1), forward=False) == T0 - timedelta(minutes=10)


def test_cron_slots_are_wall_times_in_the_schedules_zone(flow: Engine) -> None:
    _schedule(flow, "s", cron="0 9 * * MON-FRI", timezone="America/New_York")
    friday = datetime(2026, 1, 9, 15, 0, tzinfo=UTC)  # 10:00 in New York
    assert _next(flow, "s", friday) == datetime(2026, 1, 12, 14, 0, tzinfo=UTC)  # Monday 09:00 EST
    assert _next(flow, "s", friday, forward=False) == datetime(2026, 1, 9, 14, 0, tzinfo=UTC)


def test_daylight_saving_gap_and_repeat(flow: Engine) -> None:
    """The documented rule: a skipped wall time fires when the clock shows it plus the gap;
    a repeated one fires once, at its second occurrence."""
    _schedule(flow, "s", cron="30 2 * * *", timezone="Europe/Berlin", overlap="allow")
    spring = _next(flow, "s", datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    assert spring == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)  # 03:30 CEST: 02:30 never came
    assert _next(flow, "s", spring) == datetime(2026, 3, 30, 0, 30, tzinfo=UTC)  # 02:30 CEST
    autumn = _next(flow, "s", datetime(2026, 10, 24, 12, 0, tzinfo=UTC))
    assert autumn == datetime(2026, 10, 25, 1, 30, tzinfo=UTC)  # 02:30 CET, the second one
    assert _next(flow, "s", autumn) == datetime(2026, 10, 26, 1, 30, tzinfo=UTC)
    # fired by the tick: one run for each day, with its slot
    _at(flow, "s", spring)
    _tick(flow, spring)
    _at(flow, "s", autumn)
    _tick(flow, autumn + timedelta(seconds=30))
    assert _slots(flow, "s") == [spring, autumn]


def _day_matches(parsed: crons.Cron, day: date) -> bool:
    weekday = (day.weekday() + 1) % 7
    in_days = parsed.days is None or day.day in parsed.days
    in_weekdays = parsed.weekdays is None or weekday in parsed.weekdays
    either = parsed.days is not None and parsed.weekdays is not None
    return day.month in parsed.months and ((in_days or in_weekdays) if either else (in_days and in_weekdays))


def _reference(expression: str, zone: str, after: datetime, count: int) -> list[datetime]:
    """The slots by brute force over wall-clock minutes, with the documented rule."""
    parsed, tz, found = crons.parse(expression), ZoneInfo(zone), []
    day = after.astimezone(tz).date() - timedelta(days=1)
    while len(found) < count:
        if _day_matches(parsed, day):
            for hour in parsed.hours:
                for minute in parsed.minutes:
                    wall = datetime(day.year, day.month, day.day, hour, minute)
                    first, second = wall.replace(tzinfo=tz, fold=0), wall.replace(tzinfo=tz, fold=1)
                    skipped = first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall
                    instant = (first if skipped else second).astimezone(UTC)
                    if instant > after and instant not in found:
                        found.append(instant)
        day += timedelta(days=1)
    return sorted(found)[:count]


@pytest.mark.parametrize(("expression", "zone"), [
    ("*/20 1-3 * * *", "Europe/Berlin"),
    ("0 0 29 2 *", "UTC"),
    ("15 2 1,15 * SUN", "America/New_York"),
    ("@hourly", "Australia/Lord_Howe"),
])
def test_cron_slots_agree_with_a_brute_force_reference(flow: Engine, expression: str, zone: str) -> None:
    _schedule(flow, "s", cron=expression, timezone=zone)
    start = datetime(2026, 3, 1, tzinfo=UTC)
    got: list[datetime] = []
    slot = start
    for _ in range(40 if expression != "0 0 29 2 *" else 2):
        slot = _next(flow, "s", slot)
        got.append(slot)
    assert got == _reference(expression, zone, start, len(got))


# -- firing ----------------------------------------------------------------------------------------


def test_a_run_records_its_schedule_and_slot_and_a_slot_fires_once(flow: Engine) -> None:
    _schedule(flow, "s", every_seconds=60, input={"batch": "nightly"})
    _at(flow, "s", T0)
    assert _tick(flow, T0 - timedelta(seconds=1))["fired"] == 0
    assert _tick(flow, T0)["fired"] == 1
    assert _tick(flow, T0 + timedelta(seconds=59))["fired"] == 0
    run = flow.row("select * from flowlane.runs where schedule_name = 's'")
    assert run is not None and run["schedule_slot"] == T0 and run["input"] == {"batch": "nightly"}
    schedule = flow.row("select * from flowlane.schedules where schedule_name = 's'")
    assert schedule is not None
    assert (schedule["last_slot"], schedule["last_run_id"], schedule["next_slot"]) == (
        T0, run["run_id"], T0 + timedelta(minutes=1))
    other = flow.start("f", {})
    with pytest.raises(psycopg.errors.UniqueViolation):  # the database holds it to one run
        flow.conn.execute("update flowlane.runs set schedule_name = 's', schedule_slot = %s "
                          "where run_id = %s", (T0, other))


def test_sixteen_concurrent_firers_start_exactly_one_run_per_slot(flow: Engine, dsn: str) -> None:
    schedules, slots, firers = 10, 100, 16
    for i in range(schedules):
        _schedule(flow, f"s{i}", every_seconds=1, overlap="allow", catch_up="all")
        _at(flow, f"s{i}", T0)
    barrier = threading.Barrier(firers)
    errors: list[BaseException] = []

    def fire(offset: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                for second in range(offset % 3, slots, 3):  # firers interleave their times
                    conn.execute("select flowlane.maintenance_tick(%s)", (T0 + timedelta(seconds=second),))
                conn.execute("select flowlane.maintenance_tick(%s)", (T0 + timedelta(seconds=slots - 1),))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(firers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    expected = [T0 + timedelta(seconds=k) for k in range(slots)]
    for i in range(schedules):
        assert _slots(flow, f"s{i}") == expected
    assert flow.scalar("select count(*) from flowlane.runs") == schedules * slots


def test_catch_up_after_a_three_hour_outage(flow: Engine) -> None:
    for policy in ("all", "latest", "none"):
        _schedule(flow, policy, every_seconds=600, catch_up=policy, overlap="allow")
        _at(flow, policy, T0)
    back = T0 + timedelta(hours=3, minutes=5)
    assert _tick(flow, back)["fired"] == 19 + 1
    assert _slots(flow, "all") == [T0 + timedelta(minutes=10 * k) for k in range(19)]
    assert _slots(flow, "latest") == [T0 + timedelta(hours=3)]
    assert _slots(flow, "none") == []  # 5 minutes late: missed
    next_slots = {r["schedule_name"]: r["next_slot"] for r in flow.rows(
        "select schedule_name, next_slot from flowlane.schedules")}
    assert set(next_slots.values()) == {T0 + timedelta(hours=3, minutes=10)}
    # a slot within the grace is late, not missed: none starts it
    _tick(flow, T0 + timedelta(hours=3, minutes=10, seconds=30))
    assert _slots(flow, "none") == [T0 + timedelta(hours=3, minutes=10)]


def test_catch_up_all_is_capped_per_tick_and_continues(flow: Engine) -> None:
    _schedule(flow, "s", every_seconds=1, catch_up="all", overlap="allow")
    _at(flow, "s", T0)
    now = T0 + timedelta(seconds=149)
    assert _tick(flow, now)["fired"] == 100
    assert _tick(flow, now)["fired"] == 50
    assert _slots(flow, "s") == [T0 + timedelta(seconds=k) for k in range(150)]


def test_overlap_skip_waits_for_the_last_run_to_end(flow: Engine) -> None:
    _schedule(flow, "skip", every_seconds=60)
    _schedule(flow, "allow", every_seconds=60, overlap="allow")
    _at(flow, "skip", T0)
    _at(flow, "allow", T0)
    _tick(flow, T0)
    _tick(flow, T0 + timedelta(minutes=1))  # the first runs are still going
    assert _slots(flow, "skip") == [T0]
    assert _slots(flow, "allow") == [T0, T0 + timedelta(minutes=1)]
    for task in flow.claim("f"):
        flow.complete(task, 1)
    _tick(flow, T0 + timedelta(minutes=2))
    assert _slots(flow, "skip") == [T0, T0 + timedelta(minutes=2)]


def test_a_paused_schedule_fires_nothing_and_resumes_afresh(flow: Engine) -> None:
    _schedule(flow, "s", every_seconds=60, catch_up="all", overlap="allow")
    _at(flow, "s", T0)
    flow.scalar("select flowlane.set_schedule_paused('s', true, 'maintenance window')")
    assert _tick(flow, T0 + timedelta(minutes=5))["fired"] == 0
    override = flow.row("select paused, reason from flowlane.schedule_overrides")
    assert override == {"paused": True, "reason": "maintenance window"}
    resumed = flow.row("select * from flowlane.set_schedule_paused('s', false)")
    assert resumed is not None and resumed["next_slot"] > T0 + timedelta(minutes=5)
    _at(flow, "s", T0 + timedelta(minutes=6))
    assert _tick(flow, T0 + timedelta(minutes=6))["fired"] == 1
    # applying the definition again leaves the operator's pause alone
    flow.scalar("select flowlane.set_schedule_paused('s', true)")
    _schedule(flow, "s", every_seconds=60, catch_up="all", overlap="allow", input={"changed": 1})
    assert flow.scalar("select paused from flowlane.schedule_overrides") is True


def test_trigger_starts_a_run_now_outside_the_slots(flow: Engine) -> None:
    _schedule(flow, "s", cron="0 2 * * *", input={"from": "schedule"})
    run = flow.row("select * from flowlane.trigger_schedule('s')")
    assert run is not None and run["schedule_name"] == "s" and run["schedule_slot"] is None
    assert run["input"] == {"from": "schedule"} and run["status"] == "started"
    other = flow.row("select * from flowlane.trigger_schedule('s', '{\"from\": \"operator\"}')")
    assert other is not None and other["input"] == {"from": "operator"}
    assert flow.scalar("select last_run_id from flowlane.schedules") == other["run_id"]
    with pytest.raises(psycopg.errors.NoDataFound, match='no schedule "nope"'):
        flow.scalar("select flowlane.trigger_schedule('nope')")


def test_a_schedule_follows_its_alias(flow: Engine) -> None:
    flow.define("g", [("b", [], {})])
    flow.scalar("select flowlane.set_alias('current', 'f')")
    _schedule(flow, "s", flow="current", every_seconds=60, overlap="allow")
    _at(flow, "s", T0)
    _tick(flow, T0)
    flow.scalar("select flowlane.set_alias('current', 'g', array['f'])")
    _tick(flow, T0 + timedelta(minutes=1))
    assert [r["flow_slug"] for r in flow.rows(
        "select flow_slug from flowlane.runs order by schedule_slot")] == ["f", "g"]


def test_a_schedule_whose_flow_refuses_its_input_starts_nothing(flow: Engine) -> None:
    flow.define("fan", [("each", [], {"step_type": "map"})])
    flow.scalar("select flowlane.set_alias('current', 'f')")
    _schedule(flow, "s", flow="current", every_seconds=60, overlap="allow")
    flow.scalar("select flowlane.set_alias('current', 'fan', array['f'])")  # maps an array input
    _at(flow, "s", T0)
    assert _tick(flow, T0)["fired"] == 0
    assert flow.scalar("select count(*) from flowlane.runs") == 0
    assert flow.scalar("select next_slot from flowlane.schedules") == T0 + timedelta(minutes=1)


def test_set_schedule_checks_its_arguments(flow: Engine) -> None:
    cases = [
        ({"every_seconds": 60, "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every_seconds": 0}, "every_seconds must be at least 1"),
        ({}, "give exactly one of cron and every_seconds"),
        ({"cron": "0 0 31 2 *"}, None),
        ({"every_seconds": 60, "overlap": "sometimes"}, "overlap must be skip or allow"),
        ({"every_seconds": 60, "catch_up": "most"}, "catch_up must be latest, none or all"),
    ]
    for options, message in cases:
        if message is None:  # parsed by hand: the reader refuses a day that never comes
            options = {"cron": "0 0 31 2 *", "cron_minutes": [0], "cron_hours": [0], "cron_days": [31],
                       "cron_months": [2]}
            message = "never fires"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            flow._call("set_schedule", {"schedule_name": "s", "flow_name": "f", **options})
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="cron minute field must list values"):
        flow._call("set_schedule", {"schedule_name": "s", "flow_name": "f", "cron": "x",
                                    "cron_minutes": [60], "cron_hours": [0], "cron_months": [1]})
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown flow "nope"'):
        _schedule(flow, "s", flow="nope", every_seconds=60)


def test_keep_only_schedules_deletes_the_others(flow: Engine) -> None:
    for name in ("a", "b", "c"):
        _schedule(flow, name, every_seconds=60)
    deleted = flow.scalar("select flowlane.keep_only_schedules(array['b'])")
    assert deleted == ["a", "c"]
    assert [r["schedule_name"] for r in flow.rows("select schedule_name from flowlane.schedules")] == ["b"]
