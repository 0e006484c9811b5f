"""Wait steps and signals through the public SQL functions: a signal after its step is
reached, before it, twice, to the wrong step, to a finished run; the wait timeout (driven by
the time given to flowlane.expire_waits, never by sleeping); retries; concurrent duplicates."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine
from tests.core.test_races import run_threads

pytestmark = pytest.mark.slow


def _approval(engine: Engine, **wait: Any) -> None:
    """prepare -> approve (wait) -> ship"""
    engine.define("approval", [
        ("prepare", [], {}),
        ("approve", ["prepare"], {"step_type": "wait", **wait}),
        ("ship", ["approve"], {}),
    ])


def _signal(engine: Engine, run_id: uuid.UUID, step: str, payload: Any = None) -> dict[str, Any]:
    row = engine.row("select * from flowlane.signal(%s, %s, %s)",
                     (run_id, step, Jsonb({} if payload is None else payload)))
    assert row is not None
    return row


def _refused(engine: Engine, run_id: Any, step: str, payload: Any, sqlstate: str) -> str:
    with pytest.raises(psycopg.Error) as info:
        _signal(engine, run_id, step, payload)
    assert info.value.sqlstate == sqlstate, info.value
    return str(info.value)


def _expire(engine: Engine, seconds_from_now: float) -> int:
    return int(engine.scalar(
        "select flowlane.expire_waits(now() + make_interval(secs => %s))", (seconds_from_now,)))


def _finish_prepare(engine: Engine, run_id: uuid.UUID) -> None:
    [task] = engine.claim("approval")
    assert (task["run_id"], task["step_slug"]) == (run_id, "prepare")
    engine.complete(task, {"order": 7})


def test_a_signal_to_a_waiting_step_completes_it_and_starts_its_dependents(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert engine.statuses(run_id)["approve"] == "started"
    assert engine.tasks(run_id, "approve") == []  # no task, no message: nothing for a worker

    signal = _signal(engine, run_id, "approve", {"approved": True, "by": "ana"})

    assert signal["applied_at"] is not None
    approve = engine.states(run_id)["approve"]
    assert (approve["status"], approve["output"]) == ("completed", {"approved": True, "by": "ana"})
    [ship] = engine.claim("approval")
    assert ship["step_slug"] == "ship"
    assert ship["input"] == {"approve": {"approved": True, "by": "ana"}}
    engine.complete(ship, "shipped")
    assert engine.run(run_id)["status"] == "completed"


def test_a_signal_before_its_step_is_kept_and_completes_the_step_when_it_starts(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    signal = _signal(engine, run_id, "approve", {"approved": False})
    assert signal["applied_at"] is None
    assert engine.statuses(run_id)["approve"] == "created"

    _finish_prepare(engine, run_id)

    assert engine.states(run_id)["approve"]["output"] == {"approved": False}
    applied = engine.row("select * from flowlane.signals where run_id = %s", (run_id,))
    assert applied is not None and applied["applied_at"] is not None
    [ship] = engine.claim("approval")
    assert ship["step_slug"] == "ship"


def test_a_wait_step_with_no_needs_waits_from_the_start_and_the_run_is_not_stuck(engine: Engine) -> None:
    engine.define("gate", [("hold", [], {"step_type": "wait"}), ("after", ["hold"], {})])
    run_id = engine.start("gate", {"x": 1})
    assert engine.statuses(run_id) == {"hold": "started", "after": "created"}
    assert engine.rows("select * from flowlane.stuck_runs()") == []
    _signal(engine, run_id, "hold", [1, 2])
    [task] = engine.claim("gate")
    assert task["input"] == {"hold": [1, 2]}


def test_a_second_signal_is_refused_and_changes_nothing(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _signal(engine, run_id, "approve", {"n": 1})  # kept
    message = _refused(engine, run_id, "approve", {"n": 2}, "55000")
    assert "already has a signal" in message and "kept until the step starts" in message
    _finish_prepare(engine, run_id)
    message = _refused(engine, run_id, "approve", {"n": 3}, "55000")
    assert "already has a signal" in message
    assert engine.states(run_id)["approve"]["output"] == {"n": 1}
    assert engine.scalar("select count(*) from flowlane.signals") == 1


def test_signals_to_the_wrong_step_or_run_are_refused(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    message = _refused(engine, run_id, "prepare", {}, "42809")
    assert "is not a wait step" in message and "approve" in message  # the hint lists them
    assert "has no step" in _refused(engine, run_id, "nope", {}, "P0002")
    assert "no run" in _refused(engine, uuid.uuid4(), "approve", {}, "P0002")
    with pytest.raises(psycopg.Error) as info:
        engine.row("select * from flowlane.signal(%s, 'approve', null)", (run_id,))
    assert info.value.sqlstate == "22004"
    assert engine.scalar("select count(*) from flowlane.signals") == 0
    assert engine.statuses(run_id)["approve"] == "created"


@pytest.mark.parametrize("end", ["cancel", "fail"])
def test_a_signal_to_a_finished_run_is_refused(engine: Engine, end: str) -> None:
    _approval(engine, timeout=60)
    run_id = engine.start("approval", {})
    if end == "cancel":
        _finish_prepare(engine, run_id)
        engine.conn.execute("select flowlane.cancel_run(%s)", (run_id,))
        assert engine.statuses(run_id)["approve"] == "cancelled"
    else:
        [task] = engine.claim("approval")
        engine.conn.execute("update flowlane.steps set opt_max_attempts = 1 where step_slug = 'prepare'")
        engine.fail(task, "boom")
    message = _refused(engine, run_id, "approve", {}, "55000")
    assert "a finished run takes no signal" in message
    assert engine.scalar("select count(*) from flowlane.signals") == 0
    assert _expire(engine, 3600) == 0  # a deadline left by the ended run ends nothing


def test_a_payload_for_a_step_a_map_maps_must_be_an_array(engine: Engine) -> None:
    engine.define("pick", [("choose", [], {"step_type": "wait"}),
                           ("each", ["choose"], {"step_type": "map"})])
    run_id = engine.start("pick", {})
    message = _refused(engine, run_id, "choose", {"a": 1}, "22023")
    assert "must be a JSON array" in message
    _signal(engine, run_id, "choose", ["x", "y"])
    tasks = engine.claim("pick")
    assert sorted(t["input"] for t in tasks) == ["x", "y"]


def test_a_condition_on_a_wait_step_skips_it_and_its_signal_is_refused(engine: Engine) -> None:
    engine.define("cond", [("hold", [], {"step_type": "wait",
                                         "required_input_pattern": Jsonb({"needs_ok": True})}),
                           ("tail", [], {})])
    run_id = engine.start("cond", {"needs_ok": False})
    assert engine.states(run_id)["hold"]["skip_reason"] == "condition_unmet"
    assert "already skipped" in _refused(engine, run_id, "hold", {}, "55000")


def test_the_wait_timeout_fails_the_run_and_retry_waits_again(engine: Engine) -> None:
    _approval(engine, timeout=60)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert _expire(engine, 30) == 0
    assert engine.run(run_id)["status"] == "started"

    assert _expire(engine, 61) == 1

    run = engine.run(run_id)
    assert (run["status"], run["error_message"]) == ("failed", "step approve: no signal within 60 s")
    assert engine.states(run_id)["approve"]["error_message"] == "no signal within 60 s"
    assert _expire(engine, 3600) == 0  # once

    engine.conn.execute("select flowlane.retry_run(%s)", (run_id,))
    assert engine.statuses(run_id)["approve"] == "started"
    assert _expire(engine, 30) == 0  # a new deadline, from the retry
    _signal(engine, run_id, "approve", {"ok": 1})
    [ship] = engine.claim("approval")
    engine.complete(ship, None)
    assert engine.run(run_id)["status"] == "completed"


@pytest.mark.parametrize(("mode", "ship", "refusal"), [
    ("skip", "started", "is already skipped"),
    ("skip-cascade", "skipped", "is completed: a finished run"),  # nothing was left to run
])
def test_the_wait_timeout_skips_as_when_exhausted_says(
    engine: Engine, mode: str, ship: str, refusal: str
) -> None:
    _approval(engine, timeout=5, when_exhausted=mode)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert _expire(engine, 6) == 1
    approve = engine.states(run_id)["approve"]
    assert (approve["status"], approve["skip_reason"]) == ("skipped", "wait_timeout")
    assert approve["error_message"] == "no signal within 5 s"
    assert engine.statuses(run_id)["ship"] == ship
    assert refusal in _refused(engine, run_id, "approve", {}, "55000")


def test_a_wait_without_timeout_waits_forever(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert _expire(engine, 10 * 365 * 86400) == 0
    assert engine.statuses(run_id)["approve"] == "started"


def test_a_retried_run_waits_again_in_a_wait_step_its_failure_ended(engine: Engine) -> None:
    engine.define("par", [("hold", [], {"step_type": "wait"}),
                          ("work", [], {"max_attempts": 1})])
    run_id = engine.start("par", {})
    [work] = engine.claim("par")
    engine.fail(work, "boom")
    assert engine.statuses(run_id)["hold"] == "cancelled"
    engine.conn.execute("select flowlane.retry_run(%s)", (run_id,))
    assert engine.statuses(run_id)["hold"] == "started"
    _signal(engine, run_id, "hold", {})
    [work] = engine.claim("par")
    engine.complete(work, 1)
    assert engine.run(run_id)["status"] == "completed"


def test_wait_steps_have_no_queue_and_take_none(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error) as info:
        engine.add_step("f", "w", step_type="wait", queue_name="q")
    assert "queue_name must be null" in str(info.value)
    engine.add_step("f", "w", step_type="wait")
    shape = engine.scalar("select flowlane.get_flow_shape('f')")
    assert shape["steps"][0]["queue"] is None and shape["steps"][0]["type"] == "wait"
    assert engine.add_step("f", "w", step_type="wait")["queue_name"] is None  # applied twice
    assert engine.scalar("select count(*) from flowlane.queues") == 0


def test_32_concurrent_duplicate_signals_one_wins(engine: Engine, dsn: str) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    won: list[int] = []
    refused: list[str | None] = []
    lock = threading.Lock()

    def send(n: int, barrier: threading.Barrier) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            try:
                conn.execute("select flowlane.signal(%s, 'approve', %s)", (run_id, Jsonb({"n": n})))
            except psycopg.Error as exc:
                with lock:
                    refused.append(exc.sqlstate)
            else:
                with lock:
                    won.append(n)

    assert run_threads(32, send) == []
    assert len(won) == 1 and refused == ["55000"] * 31
    assert engine.states(run_id)["approve"]["output"] == {"n": won[0]}
    assert len(engine.tasks(run_id, "ship")) == 1


def test_a_signal_whose_backend_dies_before_commit_changes_nothing(engine: Engine, dsn: str) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    doomed = psycopg.connect(dsn)
    doomed.execute("select flowlane.signal(%s, 'approve', %s)", (run_id, Jsonb({"lost": True})))
    pid = doomed.info.backend_pid
    engine.conn.execute("select pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        doomed.commit()
    doomed.close()
    assert engine.statuses(run_id)["approve"] == "started"
    _signal(engine, run_id, "approve", {"kept": True})
    assert engine.states(run_id)["approve"]["output"] == {"kept": True}


# -- child flows ---------------------------------------------------------------------------


def _children(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return engine.rows("select * from flowlane.runs where parent_run_id = %s "
                       "order by parent_task_index, started_at, run_id", (run_id,))


def _family(engine: Engine, **parent_step: Any) -> None:
    """child: double (one handler step); parent: prep -> sub (child flow `child`) -> use"""
    engine.define("child", [("double", [], {})])
    engine.define("parent", [("prep", [], {}), ("sub", ["prep"], {"child_flow": "child", **parent_step}),
                             ("use", ["sub"], {})])


def _run_children(engine: Engine, outputs: Any = None, fail: bool = False) -> list[dict[str, Any]]:
    tasks = engine.claim("child")
    for task in tasks:
        if fail:
            engine.fail(task, "child broke")
        else:
            engine.complete(task, {"twice": 2 * task["input"]["prep"]["n"]} if outputs is None
                            else outputs(task))
    return tasks


def test_a_child_flow_step_starts_a_child_run_and_completes_with_its_output(engine: Engine) -> None:
    _family(engine)
    run_id = engine.start("parent", {})
    [prep] = engine.claim("parent")
    engine.complete(prep, {"n": 21})
    [child] = _children(engine, run_id)
    assert (child["flow_slug"], child["parent_step_slug"], child["parent_task_index"]) == ("child", "sub", 0)
    assert child["input"] == {"prep": {"n": 21}}  # the input a handler of the step would get
    assert engine.tasks(run_id, "sub") == [] and engine.rows("select * from flowlane.stuck_runs()") == []

    _run_children(engine)

    sub = engine.states(run_id)["sub"]
    assert (sub["status"], sub["output"]) == ("completed", {"double": {"twice": 42}})
    [use] = engine.claim("parent")
    assert use["input"] == {"sub": {"double": {"twice": 42}}}
    family = engine.scalar("select flowlane.get_run_family(%s)", (child["run_id"],))
    assert family["parent"]["run_id"] == str(run_id) and family["parent"]["step_slug"] == "sub"


def test_an_alias_is_resolved_when_the_step_starts_and_the_version_recorded(engine: Engine) -> None:
    engine.define("child_v1", [("double", [], {})])
    engine.define("child_v2", [("double", [], {})])
    engine.conn.execute("select flowlane.set_alias('kid', 'child_v1')")
    engine.define("parent", [("sub", [], {"child_flow": "kid"})])
    first = engine.start("parent", {"n": 1})
    engine.conn.execute("select flowlane.set_alias('kid', 'child_v2', array['child_v1'])")
    second = engine.start("parent", {"n": 2})
    assert [c["flow_slug"] for c in _children(engine, first)] == ["child_v1"]
    assert [c["flow_slug"] for c in _children(engine, second)] == ["child_v2"]
    assert engine.states(first)["sub"]["status"] == "started"


def test_a_failed_child_is_retried_with_a_new_child_run_then_fails_the_parent(engine: Engine) -> None:
    _family(engine, max_attempts=2)
    engine.conn.execute("update flowlane.flows set opt_max_attempts = 1 where flow_slug = 'child'")
    run_id = engine.start("parent", {})
    [prep] = engine.claim("parent")
    engine.complete(prep, {"n": 1})
    _run_children(engine, fail=True)
    children = _children(engine, run_id)
    assert [c["status"] for c in children] == ["failed", "started"]  # attempt 2: a new run
    assert engine.states(run_id)["sub"]["status"] == "started"

    _run_children(engine, fail=True)

    run = engine.run(run_id)
    assert run["status"] == "failed"
    assert "child run" in run["error_message"] and "failed after 2 attempts" in run["error_message"]
    assert "child broke" in run["error_message"]
    engine.conn.execute("select flowlane.retry_run(%s)", (run_id,))  # a parent retry: new children
    assert [c["status"] for c in _children(engine, run_id)] == ["failed", "failed", "started"]
    _run_children(engine)
    assert engine.states(run_id)["sub"]["status"] == "completed"


def test_cancelling_a_parent_cancels_its_children_and_a_cancelled_child_fails_the_step(
    engine: Engine,
) -> None:
    _family(engine, max_attempts=1)  # a cancelled child is a failed attempt: none is left
    first = engine.start("parent", {})
    second = engine.start("parent", {})
    for prep in engine.claim("parent"):
        engine.complete(prep, {"n": 1})
    engine.conn.execute("select flowlane.cancel_run(%s, 'stop')", (first,))
    [cancelled] = _children(engine, first)
    assert cancelled["status"] == "cancelled"
    assert cancelled["cancel_reason"] == f"parent run {first} cancelled"
    assert [t["status"] for t in engine.tasks(cancelled["run_id"])] == ["cancelled"]

    [child] = _children(engine, second)
    engine.conn.execute("select flowlane.cancel_run(%s, 'operator')", (child["run_id"],))
    run = engine.run(second)
    assert run["status"] == "failed" and "cancelled after 1 attempt: operator" in run["error_message"]
    assert engine.states(second)["sub"]["status"] == "failed"


def test_a_failed_parent_cancels_its_started_children(engine: Engine) -> None:
    engine.define("child", [("double", [], {})])
    engine.define("parent", [("sub", [], {"child_flow": "child"}), ("other", [], {"max_attempts": 1})])
    run_id = engine.start("parent", {"n": 1})
    [other] = engine.claim("parent")
    engine.fail(other, "boom")
    assert [c["status"] for c in _children(engine, run_id)] == ["cancelled"]


def test_a_map_step_starts_one_child_per_element_and_collects_their_outputs(engine: Engine) -> None:
    engine.define("child", [("double", [], {})])
    engine.define("parent", [("each", [], {"step_type": "map", "child_flow": "child"})])
    run_id = engine.start("parent", [3, 1, 2])
    children = _children(engine, run_id)
    assert [(c["parent_task_index"], c["input"]) for c in children] == [(0, 3), (1, 1), (2, 2)]
    tasks = {t["run_id"]: t for t in engine.claim("child")}
    for child in reversed(children):  # in any order
        task = tasks[child["run_id"]]
        engine.complete(task, task["input"] * 10)
    run = engine.run(run_id)
    assert run["status"] == "completed"
    assert run["output"] == {"each": [{"double": 30}, {"double": 10}, {"double": 20}]}


def test_a_child_that_cannot_start_fails_its_step_and_an_empty_map_starts_none(engine: Engine) -> None:
    engine.define("child", [("items", [], {"step_type": "map"})])  # needs an array input
    engine.define("parent", [("sub", [], {"child_flow": "child"})])
    engine.define("fan", [("none", [], {"step_type": "map", "child_flow": "child"})])
    run_id = engine.start("parent", {"not": "an array"})
    run = engine.run(run_id)
    assert run["status"] == "failed" and "cannot start child flow child" in run["error_message"]
    assert "must be a JSON array" in run["error_message"]  # the child flow's own refusal
    assert _children(engine, run_id) == []
    empty = engine.start("fan", [])
    assert engine.run(empty)["output"] == {"none": []} and _children(engine, empty) == []


def test_a_child_flow_step_takes_no_queue_and_is_part_of_the_shape(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error, match="queue_name must be null"):
        engine.add_step("f", "s", child_flow="other", queue_name="q")
    with pytest.raises(psycopg.Error, match="a wait step cannot start a child flow"):
        engine.add_step("f", "s", child_flow="other", step_type="wait")
    engine.add_step("f", "s", child_flow="other")
    shape = engine.scalar("select flowlane.get_flow_shape('f')")
    assert shape["steps"][0]["flow"] == "other" and shape["steps"][0]["queue"] is None
    with pytest.raises(psycopg.Error, match="different child_flow"):
        engine.add_step("f", "s", child_flow="another")


def test_a_child_completion_whose_backend_dies_before_commit_is_applied_once_later(
    engine: Engine, dsn: str
) -> None:
    _family(engine)
    run_id = engine.start("parent", {})
    [prep] = engine.claim("parent")
    engine.complete(prep, {"n": 4})
    [task] = engine.claim("child")
    doomed = psycopg.connect(dsn)
    doomed.execute("select flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                   (task["run_id"], task["step_slug"], task["task_index"], Jsonb({"twice": 8}),
                    engine.worker_id, task["attempt"]))
    engine.conn.execute("select pg_terminate_backend(%s)", (doomed.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        doomed.commit()
    doomed.close()
    assert engine.statuses(run_id)["sub"] == "started"
    assert engine.run(task["run_id"])["status"] == "started"

    engine.complete(task, {"twice": 8})
    engine.complete(task, {"twice": 9})  # a duplicate result changes nothing

    assert engine.states(run_id)["sub"]["output"] == {"double": {"twice": 8}}
    assert len(engine.tasks(run_id, "use")) == 1


def test_a_single_child_flow_step_feeding_a_map_fails_instead_of_stalling(engine: Engine) -> None:
    engine.define("child", [("double", [], {})])
    engine.define("parent", [("sub", [], {"child_flow": "child"}),
                             ("each", ["sub"], {"step_type": "map"})])
    run_id = engine.start("parent", {})
    [task] = engine.claim("child")
    engine.complete(task, [1, 2])
    run = engine.run(run_id)
    assert run["status"] == "failed"
    assert "[TYPE_VIOLATION] step sub feeds map step each" in run["error_message"]


def test_a_payload_its_output_schema_refuses_is_refused_and_changes_nothing(engine: Engine) -> None:
    _approval(engine)
    engine.rows("select flowlane.set_contract('approval', 'approve', %s)", (Jsonb({
        "type": "object", "required": ["approved"],
        "properties": {"approved": {"type": "boolean"}}}),))
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    message = _refused(engine, run_id, "approve", {"approved": "yes"}, "22023")
    assert "output_schema of step \"approve\"" in message and "/approved" in message, message
    assert engine.scalar("select count(*) from flowlane.signals where run_id = %s", (run_id,)) == 0
    assert engine.statuses(run_id)["approve"] == "started"
    _signal(engine, run_id, "approve", {"approved": True})
    assert engine.statuses(run_id)["approve"] == "completed"


def test_an_early_signal_is_checked_against_the_output_schema_too(engine: Engine) -> None:
    _approval(engine)
    engine.rows("select flowlane.set_contract('approval', 'approve', %s)",
                   (Jsonb({"type": "object", "required": ["approved"]}),))
    run_id = engine.start("approval", {})
    _refused(engine, run_id, "approve", {}, "22023")  # before the step is reached: not kept
    assert engine.scalar("select count(*) from flowlane.signals where run_id = %s", (run_id,)) == 0


def test_a_childs_deadline_fails_its_parent_step(engine: Engine) -> None:
    engine.define("child", [("double", [], {})], deadline=10)
    engine.define("parent", [("sub", [], {"child_flow": "child", "max_attempts": 1})])
    run_id = engine.start("parent", {})
    [child] = _children(engine, run_id)
    assert child["deadline_at"] is not None
    ended = engine.scalar("select flowlane.maintenance_tick(now() + interval '1 hour')")
    assert ended["failed"] == 1
    assert engine.run(child["run_id"])["status"] == "failed"
    run = engine.run(run_id)
    assert run["status"] == "failed", run
    assert "deadline exceeded" in run["error_message"], run["error_message"]
