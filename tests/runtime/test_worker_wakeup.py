"""Waking up: PGMQ insert notifications, the polling fallback, a database restart."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.core import db, migrator
from tests.conftest import reachable_tmp_dir
from tests.runtime import rt_support
from tests.runtime.rt_support import WorkerProcess, start_run, step, wait_run, wait_until

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


def test_insert_notification_wakes_an_idle_worker(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_diamond", "--poll-interval", "600")
    worker.wait_logged("poller_idle", "the worker to go idle")
    began = time.monotonic()
    run_id = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2]})
    state = wait_run(flows_dsn, run_id, timeout=60, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert time.monotonic() - began < 60  # far below the 600 s fallback poll: woken by NOTIFY
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        # flowlane's statement trigger, not PGMQ's throttled row trigger
        throttles = conn.execute(
            "select queue_name from pgmq.list_notify_insert_throttles()"
        ).fetchall()
        triggers = conn.execute(
            "select tgname from pg_trigger where tgrelid = 'pgmq.q_rt_diamond'::regclass"
        ).fetchall()
    assert throttles == [] and triggers == [("flowlane_notify_insert",)]


def test_a_start_whose_notification_was_left_to_another_is_picked_up(
    flows_dsn: str, spawn: Spawn
) -> None:
    # a queue has one notifying transaction in flight: the second start sends none, and the
    # worker, woken by the first, finds it before it waits again (not at its 600 s poll)
    worker = spawn("--flow", "rt_diamond", "--poll-interval", "600")
    worker.wait_logged("poller_idle", "the worker to go idle")
    start = "select run_id from flowlane.start_flow('rt_diamond', %s)"
    with psycopg.connect(flows_dsn) as first, psycopg.connect(flows_dsn) as second:
        first_run = first.execute(start, (Jsonb({"numbers": [1]}),)).fetchone()[0]  # type: ignore[index]
        second_run = second.execute(start, (Jsonb({"numbers": [2]}),)).fetchone()[0]  # type: ignore[index]
        first.commit()
        assert wait_run(flows_dsn, str(first_run), workers=[worker])["run"]["status"] == "completed"
        second.commit()  # the worker is idle again, or about to be
    state = wait_run(flows_dsn, str(second_run), timeout=60, workers=[worker])
    assert step(state, "total")["output"] == {"sum_of_squares": 4, "count": 1}


def test_polling_fallback_without_notifications(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_diamond", "--no-notify", "--poll-interval", "1")
    run_id = start_run(flows_dsn, "rt_diamond", {"numbers": [3]})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert step(state, "total")["output"] == {"sum_of_squares": 9, "count": 1}
    assert "poller_idle" not in worker.text()  # read_with_poll did the waiting


def test_worker_reconnects_after_a_database_restart(tmp_path: Path) -> None:
    # its own server: stopping the shared test cluster would disturb the other tests
    # (outside pytest's basetemp, which concurrent pytest sessions prune and re-permission)
    scratch = reachable_tmp_dir("flowlane-restart-")
    pgdata = scratch / "pgdata"
    dsn = db.EmbeddedDatabase.start_at(pgdata)
    worker: WorkerProcess | None = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrator.ensure_pgmq(conn)
            migrator.migrate(conn)
        rt_support.apply_flows(dsn)
        worker = WorkerProcess(dsn, tmp_path, "--flow", "rt_diamond").wait_ready()
        first = start_run(dsn, "rt_diamond", {"numbers": [1]})
        assert wait_run(dsn, first, workers=[worker])["run"]["status"] == "completed"

        db.EmbeddedDatabase.stop_at(pgdata)  # immediate shutdown: every connection dies
        wait_until(
            lambda: (
                "database_unavailable" in worker.text() or "notifications_lost" in worker.text()
            ),
            message="the worker to notice",
        )
        restart = [
            sys.executable,
            "-c",
            (
                "import sys; from pathlib import Path; "
                "from flowlane.core import db; db.EmbeddedDatabase.start_at(Path(sys.argv[1]))"
            ),
            str(pgdata),
        ]
        subprocess.run(restart, env=rt_support.env(), check=True, timeout=120)

        runs = [start_run(dsn, "rt_diamond", {"numbers": list(range(n))}) for n in (2, 3)]
        for n, run_id in zip((2, 3), runs, strict=True):
            state = wait_run(dsn, run_id, workers=[worker])
            assert state["run"]["status"] == "completed"
            assert step(state, "total")["output"]["count"] == n
        assert worker.stop() == 0
    finally:
        if worker is not None and worker.proc.poll() is None:
            worker.proc.kill()
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(scratch, ignore_errors=True)
