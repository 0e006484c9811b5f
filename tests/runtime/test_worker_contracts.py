"""A real worker process checks each output against its step's output_schema: a wrong output
fails the task at its first attempt (no retry) with the JSON path, a right one completes."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from flowlane import errors
from tests.runtime.rt_support import WorkerProcess, start_run, step, tasks, wait_run

Spawn = Callable[..., WorkerProcess]


def test_a_wrong_output_fails_its_first_attempt_without_retry(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_contract", "--log-level", "INFO")
    bad = start_run(flows_dsn, "rt_contract", {"mode": "bad"})
    good = start_run(flows_dsn, "rt_contract", {"mode": "good"})
    failed, completed = (wait_run(flows_dsn, run, workers=[worker]) for run in (bad, good))
    assert failed["run"]["status"] == "failed"
    [task] = tasks(failed, "make")
    assert task["status"] == "failed" and task["attempts_count"] == 1, task
    assert task["error_message"] == ("the output of step make does not match its output_schema: "
                                     "/total: -1 is less than the minimum 0")
    assert completed["run"]["status"] == "completed"
    assert step(completed, "make")["output"] == {"total": 3}
    assert worker.stop() == 0, worker.text()
    assert "OutputContractViolation" in worker.text()


def test_the_client_start_is_refused_by_the_input_schema(flows_dsn: str) -> None:
    with pytest.raises(errors.UsageError, match="/mode: \"fast\" is not one of"):
        start_run(flows_dsn, "rt_contract", {"mode": "fast"})
    with psycopg.connect(flows_dsn) as conn:
        row = conn.execute("select count(*) from flowlane.runs where flow_slug = 'rt_contract'").fetchone()
    assert row == (0,)
