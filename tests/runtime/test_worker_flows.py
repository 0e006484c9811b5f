"""End to end with real worker processes: DAGs, maps, conditions, retries, exhaustion, routing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.runtime.rt_support import WorkerProcess, queue_depth, start_run, step, tasks, wait_run

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


def test_diamond_with_map_and_condition(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_diamond")
    small = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2, 3]})
    big = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2, 3, 4, 5]})
    empty = start_run(flows_dsn, "rt_diamond", {"numbers": []})

    state = wait_run(flows_dsn, small, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert step(state, "square")["output"] == [1, 4, 9]
    assert step(state, "total")["output"] == {"sum_of_squares": 14, "count": 3}
    assert step(state, "alert")["status"] == "skipped"
    assert step(state, "alert")["skip_reason"] == "condition_unmet"
    assert [t["task_index"] for t in tasks(state, "square")] == [0, 1, 2]

    state = wait_run(flows_dsn, big, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert step(state, "total")["output"] == {"sum_of_squares": 55, "count": 5}
    assert step(state, "alert")["output"] == {"alerted": True, "count": 5}  # an async handler

    state = wait_run(flows_dsn, empty, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert step(state, "square")["output"] == []
    assert step(state, "total")["output"] == {"sum_of_squares": 0, "count": 0}
    assert all(t["attempts_count"] == 1 for t in state["tasks"])
    assert queue_depth(flows_dsn, "rt_diamond") == 0


def test_retries_until_success_with_attempt_in_context(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_retry")
    run_id = start_run(flows_dsn, "rt_retry", {})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "completed"
    (task,) = tasks(state, "flaky")
    assert task["attempts_count"] == 3
    assert task["output"] == {"succeeded_on_attempt": 3}
    worker.wait_logged("task_retry_scheduled", "the retry's log line")


def test_exhausted_step_is_skipped_or_fails_the_run(flows_dsn: str, spawn: Spawn) -> None:
    skip = spawn("--flow", "rt_exhaust_skip")
    fail = spawn("--flow", "rt_exhaust_fail")
    skipped = start_run(flows_dsn, "rt_exhaust_skip", {})
    failed = start_run(flows_dsn, "rt_exhaust_fail", {})

    state = wait_run(flows_dsn, skipped, workers=[skip, fail])
    assert state["run"]["status"] == "completed"
    (boom,) = tasks(state, "boom")
    assert boom["status"] == "failed" and boom["attempts_count"] == 2
    assert boom["error_message"] == "ValueError: boom on attempt 2"
    assert step(state, "boom")["skip_reason"] == "handler_failed"
    assert step(state, "after")["output"] == {
        "saw": []
    }  # skipped parents are left out of the input

    state = wait_run(flows_dsn, failed, workers=[skip, fail])
    assert state["run"]["status"] == "failed"
    assert "boom on attempt 2" in state["run"]["error_message"]
    assert step(state, "after")["status"] != "completed"
    fail.wait_logged("task_exhausted", "the exhausted task's log line")


def test_per_step_queues_one_worker_process_per_step(flows_dsn: str, spawn: Spawn) -> None:
    workers = [spawn("--flow", "rt_perstep", "--step", s) for s in ("first", "second", "third")]
    run_ids = [start_run(flows_dsn, "rt_perstep", {"value": v}) for v in (1, 2)]
    for value, run_id in zip((1, 2), run_ids, strict=True):
        state = wait_run(flows_dsn, run_id, workers=workers)
        assert state["run"]["status"] == "completed"
        assert step(state, "third")["output"]["value"] == (value + 1) * 10
        pids = [step(state, s)["output"]["pid"] for s in ("first", "second", "third")]
        assert pids == [w.proc.pid for w in workers]  # each step ran in its own worker
        assert [t["queue_name"] for t in state["tasks"]] == [
            "rt_perstep__first",
            "rt_perstep__second",
            "rt_perstep__third",
        ]


def test_unserialisable_output_fails_the_task_clearly(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_bad_output")
    run_id = start_run(flows_dsn, "rt_bad_output", {})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "failed"
    (task,) = tasks(state, "bad")
    assert task["error_message"].startswith(
        "handler returned a value that is not JSON-serialisable"
    )
    assert "set" in task["error_message"]


def test_one_worker_serves_two_flows_on_a_shared_queue(flows_dsn: str, spawn: Spawn) -> None:
    jobs = spawn("--name", "rt_jobs_worker")  # selects the worker document (queue rt_jobs)
    side = spawn("--queue", "rt_side")
    a = start_run(flows_dsn, "rt_shared_a", {"value": 4})
    b = start_run(flows_dsn, "rt_shared_b", {"value": 7})
    state_a = wait_run(flows_dsn, a, workers=[jobs, side])
    state_b = wait_run(flows_dsn, b, workers=[jobs, side])
    assert step(state_a, "one")["output"]["pid"] == jobs.proc.pid
    assert step(state_a, "two")["output"] == {"pid": side.proc.pid, "value": 5}
    assert step(state_b, "only")["output"] == {"pid": jobs.proc.pid, "value": 7}
    assert "name=rt_jobs_worker" in jobs.text() and "max_concurrent=3" in jobs.text()


def test_four_workers_race_on_one_queue_and_complete_each_task_once(
    flows_dsn: str, spawn: Spawn
) -> None:
    workers = [spawn("--flow", "rt_noop", "--batch-size", "5") for _ in range(4)]
    widths = [60, 45, 30]
    run_ids = [start_run(flows_dsn, "rt_noop", {"width": w}) for w in widths]
    for width, run_id in zip(widths, run_ids, strict=True):
        state = wait_run(flows_dsn, run_id, workers=workers)
        assert state["run"]["status"] == "completed"
        assert step(state, "two")["output"] == list(range(width))
        assert all(t["attempts_count"] == 1 and t["status"] == "completed" for t in state["tasks"])
    claimed = 0
    for worker in workers:
        assert worker.stop() == 0
        final = worker.text().split("worker_stopped")[-1]
        counts = dict(part.split("=") for part in final.split() if "=" in part)
        assert counts["rejected"] == "0" and counts["failed"] == "0"
        claimed += int(counts["claimed"])
    assert claimed == sum(widths) + len(widths)  # every task claimed exactly once
    assert queue_depth(flows_dsn, "rt_noop") == 0  # and every message archived


def test_replicas_starting_together_all_come_up(flows_dsn: str, spawn: Spawn) -> None:
    replicas = [spawn("--flow", "rt_retry", ready=False) for _ in range(4)]
    for replica in replicas:  # the notification trigger is installed once, under a lock
        replica.wait_ready()
    run_id = start_run(flows_dsn, "rt_retry", {})
    assert wait_run(flows_dsn, run_id, workers=replicas)["run"]["status"] == "completed"


def test_alias_worker_serves_active_and_draining_versions(flows_dsn: str, spawn: Spawn) -> None:
    old = start_run(flows_dsn, "rt_versioned_v1", {"name": "old"})  # started before a move
    worker = spawn("--queue", "rt_versioned")
    new = start_run(flows_dsn, "rt_versioned", {"name": "new"})  # the alias: the active v2
    old_state = wait_run(flows_dsn, old, workers=[worker])
    new_state = wait_run(flows_dsn, new, workers=[worker])
    assert old_state["run"]["flow_slug"] == "rt_versioned_v1"
    assert old_state["run"]["output"] == {"greet": "hello old"}
    assert new_state["run"]["flow_slug"] == "rt_versioned_v2"
    assert new_state["run"]["output"] == {"shout": "HELLO, NEW!"}
    assert "flows=rt_versioned_v1,rt_versioned_v2" in worker.text()


def test_error_text_postgres_cannot_store_is_escaped(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_nul_error")
    run_id = start_run(flows_dsn, "rt_nul_error", {})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    (task,) = tasks(state, "bad")
    assert task["error_message"] == "ValueError: binary\\0garbage"
    assert worker.proc.poll() is None  # still serving
