"""A flow's debounce through compile, plan, apply and the CLI on a real database: it is an
option change, `start` reports the run a start joined, `run` says when the run begins, and
`start --wait` of a joined start waits for that run's end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.compiler.test_cli import run_joined

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: carts
debounce: {key: /customer_id, period: 30s}
steps:
  sync:
    handler: carts:sync
"""



@pytest.fixture
def applied(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "carts.yaml").write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "apply", "--dsn", dsn)
    assert code == 0, out
    return tmp_path / "flows" / "carts.yaml"


def _start(capsys: pytest.CaptureFixture[str], dsn: str, n: int) -> dict[str, object]:
    code, out = run_joined(capsys, "start", "carts", "--input", json.dumps({"customer_id": 7, "n": n}),
                     "--dsn", dsn, "--format", "json")
    assert code == 0, out
    started: dict[str, object] = json.loads(out)
    return started


def test_debounce_is_an_option_change(dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    applied.write_text(FLOWS.replace("period: 30s}", "period: 1m, max_wait: 10m}"))
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    assert ("SAFE_OPTION_CHANGE    flow carts\n"
            "  debounce: 30s per /customer_id in the database, "
            "60s per /customer_id, at most 600s in the YAML\n") in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select opt_debounce_key, opt_debounce_period, opt_debounce_max_wait "
                            "from flowlane.flows where flow_slug = 'carts'").fetchone() == (
                                "/customer_id", 60, 600)
    assert "NO_CHANGE             flow carts" in run_joined(capsys, "plan", "--dsn", dsn)[1]


def test_start_reports_the_run_a_start_joined_and_run_says_when_it_begins(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = _start(capsys, dsn, 1), _start(capsys, dsn, 2)
    assert (first["existed"], first["debounced"], second["existed"], second["debounced"]) == (
        False, True, True, True)
    assert first["run_id"] == second["run_id"] and first["status"] == "waiting"
    run_id = str(first["run_id"])
    code, out = run_joined(capsys, "start", "carts", "--input", '{"customer_id": 7, "n": 3}', "--dsn", dsn)
    assert code == 0 and out.startswith(f"{run_id}\nrun {run_id} is debounced: it begins with the last input")
    assert out.rstrip().endswith("unless another arrives (this start joined it)")
    code, out = run_joined(capsys, "run", run_id, "--dsn", dsn)
    assert code == 0, out
    assert "waiting for\n  run                      debounce customer_id=7: starts in " in out
    code, out = run_joined(capsys, "runs", "--dsn", dsn)
    assert code == 0 and "  debounce customer_id=7: starts in " in out, out
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select input from flowlane.runs where run_id = %s", (run_id,)).fetchone() == (
            {"customer_id": 7, "n": 3},)


def test_start_wait_of_a_joined_start_waits_for_the_debounced_run(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = str(_start(capsys, dsn, 1)["run_id"])
    waiter = subprocess.Popen(
        [sys.executable, "-m", "flowlane", "start", "carts", "--input", '{"customer_id": 7, "n": 2}',
         "--wait", "--timeout", "120", "--dsn", dsn],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + str(Path(__file__).parents[2])})
    try:
        assert waiter.stderr is not None
        assert waiter.stderr.readline() == f"joined the debounced run {run_id} (carts); waiting\n"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("select flowlane.maintenance_tick(now() + interval '31 s')")
            worker = uuid.uuid4()
            task = conn.execute("select run_id, step_slug, task_index, attempt from flowlane.claim_tasks("
                                "'carts', 1, %s, %s) where outcome = 'claimed'",
                                (worker, Jsonb([["carts", "sync"]]))).fetchone()
            assert task is not None and str(task[0]) == run_id
            conn.execute("select flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                         (task[0], task[1], task[2], Jsonb({"synced": 2}), worker, task[3]))
        out, err = waiter.communicate(timeout=120)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, err
    assert json.loads(out) == {"sync": {"synced": 2}}
