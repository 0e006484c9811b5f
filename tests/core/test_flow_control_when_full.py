"""What a full concurrency key does with a new run (a flow's concurrency when_full): queue
(the default: it waits its turn), replace_waiting (it replaces the key's waiting runs) and
cancel_running (it cancels the key's oldest started runs, whose tasks are fenced)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants
from tests.core.test_flow_control import claim, claimed, holds, status

pytestmark = pytest.mark.slow


def start_many(engine: Engine, flow: str, inputs: list[Any]) -> list[uuid.UUID]:
    return [r["run_id"] for r in engine.rows("select run_id from flowlane.start_flows(%s, %s::jsonb[])",
                                             (flow, [Jsonb(i) for i in inputs]))]


def test_replace_waiting_keeps_only_the_newest_waiting_run_of_a_key(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1, concurrency_key="/customer_id",
                  concurrency_when_full="replace_waiting")
    running = engine.start("f", {"customer_id": 7, "n": 1})
    second = engine.start("f", {"customer_id": 7, "n": 2})
    other = engine.start("f", {"customer_id": 8, "n": 1})
    assert [status(engine, r) for r in (running, second, other)] == ["started", "waiting", "started"]
    third = engine.start("f", {"customer_id": 7, "n": 3})
    assert [status(engine, r) for r in (running, second, third)] == ["started", "cancelled", "waiting"]
    assert engine.run(second)["cancel_reason"] == (
        f"superseded by run {third} (concurrency customer_id=7, when_full replace_waiting)")
    assert holds(engine, [third])[0]["waiting_for"] == "concurrency customer_id=7: 1 of 1 started"
    # the running run is untouched; its end begins the newest start
    task = next(t for t in claimed(claim(engine, "f")) if t["run_id"] == running)
    engine.complete(task, 1)
    assert status(engine, third) == "started"
    [task] = claimed(claim(engine, "f"))
    assert task["run_id"] == third
    assert engine.run(third)["input"] == {"customer_id": 7, "n": 3}
    assert_invariants(engine)


def test_replace_waiting_in_one_batch_keeps_the_last_input_of_each_key(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1, concurrency_key="/k",
                  concurrency_when_full="replace_waiting")
    runs = start_many(engine, "f", [{"k": 1, "n": n} for n in range(4)] + [{"k": 2, "n": 0}])
    assert [status(engine, r) for r in runs] == ["started", "cancelled", "cancelled", "waiting", "started"]
    assert_invariants(engine)


def test_cancel_running_cancels_the_running_run_and_fences_its_tasks(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})], concurrency_limit=1, concurrency_key="/k",
                  concurrency_when_full="cancel_running")
    old = engine.start("f", {"k": 1})
    [task] = claimed(claim(engine, "f"))
    new = engine.start("f", {"k": 1})
    assert status(engine, old) == "cancelled" and status(engine, new) == "started"
    assert engine.run(old)["cancel_reason"] == (
        f"superseded by run {new} (concurrency k=1, when_full cancel_running)")
    # the old run's in-flight task is fenced: its late result changes nothing
    engine.complete(task, 1)
    assert engine.scalar("select status from flowlane.step_tasks where run_id = %s", (old,)) == "cancelled"
    assert status(engine, old) == "cancelled"
    [fresh] = claimed(claim(engine, "f"))
    assert fresh["run_id"] == new
    assert_invariants(engine)


def test_cancel_running_with_a_limit_of_two_keeps_the_newest_two(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=2, concurrency_key="/k",
                  concurrency_when_full="cancel_running")
    first, second = engine.start("f", {"k": 1}), engine.start("f", {"k": 1})
    third = engine.start("f", {"k": 1})
    assert [status(engine, r) for r in (first, second, third)] == ["cancelled", "started", "started"]
    batch = start_many(engine, "f", [{"k": 1}] * 3)
    assert [status(engine, r) for r in (second, third, *batch)] == [
        "cancelled", "cancelled", "cancelled", "started", "started"]
    assert engine.scalar("select count(*) from flowlane.runs where status = 'started'") == 2
    assert_invariants(engine)


@pytest.mark.parametrize("when_full", ["replace_waiting", "cancel_running"])
def test_a_delayed_run_applies_when_full_when_it_becomes_due(engine: Engine, when_full: str) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1, concurrency_when_full=when_full)
    running = engine.start("f", {})
    waiting = engine.start("f", {}) if when_full == "replace_waiting" else None
    delayed = engine.scalar(
        "select run_id from flowlane.start_flow('f', '{}', start_at => now() + interval '1 minute')")
    assert status(engine, delayed) == "waiting" and status(engine, running) == "started"
    engine.scalar("select flowlane.maintenance_tick(now() + interval '2 minutes')")
    if when_full == "replace_waiting":
        assert waiting is not None
        assert [status(engine, r) for r in (running, waiting, delayed)] == ["started", "cancelled", "waiting"]
    else:
        assert [status(engine, r) for r in (running, delayed)] == ["cancelled", "started"]
    assert_invariants(engine)


def test_when_full_is_checked(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be queue, replace_waiting or"):
        engine.create_flow("f", concurrency_limit=1, concurrency_when_full="drop")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="needs a concurrency limit"):
        engine.create_flow("f", concurrency_when_full="cancel_running")
    assert engine.create_flow("f", concurrency_limit=1)["opt_concurrency_when_full"] == "queue"


@pytest.mark.parametrize("when_full", ["queue", "replace_waiting"])
def test_a_run_held_after_the_ending_transaction_began_begins_in_it(
        engine: Engine, dsn: str, when_full: str) -> None:
    # the transaction that ends a run began (its now()) before the held run was created
    engine.define("f", [("a", [], {})], concurrency_limit=1, concurrency_when_full=when_full)
    first = engine.start("f", {})
    [task] = claimed(claim(engine, "f"))
    with psycopg.connect(dsn) as ender:
        ender.execute("select now()")  # the transaction's time is fixed from here
        held = engine.start("f", {})
        assert status(engine, held) == "waiting"
        ender.execute("select * from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                      (first, "a", 0, Jsonb(1), engine.worker_id, task["attempt"]))
        ender.commit()
    assert status(engine, first) == "completed" and status(engine, held) == "started"
    assert_invariants(engine)
