"""A flow's failure handler: a run of the flow it names, started once when a run fails."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

THREE = [("a", [], {}), ("b", ["a"], {}), ("c", ["b"], {"max_attempts": 1})]


def _define(engine: Engine, **options: Any) -> None:
    engine.define("cleanup", [("report", [], {"max_attempts": 2})])
    engine.define("f", THREE, on_failure="cleanup", **options)


def _drive_to_failure(engine: Engine, run_id: uuid.UUID, error: str = "card declined") -> None:
    for step in ("a", "b"):
        (task,) = engine.claim("f")
        assert task["step_slug"] == step
        engine.complete(task, {"from": step})
    (task,) = engine.claim("f")
    assert task["step_slug"] == "c"
    engine.fail(task, error)
    assert engine.run(run_id)["status"] == "failed"


def _handlers(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return engine.rows("select * from flowlane.runs where failure_of = %s", (run_id,))


def test_a_failed_run_starts_its_failure_handler_once_with_the_failure_as_input(engine: Engine) -> None:
    _define(engine)
    run_id = engine.start("f", {"order": 7})
    _drive_to_failure(engine, run_id)
    (handler,) = _handlers(engine, run_id)
    assert (handler["flow_slug"], handler["status"]) == ("cleanup", "started")
    assert handler["input"] == {
        "run_id": str(run_id), "flow": "f", "status": "failed",
        "error": "step c task 0 failed after 1 attempt: card declined",
        "failed_step": "c", "step_error": "card declined",
        "outputs": {"a": {"from": "a"}, "b": {"from": "b"}}, "input": {"order": 7}}
    # a real task on its flow's queue, claimed and completed the usual way
    (task,) = engine.claim("cleanup")
    assert task["input"]["failed_step"] == "c"
    engine.complete(task, {"undone": True})
    assert engine.run(handler["run_id"])["status"] == "completed"
    assert engine.run(run_id)["status"] == "failed"
    # a retried run that fails again does not start a second handler
    engine.row("select * from flowlane.retry_run(%s)", (run_id,))
    (task,) = engine.claim("f")
    engine.fail(task)
    assert engine.run(run_id)["status"] == "failed"
    assert len(_handlers(engine, run_id)) == 1


def test_a_failure_handler_that_fails_is_recorded_and_starts_nothing_more(engine: Engine) -> None:
    engine.define("cleanup", [("report", [], {"max_attempts": 1})], on_failure="f")
    engine.define("f", THREE, on_failure="cleanup")
    run_id = engine.start("f", {})
    _drive_to_failure(engine, run_id)
    (handler,) = _handlers(engine, run_id)
    (task,) = engine.claim("cleanup")
    engine.fail(task, "the handler broke")
    assert engine.run(handler["run_id"])["status"] == "failed"
    assert engine.scalar("select count(*) from flowlane.task_attempts where run_id = %s",
                         (handler["run_id"],)) == 1
    assert engine.scalar("select count(*) from flowlane.runs") == 2  # no handler of the handler


def test_a_run_past_its_deadline_starts_the_handler_without_a_failed_step(engine: Engine) -> None:
    _define(engine, deadline=60)
    run_id = engine.start("f", {})
    engine.scalar("select flowlane.maintenance_tick(now() + interval '61 seconds')")
    (handler,) = _handlers(engine, run_id)
    assert handler["input"]["error"] == "deadline exceeded after 60 s"
    assert (handler["input"]["failed_step"], handler["input"]["outputs"]) == (None, {})


def test_cancelling_starts_the_handler_only_when_the_flow_says_so(engine: Engine) -> None:
    _define(engine)
    quiet = engine.start("f", {})
    engine.row("select * from flowlane.cancel_run(%s, 'no longer wanted')", (quiet,))
    assert _handlers(engine, quiet) == []
    engine.create_flow("f", on_failure="cleanup", on_failure_on_cancel=True)
    told = engine.start("f", {})
    engine.row("select * from flowlane.cancel_run(%s, 'no longer wanted')", (told,))
    (handler,) = _handlers(engine, told)
    assert (handler["input"]["status"], handler["input"]["error"]) == ("cancelled", "no longer wanted")


def test_a_handler_that_cannot_start_leaves_the_failure_and_says_so(engine: Engine) -> None:
    engine.define("f", THREE, on_failure="missing")
    run_id = engine.start("f", {})
    _drive_to_failure(engine, run_id, "boom")
    run = engine.run(run_id)
    assert run["error_message"] == (
        "step c task 0 failed after 1 attempt: boom; failure handler missing could not start: "
        "unknown flow \"missing\" (no flow or alias has this slug)")
    assert _handlers(engine, run_id) == []


def test_a_flow_cannot_name_itself_as_its_failure_handler(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="names the flow itself"):
        engine.create_flow("f", on_failure="F")
