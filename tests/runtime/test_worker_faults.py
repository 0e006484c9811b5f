"""Shutdown, crashes, lost leases and database failures, with real worker processes.

``rt_slow.hold`` writes ``started-<run>-<attempt>`` when it runs and waits
for a ``release`` file; ``rt_slow.record`` appends one line per execution.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.runtime.rt_support import (
    WorkerProcess,
    backdate_started,
    requeue_stalled,
    start_run,
    step,
    tasks,
    wait_run,
    wait_until,
)

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


def _started(folder: Path, run_id: str, attempt: int) -> Callable[[], bool]:
    return lambda: (folder / f"started-{run_id}-{attempt}").exists()


def test_sigterm_lets_the_running_handler_finish(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_slow", "--shutdown-timeout", "30")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path)})
    wait_until(_started(tmp_path, run_id, 1), message="hold to start")
    worker.signal(signal.SIGTERM)
    worker.wait_logged("worker_stopping", "the worker to begin stopping")
    (tmp_path / "release").touch()
    assert worker.wait(30) == 0
    log = worker.text()
    assert "task_completed" in log and "worker_stopped" in log
    state = _state(flows_dsn, run_id)
    (hold,) = tasks(state, "hold")
    assert hold["status"] == "completed" and hold["attempts_count"] == 1
    assert hold["output"]["saw_shutdown"] is True  # ctx.shutdown was set during the stop
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        stopped = conn.execute("select stopped_at is not null from flowlane.workers").fetchall()
    assert stopped == [(True,)]
    # the dependent step was released but the worker was gone: a new worker finishes the run
    again = spawn("--flow", "rt_slow")
    assert wait_run(flows_dsn, run_id, workers=[again])["run"]["status"] == "completed"


def test_sigterm_deadline_abandons_the_task_to_stalled_recovery(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_slow", "--shutdown-timeout", "0.2")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path)})
    wait_until(_started(tmp_path, run_id, 1), message="hold to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert "task_abandoned" in worker.text()
    (hold,) = tasks(_state(flows_dsn, run_id), "hold")
    assert hold["status"] == "started"  # not failed, not lost: waiting for recovery
    backdate_started(flows_dsn, run_id, "hold")
    assert requeue_stalled(flows_dsn) == 1
    (tmp_path / "release").touch()
    again = spawn("--flow", "rt_slow")
    state = wait_run(flows_dsn, run_id, workers=[again])
    assert state["run"]["status"] == "completed"
    (hold,) = tasks(state, "hold")
    assert hold["attempts_count"] == 2 and hold["requeued_count"] == 1


def test_sigkill_mid_task_is_recovered_by_a_worker(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    doomed = spawn("--flow", "rt_slow")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path)})
    wait_until(_started(tmp_path, run_id, 1), message="hold to start")
    doomed.signal(signal.SIGKILL)
    assert doomed.wait(30) == -signal.SIGKILL
    (tmp_path / "release").touch()
    backdate_started(flows_dsn, run_id, "hold")
    # the surviving worker's periodic requeue_stalled_tasks picks the task up
    survivor = spawn("--flow", "rt_slow", "--requeue-interval", "0.2")
    state = wait_run(flows_dsn, run_id, workers=[survivor])
    assert state["run"]["status"] == "completed"
    (hold,) = tasks(state, "hold")
    assert hold["attempts_count"] == 2 and hold["requeued_count"] == 1
    survivor.wait_logged("stalled_tasks_requeued", "the requeue's log line")
    assert (tmp_path / "record.log").read_text().count(run_id) == 1


def test_stale_completion_is_rejected(flows_dsn: str, spawn: Spawn, tmp_path: Path) -> None:
    # A claims attempt 1 and blocks; its lease is lost (stalled recovery); B claims attempt 2 and
    # completes; then A finishes and reports attempt 1: the report must change nothing.
    slow = spawn("--flow", "rt_slow", "--max-concurrent", "1", "--requeue-interval", "3600")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path), "only_first": True})
    wait_until(_started(tmp_path, run_id, 1), message="attempt 1 to start")
    backdate_started(flows_dsn, run_id, "hold")
    assert requeue_stalled(flows_dsn) == 1
    fast = spawn("--flow", "rt_slow", "--requeue-interval", "3600")
    state = wait_run(flows_dsn, run_id, workers=[slow, fast])
    assert state["run"]["status"] == "completed"
    (hold,) = tasks(state, "hold")
    assert hold["attempts_count"] == 2 and hold["output"]["attempt"] == 2
    completed_at = hold["completed_at"]

    (tmp_path / "release").touch()  # attempt 1 returns now, far too late
    slow.wait_logged("result_rejected", "the stale result to be rejected")
    state = _state(flows_dsn, run_id)
    (hold,) = tasks(state, "hold")
    assert hold["output"]["attempt"] == 2 and hold["completed_at"] == completed_at
    assert step(state, "hold")["output"]["attempt"] == 2
    (record,) = tasks(state, "record")
    assert record["attempts_count"] == 1
    assert (tmp_path / "record.log").read_text().splitlines() == [f"{run_id} 1 2"]
    assert slow.stop() == 0 and "completed=0" in slow.text().split("worker_stopped")[-1]


def test_worker_survives_killed_database_backends(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_diamond")
    first = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2]})
    wait_run(flows_dsn, first, workers=[worker])
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        killed = conn.execute(
            "select count(*) filter (where pg_terminate_backend(pid)) from pg_stat_activity"
            " where application_name like 'flowlane-worker-%%'"
        ).fetchone()
    assert killed is not None and killed[0] >= 2  # pool and LISTEN connections
    run_ids = [start_run(flows_dsn, "rt_diamond", {"numbers": list(range(n))}) for n in range(1, 6)]
    for n, run_id in zip(range(1, 6), run_ids, strict=True):
        state = wait_run(flows_dsn, run_id, workers=[worker])
        assert state["run"]["status"] == "completed"
        assert step(state, "total")["output"]["count"] == n
    assert "database_unavailable" in worker.text() or "notifications_lost" in worker.text()


def _state(dsn: str, run_id: str) -> dict:  # type: ignore[type-arg]
    from tests.runtime.rt_support import run_state

    return run_state(dsn, run_id)


def test_a_broken_queue_stops_the_worker_loudly(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_retry", "--poll-interval", "0.2")
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        conn.execute("select pgmq.drop_queue('rt_retry')")  # an operator mistake
    assert worker.wait(60) == 1
    log = worker.text()
    assert "worker_crashed component=poller" in log
    assert "error: the worker stopped after an internal error in its poller" in log
    assert "worker_stopped" in log


def test_sigterm_wakes_an_async_handler_waiting_on_ctx(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_slow_async")
    run_id = start_run(flows_dsn, "rt_slow_async", {"dir": str(tmp_path)})
    wait_until(_started(tmp_path, run_id, 1), message="the async handler to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    state = _state(flows_dsn, run_id)
    assert state["run"]["status"] == "completed"
    assert step(state, "hold")["output"] == {"saw_shutdown": True}
