"""Schedules through compile, plan and apply on a real database: new, changed, paused and
database-only schedules, and the deadline and dedup options of a flow."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.compiler.test_cli import run_joined

pytestmark = pytest.mark.slow

NIGHTLY = """\
---
kind: schedule
name: nightly
flow: reports
cron: "30 2 * * *"
timezone: Europe/Berlin
input: {day: today}
"""
FLOWS = """\
kind: flow
slug: reports
defaults: {deadline: 2h}
dedup: {key: /day}
steps:
  build:
    handler: reports:build
""" + NIGHTLY + """\
---
kind: schedule
name: often
flow: reports
every: 10m
"""



def test_plan_and_apply_converge_schedules(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "flows").mkdir()
    flows = tmp_path / "flows" / "reports.yaml"
    flows.write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0 and "NEW_SCHEDULE          schedule nightly" in out
    assert "starts reports on `30 2 * * *` (Europe/Berlin)" in out and "starts reports every 600 s" in out
    code, out = run_joined(capsys, "apply", "--dsn", dsn)
    assert code == 0 and "sql/schedules.sql" in out
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert "NO_CHANGE             schedule nightly" in out and "NO_CHANGE             schedule often" in out
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select opt_deadline, opt_dedup_key from flowlane.flows").fetchone() == (
            7200, "/day")
        conn.execute("select flowlane.set_schedule_paused('often', true, 'quiet week')")

    # a changed interval, a schedule no longer declared, an operator's pause
    flows.write_text(FLOWS.replace(NIGHTLY, "").replace("every: 10m", "every: 5m"))
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert "SCHEDULE_CHANGE       schedule often" in out
    assert "every_seconds: 600 in the database, 300 in the YAML" in out
    assert "paused by an operator: quiet week (`flowlane schedule resume often`)" in out
    assert "ONLY_IN_DATABASE      schedule nightly" in out and "deleted by apply" in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select schedule_name, every_seconds from flowlane.schedules").fetchall() == [
            ("often", 300)]
        assert conn.execute("select paused from flowlane.schedule_overrides").fetchone() == (True,)
