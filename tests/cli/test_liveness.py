"""Liveness is one rule, the SQL Core's ``flowlane.worker_is_live``: ``worker list``,
``queue list``, ``run``, the console and the metrics agree on which workers are live, on a
real database (a worker whose heartbeat is minutes old is stale everywhere)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane import defaults
from flowlane.app.console import Console
from flowlane.app.observability import Database
from flowlane.core import db
from flowlane.ui import pages
from tests.cli_support import run_flowlane
from tests.ui import ui_support

pytestmark = pytest.mark.slow


def test_a_stale_worker_is_stale_for_every_reader(dsn: str, tmp_path: Path) -> None:
    waits = ui_support.seed_waits(dsn)  # crunchers: a worker whose heartbeat is 10 minutes old
    live = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.register_worker(%s, 'crunching', 'crunch-worker', 'crunchers', %s)",
                     (live, Jsonb([["crunch", "work"]])))
        [(window,)] = conn.execute(
            "select extract(epoch from flowlane.worker_stale_after())::float8").fetchall()
    assert window == defaults.STALE_AFTER  # the number messages quote is the rule's

    listed = run_flowlane("worker", "list", "--dsn", dsn, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "crunchers  queue crunching  enabled  1 live worker(s), 1 stale" in listed.stdout
    [stale_line] = [line for line in listed.stdout.splitlines() if str(waits.stale_worker) in line]
    assert "STALE" in stale_line
    as_json = json.loads(run_flowlane("worker", "list", "--dsn", dsn, "--format", "json",
                                      cwd=tmp_path).stdout)
    [crunchers] = [d for d in as_json["deployments"] if d["deployment_name"] == "crunchers"]
    assert {w["worker_id"]: w["live"] for w in crunchers["workers"]} == {
        str(waits.stale_worker): False, str(live): True}

    queues = json.loads(run_flowlane("queue", "list", "--dsn", dsn, "--format", "json",
                                     cwd=tmp_path).stdout)
    assert {q["queue_name"]: q["live_workers"] for q in queues}["crunching"] == 1

    console = Console(db.resolve(dsn))
    console.open()
    try:
        states = {str(w["worker_id"]): pages.worker_state(w) for w in console.workers()}
        assert states == {str(waits.stale_worker): "stale", str(live): "live"}
        assert {q["queue_name"]: q["live_workers"] for q in console.queues()}["crunching"] == 1
        assert {d["deployment_name"]: d["live_workers"]
                for d in console.deployments()}["crunchers"] == 1
        [stale_wait] = [h for h in console.holds(str(waits.stale)) if h["task_index"] == 0]
        assert f"of stale worker {str(waits.stale_worker)[:8]} to be handed out again at" \
            in stale_wait["waiting_for"]
    finally:
        console.close()

    metrics = Database(dsn)
    try:
        assert {r[0]: r[3] for r in metrics.rows("observability_queue_metrics")}["crunching"] == 1
    finally:
        metrics.close()

    shown = run_flowlane("run", str(waits.stale), "--dsn", dsn, cwd=tmp_path)
    assert f"of stale worker {str(waits.stale_worker)[:8]} to be handed out again at" in shown.stdout


def test_the_window_is_the_boundary(dsn: str) -> None:
    ui_support.seed_waits(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ages = {"fresh": 1, "inside": defaults.STALE_AFTER - 2, "outside": defaults.STALE_AFTER + 2}
        ids = {}
        for name, age in ages.items():
            ids[name] = uuid.uuid4()
            conn.execute("select flowlane.register_worker(%s, 'crunching', %s, 'crunchers', %s)",
                         (ids[name], name, Jsonb([["crunch", "work"]])))
            conn.execute("update flowlane.workers set started_at = now() - make_interval(secs => %s), "
                         "last_heartbeat_at = now() - make_interval(secs => %s) where worker_id = %s",
                         (age, age, ids[name]))
        conn.execute("update flowlane.workers set stopped_at = now() where worker_id = %s", (ids["fresh"],))
        live = dict(conn.execute(
            "select worker_name, flowlane.worker_is_live(w) from flowlane.workers w "
            "where worker_name = any (%s)", (list(ages),)).fetchall())
    assert live == {"fresh": False, "inside": True, "outside": False}  # stopped is never live
