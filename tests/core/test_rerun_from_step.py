"""retry_run_from: a failed or completed run reruns a step and what depends on it."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

# a -> b -> c, a -> m (map over a) -> d; side stands alone
STEPS: list[tuple[str, list[str], dict[str, Any]]] = [
    ("a", [], {}),
    ("b", ["a"], {}),
    ("c", ["b"], {}),
    ("m", ["a"], {"step_type": "map"}),
    ("d", ["m"], {}),
    ("side", [], {}),
]


def _handler(calls: Counter[str], round_: int) -> Any:
    def handle(task: dict[str, Any]) -> Any:
        calls[task["step_slug"]] += 1
        if task["step_slug"] == "a":
            return [1, 2] if round_ == 0 else [1, 2, 3]
        return f"{task['step_slug']}{task['task_index']}-{round_}"
    return handle


def _rerun(engine: Engine, run_id: uuid.UUID, step: str) -> dict[str, Any]:
    row = engine.row("select * from flowlane.retry_run_from(%s, %s)", (run_id, step))
    assert row is not None
    return row


def _attempts(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return engine.rows("select * from flowlane.task_attempts where run_id = %s order by id", (run_id,))


def test_a_completed_run_reruns_only_the_step_and_its_dependents(engine: Engine) -> None:
    engine.define("f", STEPS)
    run_id = engine.start("f", {})
    first: Counter[str] = Counter()
    engine.drive("f", _handler(first, 0))
    done = engine.run(run_id)
    assert done["status"] == "completed" and done["output"]["c"] == "c0-0"

    run = _rerun(engine, run_id, "b")
    assert (run["status"], run["retry_count"], run["output"]) == ("started", 1, None)
    assert run["completed_at"] is None
    assert engine.statuses(run_id) == {"a": "completed", "b": "started", "c": "created", "m": "completed",
                                       "d": "completed", "side": "completed"}
    second: Counter[str] = Counter()
    engine.drive("f", _handler(second, 1))
    assert second == Counter({"b": 1, "c": 1})
    final = engine.run(run_id)
    assert final["status"] == "completed"
    assert final["output"] == {"c": "c0-1", "d": "d0-0", "side": "side0-0"}
    # the first execution of the rerun steps stays in the history, with its output
    history = [(h["step_slug"], h["outcome"], h["retry_round"], h["output"])
               for h in _attempts(engine, run_id)]
    assert history == [("b", "superseded", 0, "b0-0"), ("c", "superseded", 0, "c0-0")]
    assert_invariants(engine)


def test_a_rerun_map_step_is_sized_again_from_the_kept_output_it_maps(engine: Engine) -> None:
    engine.define("f", STEPS)
    run_id = engine.start("f", {})
    engine.drive("f", _handler(Counter(), 0))
    # the output a map maps is kept: a rerun from the map has as many tasks as before
    _rerun(engine, run_id, "m")
    calls: Counter[str] = Counter()
    engine.drive("f", _handler(calls, 1))
    assert calls == Counter({"m": 2, "d": 1})
    assert engine.states(run_id)["m"]["output"] == ["m0-1", "m1-1"]
    # a rerun from the step it maps sizes the map from the new output
    _rerun(engine, run_id, "a")
    calls.clear()
    engine.drive("f", _handler(calls, 1))
    assert calls == Counter({"a": 1, "b": 1, "c": 1, "m": 3, "d": 1})
    assert engine.states(run_id)["m"]["output"] == ["m0-1", "m1-1", "m2-1"]
    superseded = Counter(h["step_slug"] for h in _attempts(engine, run_id) if h["outcome"] == "superseded")
    assert superseded == Counter({"m": 4, "d": 2, "a": 1, "b": 1, "c": 1})
    assert engine.run(run_id)["retry_count"] == 2
    assert_invariants(engine)


def test_a_failed_run_reruns_the_step_and_retries_its_failed_steps(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {}), ("x", [], {"max_attempts": 1}), ("y", ["x"], {})])
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.complete(tasks["a"], "a-0")
    [b] = engine.claim("f")
    engine.complete(b, "b-0")
    engine.fail(tasks["x"], "x broke")
    assert engine.run(run_id)["status"] == "failed"

    run = _rerun(engine, run_id, "b")
    assert run["status"] == "started" and run["error_message"] is None
    calls: Counter[str] = Counter()
    engine.drive("f", lambda t: calls.update([t["step_slug"]]) or f"{t['step_slug']}-1")
    assert calls == Counter({"b": 1, "x": 1, "y": 1})
    assert engine.run(run_id)["output"] == {"b": "b-1", "y": "y-1"}
    assert [(h["step_slug"], h["outcome"], h["retry_round"]) for h in _attempts(engine, run_id)] == [
        ("x", "failed", 0), ("b", "superseded", 0)]
    assert_invariants(engine)


def test_a_rerun_from_the_failed_step_keeps_its_failed_attempts(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {"max_attempts": 1}), ("c", ["b"], {})])
    run_id = engine.start("f", {})
    engine.drive("f", lambda t: engine.fail(t, "nope") and None if t["step_slug"] == "b" else "a")
    assert engine.statuses(run_id) == {"a": "completed", "b": "failed", "c": "cancelled"}
    _rerun(engine, run_id, "b")
    assert engine.statuses(run_id) == {"a": "completed", "b": "started", "c": "created"}
    engine.drive("f", lambda t: t["step_slug"])
    assert engine.run(run_id)["output"] == {"c": "c"}
    assert [(h["step_slug"], h["outcome"]) for h in _attempts(engine, run_id)] == [("b", "failed")]
    assert_invariants(engine)


def test_a_wait_step_rerun_completes_again_with_its_signal(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("approve", ["a"], {"step_type": "wait"}), ("b", ["approve"], {})])
    run_id = engine.start("f", {})
    engine.drive("f", lambda t: t["step_slug"])
    engine.conn.execute("select flowlane.signal(%s, 'approve', %s)", (run_id, Jsonb({"ok": True})))
    engine.drive("f", lambda t: t["step_slug"])
    assert engine.run(run_id)["status"] == "completed"
    _rerun(engine, run_id, "a")
    calls: Counter[str] = Counter()
    engine.drive("f", lambda t: calls.update([t["step_slug"]]) or "again")
    assert calls == Counter({"a": 1, "b": 1})
    assert engine.states(run_id)["approve"]["output"] == {"ok": True}
    assert engine.run(run_id)["status"] == "completed"
    assert_invariants(engine)


def test_a_rerun_is_refused_for_a_run_in_flight_an_unknown_step_and_a_child_flow_step(
    engine: Engine,
) -> None:
    engine.define("child", [("k", [], {})])
    engine.define("f", [("a", [], {}), ("kid", ["a"], {"child_flow": "child"}), ("b", ["kid"], {})])
    run_id = engine.start("f", {})
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is started"):
        _rerun(engine, run_id, "a")
    engine.scalar("select flowlane.cancel_run(%s)", (run_id,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="only a failed or completed run"):
        _rerun(engine, run_id, "a")
    with pytest.raises(psycopg.errors.NoDataFound, match="no run"):
        _rerun(engine, uuid.uuid4(), "a")

    done = engine.start("f", {})
    engine.drive("f", lambda t: "a")
    engine.drive("child", lambda t: "k")
    engine.drive("f", lambda t: "b")
    assert engine.run(done)["status"] == "completed"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="has no step 'nope'"):
        _rerun(engine, done, "nope")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="step kid starts child runs"):
        _rerun(engine, done, "a")
    assert engine.run(done)["status"] == "completed"
    _rerun(engine, done, "b")  # after the child-flow step: allowed
    assert engine.drive("f", lambda t: "b2") == 1
    assert engine.run(done)["output"] == {"b": "b2"}
    assert_invariants(engine)


def test_a_rerun_of_a_limited_flow_waits_for_its_key(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})], concurrency_limit=1)
    first = engine.start("f", {})
    engine.drive("f", lambda t: t["step_slug"])
    busy = engine.start("f", {})
    assert engine.run(busy)["status"] == "started"
    rerun = _rerun(engine, first, "b")
    assert rerun["status"] == "waiting"
    engine.drive("f", lambda t: t["step_slug"] + "!")
    assert engine.run(busy)["status"] == "completed"
    assert engine.run(first)["status"] == "completed"
    assert engine.run(first)["output"] == {"b": "b!"}
    assert_invariants(engine)


def test_a_completed_child_run_is_not_rerun_while_its_parent_runs(engine: Engine) -> None:
    engine.define("child", [("k", [], {})])
    engine.define("f", [("a", [], {}), ("kid", ["a"], {"child_flow": "child", "step_type": "map"})])
    parent = engine.start("f", {})
    engine.drive("f", lambda t: [1, 2])
    [first, second] = engine.claim("child")
    engine.complete(first, "k")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=r"parent run \S+ is still running"):
        _rerun(engine, first["run_id"], "k")
    engine.complete(second, "k")
    assert engine.run(parent)["status"] == "completed"
    assert engine.states(parent)["kid"]["output"] == [{"k": "k"}, {"k": "k"}]
    assert _rerun(engine, first["run_id"], "k")["status"] == "started"  # the parent has ended
    engine.drive("child", lambda t: "k2")
    assert engine.run(first["run_id"])["output"] == {"k": "k2"}
    assert engine.states(parent)["kid"]["output"] == [{"k": "k"}, {"k": "k"}]  # the parent's is kept
    assert_invariants(engine)
