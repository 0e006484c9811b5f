"""Idempotent starts, delayed starts and run deadlines, driven through the SQL Core.

Time never passes in these tests: the maintenance tick takes the time it acts for."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def _keyed(engine: Engine, flow: str, input: Any, key: str | None = None) -> uuid.UUID:
    return uuid.UUID(str(engine.scalar(
        "select run_id from flowlane.start_flow(%s, %s, idempotency_key => %s)",
        (flow, Jsonb(input), key))))


def _tick(engine: Engine, seconds_from_now: float) -> dict[str, int]:
    result: dict[str, int] = engine.scalar(
        "select flowlane.maintenance_tick(now() + make_interval(secs => %s))", (seconds_from_now,))
    return result


# -- idempotent starts ---------------------------------------------------------------------------


def test_a_second_start_with_the_same_key_returns_the_first_run(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    first = _keyed(engine, "f", {"n": 1}, "order-7")
    again = _keyed(engine, "f", {"n": 2}, "order-7")
    other = _keyed(engine, "f", {"n": 1}, "order-8")
    assert again == first and other != first
    assert engine.scalar("select count(*) from flowlane.runs") == 2
    row = engine.row(
        "select called_as, idempotency_key, input from flowlane.runs where run_id = %s", (first,))
    assert row == {"called_as": "f", "idempotency_key": "order-7", "input": {"n": 1}}


def test_a_key_is_scoped_by_the_name_the_caller_started(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.scalar("select flowlane.set_alias('g', 'f')")
    by_flow = _keyed(engine, "f", {}, "k")
    by_alias = _keyed(engine, "g", {}, "k")
    assert by_flow != by_alias
    assert _keyed(engine, "g", {}, "k") == by_alias


def test_a_dedup_pointer_derives_the_key_from_the_input(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], dedup_key="/order/id")
    first = _keyed(engine, "f", {"order": {"id": 42}, "try": 1})
    assert _keyed(engine, "f", {"order": {"id": 42}, "try": 2}) == first
    assert _keyed(engine, "f", {"order": {"id": "42"}}) == first  # the key is text
    assert _keyed(engine, "f", {"order": {"id": 43}}) != first
    assert _keyed(engine, "f", {"order": {"id": 42}}, "explicit") != first  # the caller's key wins
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no value at the dedup key /order/id"):
        _keyed(engine, "f", {"order": {}})


def test_start_flows_with_a_dedup_pointer_starts_one_run_per_key(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], dedup_key="/k")
    earlier = _keyed(engine, "f", {"k": "b"})
    ids = [r["run_id"] for r in engine.rows(
        "select run_id from flowlane.start_flows('f', %s::jsonb[])",
        ([Jsonb({"k": "a"}), Jsonb({"k": "b"}), Jsonb({"k": "a"})],))]
    assert ids[0] == ids[2] and ids[1] == earlier and ids[0] != earlier
    assert engine.scalar("select count(*) from flowlane.runs") == 2


def test_bad_dedup_pointer_and_key_are_refused(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not a JSON pointer"):
        engine.create_flow("f", dedup_key="order.id")
    engine.define("g", [("a", [], {})])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="1 to 500 characters"):
        _keyed(engine, "g", {}, "")


def test_concurrent_identical_keyed_starts_create_one_run(
    engine: Engine, dsn: str
) -> None:
    engine.define("f", [("a", [], {})])
    callers = 32
    barrier = threading.Barrier(callers)
    found: list[str] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                row = conn.execute(
                    "select run_id from flowlane.start_flow('f', '{}', idempotency_key => 'same')"
                ).fetchone()
                assert row is not None
                found.append(str(row[0]))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(found) == callers and len(set(found)) == 1
    assert engine.scalar("select count(*) from flowlane.runs") == 1
    assert len(engine.queue_messages("f")) == 1


# -- delayed starts -------------------------------------------------------------------------------


def _start_at(engine: Engine, flow: str, seconds_from_now: float) -> uuid.UUID:
    return uuid.UUID(str(engine.scalar(
        "select run_id from flowlane.start_flow(%s, '{}', start_at => now() + make_interval(secs => %s))",
        (flow, seconds_from_now))))


def test_a_delayed_run_waits_visibly_and_begins_on_the_tick_after_its_time(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})])
    run_id = _start_at(engine, "f", 600)
    run = engine.run(run_id)
    assert run["status"] == "waiting" and run["start_at"] is not None
    assert engine.statuses(run_id) == {"a": "created", "b": "created"}
    assert engine.queue_messages("f") == []
    assert _tick(engine, 599)["begun"] == 0
    assert engine.run(run_id)["status"] == "waiting"
    assert _tick(engine, 600)["begun"] == 1
    assert engine.run(run_id)["status"] == "started"
    assert engine.statuses(run_id) == {"a": "started", "b": "created"}
    [task] = engine.claim("f")
    assert task["step_slug"] == "a"
    assert _tick(engine, 601)["begun"] == 0  # once


def test_a_start_time_in_the_past_starts_at_once(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = _start_at(engine, "f", -5)
    assert engine.run(run_id)["status"] == "started"
    assert len(engine.claim("f")) == 1


def test_a_waiting_run_can_be_cancelled_and_never_begins(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = _start_at(engine, "f", 60)
    run = engine.row("select * from flowlane.cancel_run(%s, 'not needed')", (run_id,))
    assert run is not None and run["status"] == "cancelled"
    assert engine.statuses(run_id) == {"a": "cancelled"}
    assert _tick(engine, 120)["begun"] == 0
    assert engine.run(run_id)["status"] == "cancelled"


def test_start_flows_can_start_later(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    rows = engine.rows(
        "select run_id, status from flowlane.start_flows('f', array['{}', '{}']::jsonb[], "
        "now() + interval '1 minute')")
    assert [r["status"] for r in rows] == ["waiting", "waiting"]
    assert _tick(engine, 60)["begun"] == 2
    assert len(engine.claim("f")) == 2


# -- deadlines ------------------------------------------------------------------------------------


def test_a_run_past_its_deadline_fails_and_a_late_result_is_rejected(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", [], {}), ("c", ["a"], {})], deadline=60)
    run_id = engine.start("f", {})
    run = engine.run(run_id)
    assert (run["deadline_at"] - run["started_at"]).total_seconds() == 60
    claimed = {t["step_slug"]: t for t in engine.claim("f", qty=1)}
    assert set(claimed) == {"a"}  # a is running, b still queued
    assert _tick(engine, 59)["failed"] == 0
    assert _tick(engine, 60)["failed"] == 1
    run = engine.run(run_id)
    assert (run["status"], run["error_message"]) == ("failed", "deadline exceeded after 60 s")
    assert engine.queue_messages("f") == []  # b's message archived, a's fenced
    assert {t["status"] for t in engine.tasks(run_id)} == {"cancelled"}
    late = engine.complete(claimed["a"], {"x": 1})
    assert late is not None and late["status"] == "cancelled" and late["output"] is None
    assert engine.statuses(run_id) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    assert _tick(engine, 120)["failed"] == 0


def test_a_retried_run_gets_a_fresh_deadline(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], deadline=60)
    run_id = engine.start("f", {})
    engine.conn.execute("update flowlane.runs set started_at = started_at - interval '2 minutes', "
                        "deadline_at = deadline_at - interval '2 minutes' where run_id = %s", (run_id,))
    assert _tick(engine, 0)["failed"] == 1
    retried = engine.row("select * from flowlane.retry_run(%s)", (run_id,))
    assert retried is not None and retried["status"] == "started"
    assert (retried["deadline_at"] - retried["retried_at"]).total_seconds() == 60
    assert _tick(engine, 0)["failed"] == 0


def test_a_delayed_runs_deadline_counts_from_its_start(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], deadline=30)
    run_id = _start_at(engine, "f", 100)
    assert engine.run(run_id)["deadline_at"] is None
    _tick(engine, 100)
    run = engine.run(run_id)
    assert (run["deadline_at"] - run["started_at"]).total_seconds() == 30


def test_a_finished_run_has_no_deadline_to_miss(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], deadline=10)
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.complete(task, 1)
    assert _tick(engine, 3600) == {
        "fired": 0, "begun": 0, "failed": 0, "waits_expired": 0, "released": 0, "pruned": 0,
        "cache_pruned": 0}
    assert engine.run(run_id)["status"] == "completed"


def test_a_flow_without_a_deadline_never_fails_for_time(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    assert engine.run(run_id)["deadline_at"] is None
    assert _tick(engine, 10 * 365 * 86400)["failed"] == 0


def test_the_deadline_option_is_checked(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="deadline must be at least 1 second"):
        engine.create_flow("f", deadline=0)


def test_a_waiting_run_keeps_its_version_from_counting_as_drained(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.define("g", [("a", [], {})])
    engine.scalar("select flowlane.set_alias('current', 'f')")
    _start_at(engine, "current", 600)
    engine.scalar("select flowlane.set_alias('current', 'g', array['f'])")
    status = engine.row("select started_runs, drained from flowlane.drain_status() where flow_slug = 'f'")
    assert status == {"started_runs": 1, "drained": False}
