"""A flow's failure handler and its steps' compensations with real workers: a run whose third
step fails starts the handler's run once and compensates its first two steps in reverse order,
once each, even when the workers running the handler and the first compensation are killed
(SIGKILL) in the middle; `flowlane run` shows every side."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.runtime.rt_support import (
    WorkerProcess,
    applied_project,
    backdate_started,
    flowlane,
    start_run,
    wait_run,
    wait_until,
)

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: fh_orders
on_failure:
  flow: fh_undo
defaults: {max_attempts: 1, timeout: 30}
steps:
  reserve:
    handler: fh_handlers:reserve
    compensate: {flow: fh_undo_step}
  charge:
    needs: [reserve]
    handler: fh_handlers:charge
    compensate: {flow: fh_undo_step}
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
---
kind: flow
slug: fh_undo_step
defaults: {max_attempts: 3, timeout: 30}
steps:
  undo:
    handler: fh_handlers:undo
"""

HANDLERS = """\
import time
from pathlib import Path


def _note(folder, line):
    with open(Path(folder) / "executions.log", "a") as out:
        out.write(line + "\\n")


def _barrier(folder, ctx):
    deadline = time.monotonic() + 60
    while not (Path(folder) / "release").exists():  # a barrier the test opens
        if time.monotonic() > deadline:
            raise TimeoutError("the test never opened the barrier")
        ctx.shutdown.wait(0.02)  # a handler polling for its condition


def reserve(input, ctx):
    _note(ctx.flow_input["dir"], "reserve")
    return {"reserved": 2, "dir": ctx.flow_input["dir"]}


def charge(input, ctx):
    _note(ctx.flow_input["dir"], "charge")
    return {"charged": 20, "dir": ctx.flow_input["dir"]}


def ship(input, ctx):
    _note(ctx.flow_input["dir"], "ship")
    raise RuntimeError("no courier")


def report(input, ctx):
    folder = input["input"]["dir"]
    _note(folder, "report began")
    _barrier(folder, ctx)
    _note(folder, "report done")
    return {"handled": input["failed_step"], "outputs": sorted(input["outputs"])}


def undo(input, ctx):
    folder = input["output"]["dir"]
    _note(folder, f"undo {input['step']} began")
    _barrier(folder, ctx)
    _note(folder, f"undo {input['step']} done")
    return {"undone": input["step"], "had": input["input"]}
"""


def _rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def _handler_runs(dsn: str, run_id: str) -> list[tuple[Any, ...]]:
    return _rows(dsn, "select run_id::text, status, input from flowlane.runs where failure_of = %s::uuid",
                 (run_id,))


def _compensation_run(dsn: str, run_id: str, step: str) -> str | None:
    found = _rows(dsn, "select compensation_run_id::text from flowlane.compensations "
                       "where run_id = %s::uuid and step_slug = %s", (run_id, step))
    return found[0][0] if found else None


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_handler_and_the_compensations_run_once_though_their_workers_are_killed(
        tmp_path: Path, dsn: str) -> None:
    project = applied_project(tmp_path / "proj", dsn, FLOWS, {"fh_handlers": HANDLERS})
    work = tmp_path / "work"
    work.mkdir()
    log = work / "executions.log"

    def worker(queue: str, *args: str) -> WorkerProcess:
        return WorkerProcess(dsn, tmp_path, "--queue", queue, *args, cwd=project).wait_ready()

    workers = [worker("fh_orders")]
    try:
        run_id = start_run(dsn, "fh_orders", {"dir": str(work)})
        failed = wait_run(dsn, run_id, workers=workers)
        assert failed["run"]["status"] == "failed"
        handler_id, _status, handler_input = wait_until(lambda: (_handler_runs(dsn, run_id) or [None])[0],
                                                        message="the handler's run")
        assert handler_input["failed_step"] == "ship"
        assert handler_input["step_error"] == "RuntimeError: no courier"
        assert set(handler_input["outputs"]) == {"reserve", "charge"}
        # the first compensation is charge's (it needed reserve); reserve's waits for it
        charge_undo = _compensation_run(dsn, run_id, "charge")
        assert charge_undo is not None and _compensation_run(dsn, run_id, "reserve") is None

        doomed = [worker("fh_undo"), worker("fh_undo_step")]
        workers += doomed
        wait_until(lambda: {"report began", "undo charge began"} <= set(_lines(log)),
                   message="the handler and charge's compensation to begin")
        for process in doomed:
            process.signal(signal.SIGKILL)
            process.wait()
            workers.remove(process)
        backdate_started(dsn, handler_id, "report")  # stalled, instead of waiting for the threshold
        backdate_started(dsn, charge_undo, "undo")
        (work / "release").touch()
        workers += [worker("fh_undo", "--requeue-interval", "1"),
                    worker("fh_undo_step", "--requeue-interval", "1")]
        handled = wait_run(dsn, handler_id, workers=workers)
        assert handled["run"]["output"] == {"report": {"handled": "ship", "outputs": ["charge", "reserve"]}}
        wait_until(lambda: _rows(dsn, "select compensation from flowlane.runs where run_id = %s::uuid",
                                 (run_id,)) == [("completed",)], message="the compensation to complete")
    finally:
        for process in workers:
            process.stop()

    lines = _lines(log)
    assert lines[:3] == ["reserve", "charge", "ship"]
    assert [line for line in lines if line.startswith("undo")] == [
        "undo charge began", "undo charge began", "undo charge done",
        "undo reserve began", "undo reserve done"]
    assert [line for line in lines if line.startswith("report")] == [
        "report began", "report began", "report done"]
    assert len(_handler_runs(dsn, run_id)) == 1
    assert _rows(dsn, "select c.step_slug, c.status, r.status, r.output -> 'undo' -> 'had' "
                      "from flowlane.compensations c "
                      "join flowlane.runs r on r.run_id = c.compensation_run_id "
                      "where c.run_id = %s::uuid order by r.started_at", (run_id,)) == [
        ("charge", "completed", "completed", {"reserve": {"reserved": 2, "dir": str(work)}}),
        ("reserve", "completed", "completed", {"dir": str(work)})]
    assert _rows(dsn, "select count(*) from flowlane.runs where compensation_of = %s::uuid",
                 (run_id,)) == [(2,)]
    for undone in (handler_id, charge_undo):
        assert _rows(dsn, "select outcome from flowlane.task_attempts where run_id = %s::uuid",
                     (undone,)) == [("stalled",)]
    assert _rows(dsn, "select status from flowlane.runs where run_id = %s::uuid", (run_id,)) == [("failed",)]
    shown = flowlane("run", run_id, "--dsn", dsn, cwd=project).stdout
    assert f"handler   {handler_id} (fh_undo, completed)" in shown, shown
    assert "undo      compensation completed" in shown, shown
    assert f"  charge                   completed  {charge_undo}  fh_undo_step" in shown, shown
    shown = flowlane("run", handler_id, "--dsn", dsn, cwd=project).stdout
    assert f"handles   {run_id} (fh_orders, failed)" in shown, shown
    shown = flowlane("run", charge_undo, "--dsn", dsn, cwd=project).stdout
    assert f"undoes    step charge of run {run_id} (fh_orders, failed)" in shown, shown
