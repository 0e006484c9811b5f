"""retry_runs and cancel_runs: a batch of runs retried or cancelled in one call."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow


def _failed_runs(engine: Engine, count: int) -> list[uuid.UUID]:
    runs = [engine.start("f", {"n": n}) for n in range(count)]
    for task in engine.claim("f"):
        engine.fail(task, "CardDeclined: no")
    return runs


def test_a_batch_retries_the_failed_runs_and_passes_over_the_others(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1})])
    failed = _failed_runs(engine, 3)
    engine.row("select * from flowlane.retry_run(%s)", (failed[0],))  # retried meanwhile
    started = engine.start("f", {})
    retried = engine.rows("select x from flowlane.retry_runs(%s) as x", ([*failed, started, uuid.uuid4()],))
    assert sorted(r["x"] for r in retried) == sorted(failed[1:])
    assert [engine.run(r)["retry_count"] for r in failed] == [1, 1, 1]
    assert engine.run(started)["status"] == "started"
    assert_invariants(engine)


def test_a_batch_cancels_started_and_waiting_runs_only(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1})])
    [failed] = _failed_runs(engine, 1)
    started = engine.start("f", {})
    cancelled = engine.rows("select x from flowlane.cancel_runs(%s, 'bad deploy') as x", ([failed, started],))
    assert [r["x"] for r in cancelled] == [started]
    assert engine.run(started)["cancel_reason"] == "bad deploy"
    assert engine.run(failed)["status"] == "failed"
    assert_invariants(engine)


@pytest.mark.parametrize("function", ["retry_runs", "cancel_runs"])
def test_a_batch_is_at_most_a_thousand_runs(engine: Engine, function: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 1000 runs a call, got 1001"):
        engine.rows(f"select * from flowlane.{function}(%s)", ([uuid.uuid4() for _ in range(1001)],))
