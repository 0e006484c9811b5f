"""A worker that refuses to start says why where the wait shows: ``run``, ``runs``,
``start --wait`` (on timeout), ``queue list`` and the console's run page; the next worker
registered on the queue clears it. Real worker processes against a real database."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.runtime.rt_support import PROJECT, WorkerProcess, flowlane, wait_run
from tests.ui import ui_support

pytestmark = pytest.mark.slow

# the test project's rt_noop with a step less: a shape the database does not hold
CHANGED = """\
kind: flow
slug: rt_noop
defaults:
  base_delay: 0
  timeout: 5
steps:
  one:
    handler: rt_handlers:noop
"""


def refusals(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("select queue_name, deployment_name, reason, hint "
                            "from flowlane.worker_refusals order by 1, 2").fetchall()


def test_a_refusing_worker_is_named_wherever_the_wait_shows(
        flows_dsn: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]) -> None:
    changed = tmp_path / "changed"
    (changed / "flows").mkdir(parents=True)
    (changed / "flows" / "noop.yaml").write_text(CHANGED)
    shutil.copy(PROJECT / "rt_handlers.py", changed / "rt_handlers.py")
    started = flowlane("start", "rt_noop", "--dsn", flows_dsn)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()

    refusing = WorkerProcess(flows_dsn, tmp_path, "--flow", "rt_noop", cwd=changed)
    assert refusing.wait() == 1, refusing.text()
    [(queue, deployment, reason, hint)] = refusals(flows_dsn)
    assert (queue, deployment) == ("rt_noop", "rt_noop")
    assert reason.startswith("the database holds flows whose shape differs from the YAML:")
    assert "\n" in reason and "new flow slug" in hint  # the differences, one a line
    said = "worker for queue rt_noop refused to start "
    line = f"waiting: queue rt_noop: 1 queued task(s); {said}"
    for command in (("run", run_id), ("runs",), ("queue", "list"),
                    ("start", "rt_noop", "--wait", "--timeout", "1")):
        shown = flowlane(*command, "--dsn", flows_dsn)
        waiting = [w for w in shown.stderr.splitlines() if w.startswith("waiting: queue rt_noop")]
        assert len(waiting) == 1 and waiting[0].startswith(line), (command, shown.stderr)
        assert "s ago: the database holds flows whose shape differs" in waiting[0], command
        lines = shown.stderr.splitlines()
        continued = lines[lines.index(waiting[0]) + 1]
        assert continued.startswith("    ") and "rt_noop" in continued, (command, shown.stderr)
        assert "no live worker serves queue rt_noop" not in shown.stderr, command
    with ui_support.ui_server(flows_dsn) as console:
        page = ui_support.fetch(f"{console.url}/runs/{run_id}").body
    assert said in page and "shape differs from the YAML" in page

    worker = spawn("--flow", "rt_noop")  # the project's own YAML: starts, clears the refusal
    assert refusals(flows_dsn) == []
    assert wait_run(flows_dsn, run_id, workers=[worker])["run"]["status"] == "completed"


def test_queue_list_names_a_refusal_on_a_queue_without_queued_work(
        flows_dsn: str, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    (missing / "flows").mkdir(parents=True)
    (missing / "flows" / "noop.yaml").write_text(CHANGED.replace("slug: rt_noop", "slug: rt_new"))
    shutil.copy(PROJECT / "rt_handlers.py", missing / "rt_handlers.py")
    refusing = WorkerProcess(flows_dsn, tmp_path, "--flow", "rt_new", cwd=missing)
    assert refusing.wait() == 1, refusing.text()
    assert [r[:3] for r in refusals(flows_dsn)] == [
        ("rt_new", "rt_new", "flows missing from the database: rt_new")]
    with psycopg.connect(flows_dsn, autocommit=True) as conn:  # its SQL applied later
        conn.execute("select flowlane.create_flow('rt_new'); select flowlane.add_step('rt_new', 'one')")
    shown = flowlane("queue", "list", "--dsn", flows_dsn)
    assert ("refused: worker for queue rt_new refused to start " in shown.stderr
            and "s ago: flows missing from the database: rt_new; apply the reviewed SQL first"
            in shown.stderr), shown.stderr
