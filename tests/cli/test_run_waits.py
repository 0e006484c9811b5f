"""`flowlane runs` and `flowlane run` say what a run waits for besides flow control: a wait
step's signal (since when, and its timeout), a child run, and a started task whose worker's
heartbeat is stale (when stalled recovery hands it out again), on a real database."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli_support import run_flowlane
from tests.ui import ui_support

pytestmark = pytest.mark.slow


def _line(out: str, run_id: uuid.UUID) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith(str(run_id))]
    return line


def test_runs_and_run_say_what_each_run_waits_for(dsn: str, tmp_path: Path) -> None:
    waits = ui_support.seed_waits(dsn)
    reasons = ui_support.wait_reasons(dsn, waits)

    listed = run_flowlane("runs", "--dsn", dsn, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].endswith("  WAITING FOR")
    assert _line(listed.stdout, waits.approval).endswith("  " + reasons["approval"])
    assert _line(listed.stdout, waits.child).endswith("  " + reasons["child_signal"])
    assert _line(listed.stdout, waits.parent).endswith("  " + reasons["child"])  # its first wait
    assert _line(listed.stdout, waits.stale).endswith("  " + reasons["stale"])
    as_json = json.loads(run_flowlane("runs", "--dsn", dsn, "--format", "json", cwd=tmp_path).stdout)
    assert {r["run_id"]: r["waiting_for"] for r in as_json}[str(waits.stale)] == reasons["stale"]

    parent = run_flowlane("run", str(waits.parent), "--dsn", dsn, cwd=tmp_path)
    assert parent.returncode == 0, parent.stderr
    section = parent.stdout.split("\nwaiting for\n")[1].split("\n\n")[0].splitlines()
    assert section == [f"  {'child':<24} {reasons['child']}",
                       f"  {'approve':<24} {reasons['parent_signal']}"]
    stale = run_flowlane("run", str(waits.stale), "--dsn", dsn, cwd=tmp_path).stdout
    assert f"  {'work: 1 task':<24} {reasons['stale']}\n" in stale


def test_a_live_heartbeat_or_a_signal_ends_the_wait(dsn: str, tmp_path: Path) -> None:
    waits = ui_support.seed_waits(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("update flowlane.workers set last_heartbeat_at = now() where worker_id = %s",
                     (waits.stale_worker,))
        conn.execute("select flowlane.signal(%s, 'approve', '{}')", (waits.approval,))
    listed = run_flowlane("runs", "--dsn", dsn, "--format", "json", cwd=tmp_path)
    by_run: dict[str, Any] = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert by_run[str(waits.stale)]["waiting_for"] is None
    assert by_run[str(waits.approval)]["status"] == "completed"
    assert by_run[str(waits.approval)]["waiting_for"] is None

