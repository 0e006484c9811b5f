"""A database of the original core (0001 and 0002) with runs in flight, upgraded by
`flowlane db migrate`; the project's compiled SQL applied over the flows it already holds;
then real worker processes finish every run, each task once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.core.engine import Engine
from tests.runtime.rt_support import WorkerProcess, flowlane, wait_run

pytestmark = pytest.mark.slow

HANDLERS = """\
def fetch(input, ctx):
    return list(range(input["n"]))


def square(n, ctx):
    return n * n


def total(input, ctx):
    return {"sum": sum(input["items"])}
"""

FLOW = """\
kind: flow
slug: orders
steps:
  fetch:
    handler: handlers:fetch
  items:
    needs: [fetch]
    type: map
    handler: handlers:square
  total:
    needs: [items]
    handler: handlers:total
"""


def _ok(project: Path, *args: str) -> str:
    done = flowlane(*args, cwd=project)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _runs_in_flight(engine: Engine) -> dict[str, uuid.UUID]:
    """Runs the original core's workers left: ended, part-way, retrying, untouched."""
    engine.define("orders", [("fetch", [], {}), ("items", ["fetch"], {"step_type": "map"}),
                             ("total", ["items"], {})])
    runs = {"done": engine.start("orders", {"n": 2})}
    engine.drive("orders", lambda t: [1, 2] if t["step_slug"] == "fetch" else
                 {"sum": 5} if t["step_slug"] == "total" else t["input"] * t["input"])
    runs["part_way"] = engine.start("orders", {"n": 3})
    [fetch] = engine.claim("orders")
    engine.complete(fetch, [0, 1, 2])
    runs["retrying"] = engine.start("orders", {"n": 4})
    message = engine.scalar("select message_id from flowlane.step_tasks where run_id = %s",
                            (runs["retrying"],))
    [first] = engine.start_tasks("orders", [message])
    engine.fail(first, "the original worker's first attempt")
    engine.make_visible("orders")  # the retry's delay is not what this test is about
    runs.update({f"fresh_{n}": engine.start("orders", {"n": n}) for n in range(3)})
    return runs


def test_runs_of_the_original_core_finish_on_real_workers_after_the_upgrade(
        db_factory: Callable[..., str], tmp_path: Path) -> None:
    dsn = db_factory("0002")
    with psycopg.connect(dsn, autocommit=True) as conn:
        runs = _runs_in_flight(Engine(conn))
    project = tmp_path / "project"
    (project / "flows").mkdir(parents=True)
    (project / "flows" / "orders.yaml").write_text(FLOW)
    (project / "handlers.py").write_text(HANDLERS)

    assert "applied 0003_release_0_1_0.sql" in _ok(project, "db", "migrate", "--dsn", dsn)
    _ok(project, "compile")
    _ok(project, "apply", "--dsn", dsn)
    worker = WorkerProcess(dsn, tmp_path, "--flow", "orders", cwd=project).wait_ready()
    try:
        outputs = {key: wait_run(dsn, str(run), workers=[worker])["run"] for key, run in runs.items()}
        started = json.loads(_ok(project, "start", "orders", "--input", '{"n": 4}', "--wait",
                                 "--dsn", dsn))
    finally:
        assert worker.stop() == 0
    assert {key: run["status"] for key, run in outputs.items()} == dict.fromkeys(runs, "completed")
    assert outputs["done"]["output"] == {"total": {"sum": 5}}
    assert outputs["part_way"]["output"] == {"total": {"sum": 5}}
    assert outputs["retrying"]["output"] == {"total": {"sum": 14}}
    assert [outputs[f"fresh_{n}"]["output"] for n in range(3)] == [{"total": {"sum": s}} for s in (0, 0, 1)]
    assert started == {"total": {"sum": 14}}
    with psycopg.connect(dsn) as conn:
        attempts = conn.execute(
            "select run_id, step_slug, task_index, attempts_count from flowlane.step_tasks "
            "where attempts_count <> 1 order by 1, 2, 3").fetchall()
    assert attempts == [(runs["retrying"], "fetch", 0, 2)]  # every other task ran once
