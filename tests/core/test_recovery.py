"""Stalled-task recovery (backdating, never sleeping) and flow deletion."""

from __future__ import annotations

import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def requeue(engine: Engine) -> int:
    return int(engine.scalar("select flowlane.requeue_stalled_tasks()"))


@pytest.mark.parametrize(
    ("step_timeout", "flow_timeout", "age", "stalled"),
    [
        (None, 60, 89, False),
        (None, 60, 91, True),
        (5, 60, 34, False),
        (5, 60, 36, True),
        (120, 60, 149, False),
        (120, 60, 151, True),
    ],
)
def test_stall_threshold_is_effective_timeout_plus_30(
    engine: Engine, step_timeout: int | None, flow_timeout: int, age: int, stalled: bool
) -> None:
    engine.define("f", [("a", [], {"timeout": step_timeout})], timeout=flow_timeout)
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run_id, "a", age)
    assert requeue(engine) == (1 if stalled else 0)
    row = engine.task(run_id, "a")
    assert row["status"] == ("queued" if stalled else "started")
    assert row["requeued_count"] == (1 if stalled else 0)
    if stalled:
        assert row["last_worker_id"] is None and row["started_at"] is None
        assert row["last_requeued_at"] is not None
        assert engine.vt_in("f", task["msg_id"]) <= 0
    else:
        assert engine.vt_in("f", task["msg_id"]) > 0


def test_requeued_task_is_claimable_and_completes(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run_id, "a", 100)
    assert requeue(engine) == 1
    [again] = engine.claim("f")
    assert again["msg_id"] == task["msg_id"] and again["attempt"] == 2
    engine.complete(again, "ok")
    assert engine.run(run_id)["status"] == "completed"


def test_repeated_stalls_fail_the_run_within_max_attempts(engine: Engine) -> None:
    # a stall is a failed attempt; before 0006 the fourth stall archived the
    # message and left the task started and the run started forever, with no error
    engine.define("f", [("a", [], {"timeout": 10}), ("b", ["a"], {})], max_attempts=3)
    run_id = engine.start("f", {})
    msg_id = None
    for attempt in (1, 2, 3):
        [task] = engine.claim("f")
        assert task["attempt"] == attempt
        msg_id = task["msg_id"]
        engine.backdate(run_id, "a", 100)
        assert requeue(engine) == 1
    row = engine.task(run_id, "a")
    assert row["status"] == "failed" and row["attempts_count"] == 3
    assert row["error_message"] == "no result within 10 s, 3 attempts"
    run = engine.run(run_id)
    assert run["status"] == "failed"
    assert run["error_message"] == "step a task 0 failed after 3 attempts: no result within 10 s, 3 attempts"
    assert engine.queue_messages("f") == [] and msg_id in engine.archived_ids("f")
    assert engine.rows("select * from flowlane.stuck_runs()") == []
    assert requeue(engine) == 0


def test_stall_exhaustion_applies_when_exhausted_skip(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10, "when_exhausted": "skip"}), ("b", ["a"], {})],
                  max_attempts=1)
    run_id = engine.start("f", {})
    engine.claim("f")
    engine.backdate(run_id, "a", 100)
    assert requeue(engine) == 1
    assert engine.statuses(run_id) == {"a": "skipped", "b": "started"}
    [b] = engine.claim("f")
    engine.complete(b, "done")
    assert engine.run(run_id)["status"] == "completed"


def test_stall_requeue_records_why(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run_id = engine.start("f", {})
    engine.claim("f")
    engine.backdate(run_id, "a", 100)
    assert requeue(engine) == 1
    row = engine.task(run_id, "a")
    assert (row["status"], row["error_message"]) == ("queued", "no result within 10 s (attempt 1)")


def test_stalled_recovery_ignores_failed_runs_and_non_started_tasks(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1}), ("b", [], {})])
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.fail(tasks["a"])
    engine.conn.execute(
        "update flowlane.step_tasks set started_at = now() - interval '1 hour', "
        "queued_at = now() - interval '2 hours' where run_id = %s",
        (run_id,),
    )
    assert requeue(engine) == 0
    assert {t["status"] for t in engine.tasks(run_id)} == {"failed", "cancelled"}


def test_requeue_only_touches_stalled_tasks(engine: Engine) -> None:
    engine.define("f", [("m", [], {"step_type": "map", "timeout": 10})])
    run_id = engine.start("f", [1, 2, 3])
    tasks = engine.claim("f")
    engine.backdate(run_id, "m", 100, index=1)
    assert requeue(engine) == 1
    assert [t["status"] for t in engine.tasks(run_id)] == ["started", "queued", "started"]
    assert engine.vt_in("f", tasks[0]["msg_id"]) > 0
    assert engine.vt_in("f", tasks[1]["msg_id"]) <= 0


def test_delete_flow_and_data(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})])
    engine.define("g", [("a", [], {})])
    engine.start("f", {})
    engine.start("f", {})
    g_run = engine.start("g", {})
    engine.conn.execute("select flowlane.delete_flow_and_data('f')")
    for table in ("flows", "steps", "deps", "runs", "step_states", "step_tasks"):
        assert engine.scalar(f"select count(*) from flowlane.{table} where flow_slug = 'f'") == 0
    assert engine.run(g_run)["status"] == "started"
    assert len(engine.queue_messages("g")) == 1
    # deleting an unknown flow is a no-op
    engine.conn.execute("select flowlane.delete_flow_and_data('nothing')")
