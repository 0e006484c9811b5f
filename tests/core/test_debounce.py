"""A flow's debounce: the starts of one key within a period collapse into one pending run,
which the maintenance tick begins with the last start's input once a period passes without
another start, or once the maximum wait since the first start is reached. Time passes by
ticking for a later time and by backdating the pending run, never by sleeping."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.core import migrator
from tests.core.engine import Engine, assert_invariants
from tests.core.test_flow_control import claim, claimed, holds, status
from tests.release_support import previous_release

pytestmark = pytest.mark.slow

Row = dict[str, Any]


def start(engine: Engine, flow: str, input: Any) -> tuple[uuid.UUID, bool]:
    """A start and whether it joined an earlier run (what `flowlane start` reports)."""
    row = engine.row("select r.run_id, current_setting('flowlane.found_run', true) as found "
                     "from flowlane.start_flow(%s, %s) r", (flow, Jsonb(input)))
    return row["run_id"], row["found"] == str(row["run_id"])


def tick(engine: Engine, seconds_later: float = 0) -> Row:
    row: Row = engine.row("select flowlane.maintenance_tick(now() + make_interval(secs => %s)) as t",
                          (seconds_later,))["t"]
    return row


def test_starts_of_one_key_collapse_into_one_run_with_the_last_input(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], debounce_key="/customer_id", debounce_period=60)
    first, joined_first = start(engine, "f", {"customer_id": 7, "n": 1})
    second, joined_second = start(engine, "f", {"customer_id": 7, "n": 2})
    other, _ = start(engine, "f", {"customer_id": 8, "n": 1})
    assert (first, joined_first, joined_second) == (second, False, True)
    assert other != first
    assert status(engine, first) == "waiting" and engine.run(first)["input"] == {"customer_id": 7, "n": 2}
    [hold] = holds(engine, [first])
    assert hold["waiting_for"].startswith("debounce customer_id=7: starts in ")
    assert hold["waiting_for"].endswith(" s unless another arrives")
    assert tick(engine)["begun"] == 0  # the period has not passed
    assert tick(engine, 61)["begun"] == 2
    assert status(engine, first) == "started" and status(engine, other) == "started"
    assert {t["run_id"] for t in claimed(claim(engine, "f"))} == {first, other}
    # a start after the run began makes a new pending run
    third, joined_third = start(engine, "f", {"customer_id": 7, "n": 3})
    assert third != first and not joined_third and status(engine, third) == "waiting"
    assert_invariants(engine)


def test_each_start_moves_the_start_a_period_on_until_the_maximum_wait(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], debounce_key="/k", debounce_period=60, debounce_max_wait=100)
    run, _ = start(engine, "f", {"k": 1, "n": 1})
    engine.conn.execute("update flowlane.runs set debounce_since = debounce_since - interval '50 s', "
                   "start_at = start_at - interval '50 s' where run_id = %s", (run,))
    start(engine, "f", {"k": 1, "n": 2})  # 50 s after the first: starts at 110 s, capped to 100 s
    waits = engine.row("select extract(epoch from start_at - debounce_since) as since_first, "
                       "extract(epoch from start_at - now()) as from_now "
                       "from flowlane.runs where run_id = %s", (run,))
    assert waits["since_first"] == 100 and 49 < waits["from_now"] <= 50
    engine.conn.execute("update flowlane.runs set debounce_since = debounce_since - interval '60 s', "
                   "start_at = start_at - interval '60 s' where run_id = %s", (run,))
    again, joined = start(engine, "f", {"k": 1, "n": 3})  # past the maximum wait: due at once
    assert (again, joined) == (run, True)
    assert tick(engine)["begun"] == 1
    assert engine.run(run)["input"] == {"k": 1, "n": 3} and status(engine, run) == "started"
    assert_invariants(engine)


def test_start_flows_debounces_each_input_and_a_root_map_maps_the_last_input(engine: Engine) -> None:
    engine.define("m", [("each", [], {"step_type": "map"})], debounce_period=5)
    runs = [r["run_id"] for r in engine.rows("select run_id from flowlane.start_flows(%s, %s::jsonb[])",
                                             ("m", [Jsonb([1]), Jsonb([1, 2, 3])]))]
    assert runs[0] == runs[1]
    tick(engine, 6)
    assert len(claimed(claim(engine, "m"))) == 3
    assert_invariants(engine)


def test_a_cancelled_pending_run_is_not_joined(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], debounce_period=30)
    run, _ = start(engine, "f", {})
    engine.conn.execute("select flowlane.cancel_run(%s)", (run,))
    again, joined = start(engine, "f", {})
    assert again != run and not joined


def test_debounce_options_are_checked(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=r"maximum wait \(10 s\) must be at least the period \(60 s\)"):
        engine.define("bad", [("a", [], {})], debounce_period=60, debounce_max_wait=10)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="needs a debounce period"):
        engine.define("bad2", [("a", [], {})], debounce_key="/k")


def test_a_database_of_the_previous_release_takes_debounce_after_the_upgrade(
        db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory(previous_release().last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("old", [("a", [], {})])
        delayed = engine.row("select run_id from flowlane.start_flow('old', '{\"k\": 1}', "
                             "start_at => now() + interval '1 h')")["run_id"]
        started = engine.start("old", {"k": 1})
        migrator.migrate(conn)
        assert engine.row("select debounce_key, debounce_since from flowlane.runs where run_id = %s",
                          (delayed,)) == {"debounce_key": None, "debounce_since": None}
        engine.create_flow("old", debounce_key="/k", debounce_period=60)
        joined, existed = start(engine, "old", {"k": 1, "n": 2})
        assert joined not in (delayed, started) and not existed  # a plain delayed run is no pending one
        assert start(engine, "old", {"k": 1, "n": 3}) == (joined, True)
        assert tick(engine, 3601)["begun"] == 2
        assert status(engine, delayed) == "started" and engine.run(joined)["input"] == {"k": 1, "n": 3}
        assert_invariants(engine)


def test_a_debounced_run_of_a_limited_flow_takes_the_concurrency_key_of_its_last_input(
        engine: Engine) -> None:
    engine.define("f", [("a", [], {})], debounce_key="/cart", debounce_period=60,
                  concurrency_limit=1, concurrency_key="/customer")
    busy = engine.start("f", {"cart": 0, "customer": "b"}, run_id=uuid.uuid4())  # a run id: not debounced
    run, _ = start(engine, "f", {"cart": 1, "customer": "a"})
    start(engine, "f", {"cart": 1, "customer": "b"})
    assert engine.run(run)["concurrency_key"] == "b"
    tick(engine, 61)
    assert (status(engine, busy), status(engine, run)) == ("started", "waiting")  # held behind b's run
    assert holds(engine, [run])[0]["waiting_for"] == "concurrency customer=b: 1 of 1 started"
    assert_invariants(engine)
