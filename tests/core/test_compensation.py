"""Compensation: a failed run's completed steps are compensated in reverse dependency order,
each once, by a run of the flow the step names; a failing compensation stops the chain until
retry_compensation."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

UNDO = {"max_attempts": 1}


def _define(engine: Engine, a_compensates: str = "undo") -> None:
    engine.define("undo", [("work", [], UNDO)])
    engine.define("f", [("a", [], {"compensate": a_compensates}), ("b", ["a"], {"compensate": "undo"}),
                        ("c", ["b"], {"max_attempts": 1, "compensate": "undo"})])


def _fail_at_c(engine: Engine, run_id: uuid.UUID) -> None:
    for step in ("a", "b"):
        (task,) = engine.claim("f")
        assert task["step_slug"] == step
        engine.complete(task, {"done": step})
    (task,) = engine.claim("f")
    engine.fail(task, "no courier")


def _compensations(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = engine.scalar("select flowlane.get_run_compensations(%s)", (run_id,))
    return found


def _statuses(engine: Engine, run_id: uuid.UUID) -> list[tuple[str, str]]:
    return [(c["step_slug"], c["status"]) for c in _compensations(engine, run_id)]


def test_the_completed_steps_are_compensated_in_reverse_order_once_each(engine: Engine) -> None:
    _define(engine)
    run_id = engine.start("f", {"order": 7})
    _fail_at_c(engine, run_id)
    assert engine.run(run_id)["compensation"] == "running"
    assert _statuses(engine, run_id) == [("b", "started"), ("a", "pending")]  # c never completed
    (task,) = engine.claim("undo")
    assert task["input"] == {"run_id": str(run_id), "flow": "f", "step": "b",
                             "input": {"a": {"done": "a"}}, "output": {"done": "b"}}
    assert engine.claim("undo") == []  # a's waits for b's
    engine.complete(task, {"undone": "b"})
    assert _statuses(engine, run_id) == [("b", "completed"), ("a", "started")]
    (task,) = engine.claim("undo")
    assert (task["input"]["step"], task["input"]["input"]) == ("a", {"order": 7})
    engine.complete(task, {"undone": "a"})
    run = engine.run(run_id)
    assert (run["status"], run["compensation"]) == ("failed", "completed")
    assert engine.scalar("select count(*) from flowlane.runs where compensation_of = %s", (run_id,)) == 2
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="has been compensated"):
        engine.row("select * from flowlane.retry_run(%s)", (run_id,))


def test_branches_are_compensated_before_the_step_they_needed(engine: Engine) -> None:
    engine.define("undo", [("work", [], UNDO)])
    engine.define("f", [("a", [], {"compensate": "undo"}), ("b", ["a"], {"compensate": "undo"}),
                        ("c", ["a"], {}), ("d", ["c"], {"compensate": "undo"}),
                        ("e", ["b", "d"], {"max_attempts": 1})])
    run_id = engine.start("f", {})
    while (tasks := engine.claim("f")):
        for task in tasks:
            if task["step_slug"] == "e":
                engine.fail(task)
            else:
                engine.complete(task, {"done": task["step_slug"]})
    assert engine.run(run_id)["status"] == "failed"
    # a waits for b's and for d's (d needs c, which needs a)
    assert sorted(_statuses(engine, run_id)) == [("a", "pending"), ("b", "started"), ("d", "started")]
    tasks = {t["input"]["step"]: t for t in engine.claim("undo")}
    assert set(tasks) == {"b", "d"}
    engine.complete(tasks["d"], {})
    assert engine.claim("undo") == []
    engine.complete(tasks["b"], {})
    (last,) = engine.claim("undo")
    assert last["input"]["step"] == "a"


def test_a_failing_compensation_stops_the_chain_until_it_is_retried(engine: Engine) -> None:
    _define(engine)
    run_id = engine.start("f", {})
    _fail_at_c(engine, run_id)
    (task,) = engine.claim("undo")
    engine.fail(task, "refund refused")
    assert engine.run(run_id)["compensation"] == "stopped"
    assert _statuses(engine, run_id) == [("b", "failed"), ("a", "pending")]
    assert engine.claim("undo") == []
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="no stopped compensation"):
        engine.row("select * from flowlane.retry_compensation(%s)", (engine.start("f", {}),))
    resumed = engine.row("select * from flowlane.retry_compensation(%s)", (run_id,))
    assert resumed is not None and resumed["compensation"] == "running"
    (task,) = engine.claim("undo")
    assert task["input"]["step"] == "b"  # the same compensation run, retried
    engine.complete(task, {})
    (task,) = engine.claim("undo")
    engine.complete(task, {})
    assert engine.run(run_id)["compensation"] == "completed"
    assert engine.scalar("select count(*) from flowlane.runs where compensation_of = %s", (run_id,)) == 2


def test_a_compensation_that_cannot_start_stops_the_chain_and_says_why(engine: Engine) -> None:
    _define(engine, a_compensates="missing")
    run_id = engine.start("f", {})
    _fail_at_c(engine, run_id)
    (task,) = engine.claim("undo")
    engine.complete(task, {})
    run = engine.run(run_id)
    assert run["compensation"] == "stopped"
    assert run["error_message"].endswith("compensation missing of step a could not start: "
                                         "unknown flow \"missing\" (no flow or alias has this slug)")
    assert _statuses(engine, run_id) == [("b", "completed"), ("a", "failed")]


def test_a_run_with_nothing_to_compensate_has_no_compensation(engine: Engine) -> None:
    _define(engine)
    run_id = engine.start("f", {})
    (task,) = engine.claim("f")
    engine.fail(task)  # a had 3 attempts: a retry, not a failure of the run
    assert engine.run(run_id)["compensation"] is None
    engine.define("g", [("x", [], {"max_attempts": 1, "compensate": "undo"})])
    other = engine.start("g", {})
    (task,) = engine.claim("g")
    engine.fail(task)
    run = engine.run(other)
    assert (run["status"], run["compensation"]) == ("failed", None)
    assert _compensations(engine, other) == []
