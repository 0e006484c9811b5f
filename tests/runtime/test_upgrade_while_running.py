"""Upgrading while workers run (docs/upgrading.md): a database at the previous release's
schema is migrated by the pending migration while workers of the previous release's code keep
claiming and completing; then they are restarted on the new code. Nothing is lost or done
twice.

The previous release, its schema and its code (``git archive`` of its commit, run from its own
directory on PYTHONPATH) are ``tests.release_support.previous_release()``'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.core import migrator
from tests.cli_support import REPO, run_flowlane
from tests.release_support import previous_release
from tests.runtime.rt_support import WorkerProcess, wait_until

pytestmark = pytest.mark.slow

FLOW = """\
kind: flow
slug: upgrade_v1
defaults: {base_delay: 0, timeout: 30}
steps:
  split:
    handler: upgrade_handlers:split
  square:
    needs: [split]
    type: map
    handler: upgrade_handlers:square
  total:
    needs: [square]
    handler: upgrade_handlers:total
"""

HANDLERS = """\
def split(input, ctx):
    return list(range(input["n"]))


def square(n, ctx):
    return n * n


def total(input, ctx):
    return {"sum": sum(input["square"])}
"""

RUNS_PER_BATCH = 12


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "upgrade.yaml").write_text(FLOW)
    (root / "upgrade_handlers.py").write_text(HANDLERS)
    return root


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(dsn: str, project: Path, code: Path, *args: str) -> WorkerProcess:
        worker = WorkerProcess(dsn, tmp_path, "--flow", "upgrade_v1", *args, cwd=project,
                               root=code)
        started.append(worker)
        return worker.wait_ready()

    yield start
    for worker in started:
        worker.stop()


def start_runs(conn: psycopg.Connection[Any], batch: int) -> list[str]:
    return [str(conn.execute("select run_id from flowlane.start_flow('upgrade_v1', %s)",
                             [Jsonb({"n": batch + i % 4})]).fetchone()[0])  # type: ignore[index]
            for i in range(RUNS_PER_BATCH)]


def wait_completed(conn: psycopg.Connection[Any], runs: list[str],
                   alive: list[WorkerProcess]) -> None:
    def done() -> bool:
        for worker in alive:
            assert worker.proc.poll() is None, f"worker exited:\n{worker.text()}"
        row = conn.execute("select count(*) from flowlane.runs where run_id = any(%s::uuid[]) "
                           "and status = 'completed'", [runs]).fetchone()
        return row is not None and row[0] == len(runs)

    wait_until(done, timeout=60, message=f"{len(runs)} runs to complete")


def live_worker_ids(conn: psycopg.Connection[Any]) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("select worker_id from flowlane.workers "
                                       "where stopped_at is null")}


def completed_by(conn: psycopg.Connection[Any], runs: list[str]) -> set[uuid.UUID]:
    return {r[0] for r in conn.execute("select distinct last_worker_id from flowlane.step_tasks "
                                       "where run_id = any(%s::uuid[])", [runs])}


def test_old_workers_keep_working_through_the_migration_then_restart_on_the_new_code(
    db_factory: Callable[..., str], project: Path, tmp_path: Path,
    workers: Callable[..., WorkerProcess],
) -> None:
    previous = previous_release()
    old_code = previous.unpack(tmp_path / "previous")
    assert run_flowlane("--version", cwd=project, root=old_code).stdout == f"flowlane {previous.name}\n"
    dsn = db_factory(previous.last_migration)
    # the old release defines the flow with its own SQL (what its `apply` runs)
    old = [workers(dsn, project, old_code, "--compile")]
    with psycopg.connect(dsn, autocommit=True) as conn:
        old_ids = live_worker_ids(conn)
        before = start_runs(conn, 1)
        wait_completed(conn, before[:1], old)  # the old workers are claiming and completing
        during = start_runs(conn, 2)  # queued while the schema changes under them
        applied = migrator.migrate(conn)
        assert [m.version for m in applied] == [previous.upgrade.version]
        after = start_runs(conn, 3)  # the old code on the new schema
        wait_completed(conn, before + during + after, old)
        assert completed_by(conn, before + during + after) <= old_ids

        for worker in old:
            assert worker.stop() == 0, worker.text()
        new = [workers(dsn, project, REPO)]
        new_ids = live_worker_ids(conn)
        assert new_ids and not new_ids & old_ids
        restarted = start_runs(conn, 4)
        wait_completed(conn, restarted, new)
        assert completed_by(conn, restarted) <= new_ids

        everything = before + during + after + restarted
        outputs = conn.execute(
            "select r.input->>'n', r.output from flowlane.runs r where run_id = any(%s::uuid[])",
            [everything]).fetchall()
        assert len(outputs) == 4 * RUNS_PER_BATCH
        assert all(output == {"total": {"sum": sum(i * i for i in range(int(n)))}}
                   for n, output in outputs)
        # every task completed once: one attempt each, nothing left in the queue
        assert conn.execute(
            "select count(*) filter (where status <> 'completed' or attempts_count <> 1), "
            "count(*) from flowlane.step_tasks").fetchone() == (
            0, sum(2 + int(n) for n, _ in outputs))
        assert conn.execute("select queue_length from pgmq.metrics('upgrade_v1')").fetchone() == (0,)
