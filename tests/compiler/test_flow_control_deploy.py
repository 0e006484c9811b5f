"""Flow control through compile, plan, apply and the CLI on a real database: limits and
priorities are option changes, a queue's limits converge to the YAML, and `start --priority`,
`run`, `runs` and `queue list` say what a run or task waits for."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.cli import main
from tests.compiler.test_cli import run_joined

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: alerts
concurrency: {limit: 1, key: /customer_id}
steps:
  deliver:
    handler: alerts.slack:deliver
---
kind: flow
slug: digests
steps:
  send:
    handler: alerts.digest:send
---
kind: queue
name: alerts
concurrency: 1
"""



@pytest.fixture
def applied(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "alerts.yaml").write_text(FLOWS)
    monkeypatch.chdir(tmp_path)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    assert ("SAFE_OPTION_CHANGE    queue alerts\n"
            "  limits: none in the database, concurrency 1 in the YAML") in out
    code, out = run_joined(capsys, "apply", "--dsn", dsn)
    assert code == 0 and "sql/queues.sql" in out, out
    return tmp_path / "flows" / "alerts.yaml"


def test_plan_shows_limits_and_priorities_as_option_changes(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert "NO_CHANGE             flow alerts" in out and "NO_CHANGE             queue alerts" in out
    applied.write_text(FLOWS.replace("{limit: 1, key: /customer_id}",
                                     "{limit: 2, when_full: replace_waiting}")
                       .replace("slug: digests\n", "slug: digests\npriority: 7\n")
                       .replace("send:\n    handler: alerts.digest:send\n",
                                "send:\n    handler: alerts.digest:send\n"
                                "    concurrency: {limit: 3, key: /team}\n")
                       .replace("concurrency: 1\n", "rate_limit: {limit: 5, per: 1s}\n")
                       + "---\nkind: queue\nname: digests\nconcurrency: 4\n")
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    assert ("SAFE_OPTION_CHANGE    flow alerts\n"
            "  concurrency: 1 per /customer_id in the database, "
            "2, when full replace_waiting in the YAML\n") in out
    assert ("SAFE_OPTION_CHANGE    flow digests\n  priority: none in the database, 7 in the YAML\n"
            "  step send: concurrency: none in the database, 3 per /team in the YAML\n") in out
    assert ("SAFE_OPTION_CHANGE    queue alerts\n  limits: concurrency 1 in the database, "
            "rate limit 5 per 1 s in the YAML\n") in out
    assert "SAFE_OPTION_CHANGE    queue digests\n  limits: none in the database, concurrency 4" in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "select flow_slug, opt_concurrency_limit, opt_concurrency_key, opt_priority, "
            "opt_concurrency_when_full from flowlane.flows order by 1").fetchall() == [
                ("alerts", 2, None, None, "replace_waiting"), ("digests", None, None, 7, "queue")]
        assert conn.execute(
            "select queue_name, concurrency, rate_limit, rate_per from flowlane.queue_limits "
            "order by 1").fetchall() == [("alerts", None, 5, 1), ("digests", 4, None, None)]

    # one queue document left: the other queue's limits go with the next apply
    applied.write_text(FLOWS)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert ("SAFE_OPTION_CHANGE    queue digests\n  limits: concurrency 4 in the database, "
            "removed by apply (no `kind: queue` document declares them)") in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert "SAFE_OPTION_CHANGE" not in out, out
    assert "plan: 2 NO_CHANGE flow" not in out and "3 NO_CHANGE" in out


def _start(capsys: pytest.CaptureFixture[str], dsn: str, customer: int, *more: str) -> str:
    code, out = run_joined(capsys, "start", "alerts", "--input", json.dumps({"customer_id": customer}),
                     "--dsn", dsn, "--format", "json", *more)
    assert code == 0, out
    started: dict[str, str] = json.loads(out)
    return started["run_id"]


def test_a_queues_archive_converges_to_the_yaml_through_plan_and_apply(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archived = "select queue_name from flowlane.queues where not archive_messages order by 1"
    applied.write_text(FLOWS + "archive: false\n---\nkind: queue\nname: digests\narchive: false\n")
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    assert ("SAFE_OPTION_CHANGE    queue alerts\n  limits: concurrency 1 in the database, "
            "concurrency 1, archive off in the YAML\n") in out
    assert ("SAFE_OPTION_CHANGE    queue digests\n  limits: none in the database, "
            "no limits, archive off in the YAML\n") in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(archived).fetchall() == [("alerts",), ("digests",)]
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert "SAFE_OPTION_CHANGE" not in out, out
    out = run_joined(capsys, "queue", "list", "--dsn", dsn)[1]
    assert ("limits alerts: concurrency 0 of 1 started, archive off (the messages of ended tasks "
            "are deleted)\nlimits digests: archive off") in out, out
    # the digests document gone: apply turns its archive on again
    applied.write_text(FLOWS + "archive: false\n")
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert ("SAFE_OPTION_CHANGE    queue digests\n  limits: no limits, archive off in the database, "
            "removed by apply (no `kind: queue` document declares them)") in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(archived).fetchall() == [("alerts",)]
    assert "limits digests" not in run_joined(capsys, "queue", "list", "--dsn", dsn)[1]


def test_start_priority_and_what_runs_and_tasks_wait_for(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _start(capsys, dsn, 42, "--priority", "5")
    code, out = run_joined(capsys, "start", "alerts", "--input", '{"customer_id": 42}', "--dsn", dsn)
    held = out.split("\n", 1)[0]
    assert code == 0 and (f"run {held} waits for a slot of its flow's concurrency limit "
                          f"(`flowlane run {held}` says which)") in out
    other = _start(capsys, dsn, 7, "--priority", "-3")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert dict(conn.execute("select run_id::text, priority from flowlane.runs").fetchall()) == {
            first: 5, held: 0, other: -3}
        # a worker claims the first run's task: the queue's concurrency (1) is reached
        claimed = conn.execute(
            "select count(*) from flowlane.claim_tasks('alerts', 10, %s, %s) where outcome = 'claimed'",
            (uuid.uuid4(), Jsonb([["alerts", "deliver"]]))).fetchone()
        assert claimed == (1,)

    code, out = run_joined(capsys, "run", held, "--dsn", dsn)
    assert code == 0, out
    assert "status    waiting\n" in out and "starts" not in out
    assert ("waiting for\n  run                      "
            "concurrency customer_id=42: 1 of 1 started (1st in line)") in out
    code, out = run_joined(capsys, "run", other, "--dsn", dsn)
    assert "  deliver: 1 task          queue concurrency alerts: 1 of 1 started" in out, out

    code, out = run_joined(capsys, "runs", "--dsn", dsn)
    assert code == 0, out
    lines = {line.split()[0]: line for line in out.splitlines()
             if line[:8] in (first[:8], held[:8], other[:8])}
    assert out.splitlines()[0].endswith("  WAITING FOR")
    assert lines[held].endswith("  concurrency customer_id=42: 1 of 1 started")
    assert lines[other].endswith("  queue concurrency alerts: 1 of 1 started")
    assert len(lines[first].rstrip()) < 106  # nothing holds it back: no reason column
    assert main(["runs", "--dsn", dsn, "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {r["run_id"]: (r["held"], r["waiting_for"]) for r in listed} == {
        first: (False, None), held: (True, "concurrency customer_id=42: 1 of 1 started"),
        other: (False, "queue concurrency alerts: 1 of 1 started")}

    code, out = run_joined(capsys, "queue", "list", "--dsn", dsn)
    assert code == 0, out
    assert ("limits alerts: concurrency 1 of 1 started; waiting for: queue concurrency alerts: "
            "1 of 1 started") in out


def test_a_rate_limited_queue_says_when_its_next_start_is(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    applied.write_text(FLOWS.replace("concurrency: 1\n", "rate_limit: {limit: 1, per: 1h}\n"))
    assert run_joined(capsys, "compile")[0] == 0 and run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    _start(capsys, dsn, 1)
    second = _start(capsys, dsn, 2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select * from flowlane.claim_tasks('alerts', 10, %s, %s)",
                     (uuid.uuid4(), Jsonb([["alerts", "deliver"]])))
    out = run_joined(capsys, "queue", "list", "--dsn", dsn)[1]
    assert re.search(r"limits alerts: rate limit 1 per 3600 s; waiting for: rate limit alerts: "
                     r"next start in 3\d{3}(\.\d)? s", out), out
    out = run_joined(capsys, "run", second, "--dsn", dsn)[1]
    assert re.search(r"deliver: 1 task +rate limit alerts: next start in 3\d{3}(\.\d)? s", out), out


def test_a_priority_out_of_range_is_refused_before_the_database(
        dsn: str, applied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_joined(capsys, "start", "alerts", "--priority", "1001", "--dsn", dsn)
    assert code != 0 and "priority must be an integer from -1000 to 1000, not 1001" in out
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from flowlane.runs").fetchone() == (0,)
