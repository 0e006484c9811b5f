"""Zombie fencing with real worker processes: a worker frozen (SIGSTOP) past its lease while
another worker completes the requeued task; resumed (SIGCONT), its late completion or failure
is rejected and the run's outputs and dependents stay as the live worker left them."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.runtime import rt_support
from tests.runtime.rt_support import WorkerProcess, start_run, wait_run, wait_until

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


@pytest.mark.parametrize("late", ["completion", "failure"])
def test_a_resumed_zombie_changes_nothing(
    flows_dsn: str, spawn: Spawn, tmp_path: Path, late: str
) -> None:
    zombie = spawn("--flow", "rt_slow")
    run_id = start_run(flows_dsn, "rt_slow", {
        "dir": str(tmp_path), "only_first": True, "fail_first": late == "failure"})
    wait_until(lambda: (tmp_path / f"started-{run_id}-1").exists(), message="the first claim")
    zombie.signal(signal.SIGSTOP)  # frozen mid-task: no heartbeat, no lease extension
    try:
        live = spawn("--flow", "rt_slow")
        rt_support.backdate_started(flows_dsn, run_id, "hold")  # past its lease
        rt_support.requeue_stalled(flows_dsn)  # (or `live`'s own sweep did it first)
        state = wait_run(flows_dsn, run_id, workers=[live])  # attempt 2 and `record`, on `live`
        assert state["run"]["status"] == "completed"
    finally:
        zombie.signal(signal.SIGCONT)
    (tmp_path / "release").touch()  # the zombie's handler returns (or raises) now
    zombie.wait_logged("result_rejected", "the zombie's late result")
    after = rt_support.run_state(flows_dsn, run_id)
    assert after == state  # outputs, statuses, attempts: exactly what the live worker left
    assert rt_support.tasks(after, "hold")[0]["output"]["attempt"] == 2
    assert (tmp_path / "record.log").read_text().count(run_id) == 1  # the dependent ran once
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        history = conn.execute(
            "select attempt, outcome from flowlane.task_attempts where run_id = %s", (run_id,)
        ).fetchall()
    assert history == [(1, "stalled")]  # the zombie's failure left no attempt behind
    assert zombie.proc.poll() is None  # fenced, not crashed
