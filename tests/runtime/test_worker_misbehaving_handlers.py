"""Handlers that raise BaseException, return values jsonb cannot hold, or return huge outputs:
each task ends exactly once (failed with a clear error, or completed), and the worker keeps going."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.runtime.rt_support import WorkerProcess, start_run, step, tasks, wait_run

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]

FAILING = {
    "system_exit": "SystemExit",
    "keyboard_interrupt": "KeyboardInterrupt",
    "generator_exit": "GeneratorExit",
    "stop_iteration": "StopIteration",
    "nan": "not JSON",
    "infinity": "not JSON",
    "set": "not JSON",
    "object": "not JSON",
    "bytes": "not JSON",
    "lone_surrogate": "refused the handler output",
}


@pytest.mark.parametrize("flow", ["rt_misbehave", "rt_misbehave_async"])
def test_misbehaving_handlers_fail_their_task_and_the_worker_survives(
    flows_dsn: str, spawn: Spawn, flow: str
) -> None:
    worker = spawn("--flow", flow, "--log-level", "INFO")
    runs = {mode: start_run(flows_dsn, flow, {"mode": mode}) for mode in [*FAILING, "huge", "ok"]}
    states = {mode: wait_run(flows_dsn, run_id, workers=[worker]) for mode, run_id in runs.items()}
    for mode, expected in FAILING.items():
        state = states[mode]
        assert state["run"]["status"] == "failed", (mode, state["run"])
        [task] = tasks(state, "bad")
        assert task["status"] == "failed" and task["attempts_count"] == 1, (mode, task)
        assert expected in task["error_message"], (mode, task["error_message"])
    huge = step(states["huge"], "bad")
    assert states["huge"]["run"]["status"] == "completed"
    assert len(huge["output"]["blob"]) == 5_000_000 and len(huge["output"]["items"]) == 100_000
    assert step(states["ok"], "bad")["output"] == {"mode": "ok"}
    assert worker.proc.poll() is None, worker.text()
    assert worker.stop() == 0, worker.text()
    text = worker.text()
    assert "x" * 100 not in text  # outputs are never logged
    assert "worker_crashed" not in text and "Traceback" not in text
