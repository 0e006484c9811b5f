"""A flow's failure handler with real workers: a run whose third step fails starts the
handler's run once, whose task runs to completion exactly once even when the worker running
it is killed (SIGKILL) in the middle; `flowlane run` shows both sides."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg

from tests.runtime.rt_support import (
    WorkerProcess,
    applied_project,
    backdate_started,
    flowlane,
    start_run,
    wait_run,
    wait_until,
)

FLOWS = """\
kind: flow
slug: fh_orders
on_failure:
  flow: fh_undo
defaults: {max_attempts: 1, timeout: 30}
steps:
  reserve:
    handler: fh_handlers:reserve
  charge:
    needs: [reserve]
    handler: fh_handlers:charge
  ship:
    needs: [charge]
    handler: fh_handlers:ship
---
kind: flow
slug: fh_undo
defaults: {max_attempts: 3, timeout: 30}
steps:
  report:
    handler: fh_handlers:report
"""

HANDLERS = """\
import time
from pathlib import Path


def _note(folder, line):
    with open(Path(folder) / "executions.log", "a") as out:
        out.write(line + "\\n")


def reserve(input, ctx):
    _note(ctx.flow_input["dir"], "reserve")
    return {"reserved": 2}


def charge(input, ctx):
    _note(ctx.flow_input["dir"], "charge")
    return {"charged": 20}


def ship(input, ctx):
    _note(ctx.flow_input["dir"], "ship")
    raise RuntimeError("no courier")


def report(input, ctx):
    folder = input["input"]["dir"]
    _note(folder, "report began")
    deadline = time.monotonic() + 60
    while not (Path(folder) / "release").exists():  # a barrier the test opens
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the barrier")
        time.sleep(0.02)
    _note(folder, "report done")
    return {"handled": input["failed_step"], "outputs": sorted(input["outputs"])}
"""


def _rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def _handler_runs(dsn: str, run_id: str) -> list[tuple[Any, ...]]:
    return _rows(dsn, "select run_id::text, status, input from flowlane.runs where failure_of = %s::uuid",
                 (run_id,))


def test_the_failure_handler_runs_once_though_its_worker_is_killed(tmp_path: Path, dsn: str) -> None:
    project = applied_project(tmp_path / "proj", dsn, FLOWS, {"fh_handlers": HANDLERS})
    work = tmp_path / "work"
    work.mkdir()
    log = work / "executions.log"
    workers = [WorkerProcess(dsn, tmp_path, "--queue", "fh_orders", cwd=project).wait_ready()]
    try:
        run_id = start_run(dsn, "fh_orders", {"dir": str(work)})
        failed = wait_run(dsn, run_id, workers=workers)
        assert failed["run"]["status"] == "failed"
        handler_id, _status, handler_input = wait_until(lambda: (_handler_runs(dsn, run_id) or [None])[0],
                                                        message="the handler's run")
        assert handler_input["failed_step"] == "ship"
        assert handler_input["step_error"] == "RuntimeError: no courier"
        assert handler_input["outputs"] == {"reserve": {"reserved": 2}, "charge": {"charged": 20}}

        doomed = WorkerProcess(dsn, tmp_path, "--queue", "fh_undo", cwd=project).wait_ready()
        workers.append(doomed)
        wait_until(lambda: log.exists() and "report began" in log.read_text(), message="the handler to begin")
        doomed.signal(signal.SIGKILL)
        doomed.wait()
        workers.remove(doomed)
        backdate_started(dsn, handler_id, "report")  # stalled, instead of waiting for the threshold
        (work / "release").touch()
        workers.append(WorkerProcess(dsn, tmp_path, "--queue", "fh_undo", "--requeue-interval", "1",
                                     cwd=project).wait_ready())
        handled = wait_run(dsn, handler_id, workers=workers)
        assert handled["run"]["status"] == "completed"
        assert handled["run"]["output"] == {"report": {"handled": "ship", "outputs": ["charge", "reserve"]}}
    finally:
        for worker in workers:
            worker.stop()

    assert log.read_text().splitlines() == ["reserve", "charge", "ship", "report began", "report began",
                                            "report done"]
    assert len(_handler_runs(dsn, run_id)) == 1
    assert _rows(dsn, "select outcome from flowlane.task_attempts where run_id = %s::uuid",
                 (handler_id,)) == [("stalled",)]
    assert _rows(dsn, "select status from flowlane.runs where run_id = %s::uuid", (run_id,)) == [("failed",)]
    shown = flowlane("run", run_id, "--dsn", dsn, cwd=project)
    assert f"handler   {handler_id} (fh_undo, completed)" in shown.stdout, shown.stdout + shown.stderr
    shown = flowlane("run", handler_id, "--dsn", dsn, cwd=project)
    assert f"handles   {run_id} (fh_orders, failed)" in shown.stdout, shown.stdout + shown.stderr
