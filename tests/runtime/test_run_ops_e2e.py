"""Run operations and visible failures with real worker processes: attempt history,
`flowlane run`, cancel during a running handler, retry, start --wait, inputs, runs paging,
Client and AsyncClient waits woken by notifications."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from flowlane.runtime import client as client_module
from flowlane.runtime.client import AsyncClient, Client
from tests.runtime.rt_support import (
    WorkerProcess,
    flowlane,
    queue_depth,
    start_run,
    step,
    tasks,
    wait_run,
    wait_until,
)

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


def test_every_failed_attempt_is_visible(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_exhaust_skip", "--log-level", "INFO")
    run_id = start_run(flows_dsn, "rt_exhaust_skip", {"secret": "s3cr3t-input"})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert step(state, "boom")["error_message"] == "ValueError: boom on attempt 2"

    with Client(flows_dsn) as client:
        attempts = client.get_run(run_id).attempts
    assert [(a.attempt, a.outcome, a.error_type, a.error_message) for a in attempts] == [
        (1, "retry", "ValueError", "ValueError: boom on attempt 1"),
        (2, "failed", "ValueError", "ValueError: boom on attempt 2"),
    ]
    assert all("rt_handlers.py" in (a.traceback or "") and "raise ValueError" in (a.traceback or "")
               for a in attempts)

    log = worker.text()
    assert 'task_failed' in log and "error=ValueError" in log
    assert 'message="boom on attempt 1"' in log
    retry_line = next(line for line in log.splitlines() if "task_retry_scheduled" in line)
    assert "error=ValueError" in retry_line and 'message="ValueError: boom on attempt 1"' in retry_line
    assert "s3cr3t-input" not in log  # never the task input

    shown = flowlane("run", run_id, "--dsn", flows_dsn)
    assert shown.returncode == 0, shown.stderr
    boom_line = next(line for line in shown.stdout.splitlines() if line.startswith("boom "))
    assert re.search(r"1 failed\s+2\s", boom_line), boom_line  # one task, executed twice
    assert "skipped: handler_failed (ValueError: boom on attempt 2)" in boom_line
    after_line = next(line for line in shown.stdout.splitlines() if line.startswith("after "))
    assert re.search(r"1 completed\s+1$", after_line), after_line
    assert "boom[0]" in shown.stdout and "attempt 1  ValueError: boom on attempt 1" in (
        shown.stdout)
    assert "ValueError: ValueError" not in shown.stdout  # the type once


def test_run_shows_map_task_summary(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_diamond")
    run_id = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2, 3]})
    wait_run(flows_dsn, run_id, workers=[worker])
    shown = flowlane("run", run_id, "--dsn", flows_dsn)
    square = next(line for line in shown.stdout.splitlines() if line.startswith("square "))
    assert re.search(r"3 completed\s+3$", square), square  # three tasks, one execution each


def test_cancel_during_a_running_handler(flows_dsn: str, spawn: Spawn, tmp_path: Path) -> None:
    worker = spawn("--flow", "rt_slow")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path)})
    wait_until(lambda: (tmp_path / f"started-{run_id}-1").exists(), message="handler started")

    result = flowlane("cancel", run_id, "--reason", "wrong input", "--dsn", flows_dsn)
    assert result.returncode == 0, result.stderr
    assert f"run {run_id} cancelled (wrong input)" in result.stdout
    assert queue_depth(flows_dsn, "rt_slow") == 0

    (tmp_path / "release").write_text("")
    worker.wait_logged("result_rejected", "late completion rejected")
    with Client(flows_dsn) as client:
        read = client.get_run(run_id)
    assert (read.run.status, read.run.cancel_reason) == ("cancelled", "wrong input")
    state = read.to_json()
    assert [t["status"] for t in tasks(state, "hold")] == ["cancelled"]
    assert tasks(state, "hold")[0]["output"] is None
    assert step(state, "hold")["status"] == "cancelled"  # not left started: the run ended it
    assert step(state, "record")["status"] == "cancelled" and tasks(state, "record") == []
    assert not (tmp_path / "record.log").exists()

    again = flowlane("cancel", run_id, "--dsn", flows_dsn)
    assert again.returncode == 0, again.stderr


def test_cancel_refuses_a_finished_or_unknown_run(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_retry")
    run_id = start_run(flows_dsn, "rt_retry", {})
    wait_run(flows_dsn, run_id, workers=[worker])
    done = flowlane("cancel", run_id, "--dsn", flows_dsn)
    assert done.returncode == 1
    assert "is already completed: only a started or waiting run can be cancelled" in done.stderr
    unknown = flowlane("cancel", "6f1c54c2-52a6-4d8e-9d0e-2b8b5b2b3b3b", "--dsn", flows_dsn)
    assert unknown.returncode == 1 and "no run 6f1c54c2" in unknown.stderr
    bad = flowlane("cancel", "nope", "--dsn", flows_dsn)
    assert bad.returncode == 2 and "is not a run id" in bad.stderr


def test_retry_resumes_from_the_failed_step(flows_dsn: str, spawn: Spawn, tmp_path: Path) -> None:
    worker = spawn("--flow", "rt_gate")
    run_id = start_run(flows_dsn, "rt_gate", {"dir": str(tmp_path)})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "failed"
    assert tasks(state, "gate")[0]["attempts_count"] == 2

    (tmp_path / "open").write_text("")
    result = flowlane("retry", run_id, "--dsn", flows_dsn)
    assert result.returncode == 0, result.stderr
    assert "started again (retry 1)" in result.stdout
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "completed"
    # a fresh attempt budget; the completed step kept its output and did not run again
    assert state["run"]["output"] == {"gate": {"passed_on_attempt": 1, "prep": {"prepared": True}}}
    assert (tmp_path / "prep.log").read_text().splitlines() == [f"{run_id} 1"]
    with Client(flows_dsn) as client:
        history = client.get_run(run_id).attempts
    assert [(h.attempt, h.retry_round, h.error_type) for h in history] == [
        (1, 0, "PermissionError"), (2, 0, "PermissionError")]

    refused = flowlane("retry", run_id, "--dsn", flows_dsn)
    assert refused.returncode == 1
    assert "is completed: only a failed run can be retried" in refused.stderr


def test_retry_from_a_step_of_a_completed_run_recomputes_only_its_dependents(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_rerun")
    run_id = start_run(flows_dsn, "rt_rerun", {"dir": str(tmp_path)})
    first = wait_run(flows_dsn, run_id, workers=[worker])
    assert first["run"]["status"] == "completed"
    executions = tmp_path / "executions.log"
    assert sorted(executions.read_text().splitlines()) == ["audit", "load", "publish", "transform"]

    result = flowlane("retry", run_id, "--from", "transform", "--dsn", flows_dsn)
    assert result.returncode == 0, result.stderr
    assert "started again (retry 1)" in result.stdout
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert Counter(executions.read_text().splitlines()) == Counter(
        {"load": 1, "audit": 1, "transform": 2, "publish": 2})
    assert state["run"]["output"]["audit"] == step(first, "audit")["output"]
    assert state["run"]["output"]["publish"]["execution"] == 6
    # the first execution of the rerun steps stays in the history, with its output
    with Client(flows_dsn) as client:
        history = client.get_run(run_id).attempts
    assert [(h.step_slug, h.outcome, h.retry_round, h.output) for h in history] == [
        ("transform", "superseded", 0, step(first, "transform")["output"]),
        ("publish", "superseded", 0, step(first, "publish")["output"]),
    ]
    shown = flowlane("run", run_id, "--dsn", flows_dsn)
    assert shown.returncode == 0, shown.stderr
    assert "superseded" in shown.stdout

    unknown = flowlane("retry", run_id, "--from", "nope", "--dsn", flows_dsn)
    assert unknown.returncode == 1 and "has no step 'nope'" in unknown.stderr


def test_start_wait_prints_the_output_and_the_exit_status_tells(
    flows_dsn: str, spawn: Spawn
) -> None:
    spawn("--flow", "rt_retry")
    spawn("--flow", "rt_exhaust_fail")
    ok = flowlane("start", "rt_latest_retry", "--wait", "--dsn", flows_dsn)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"flaky": {"succeeded_on_attempt": 3}}

    failed = flowlane("start", "rt_exhaust_fail", "--wait", "--format", "json", "--dsn", flows_dsn)
    assert failed.returncode == 1
    report = json.loads(failed.stdout)
    assert report["status"] == "failed" and "boom on attempt 2" in report["error_message"]
    assert "hint: `flowlane run" in failed.stderr


def test_start_wait_gives_up_at_the_timeout(flows_dsn: str) -> None:
    result = flowlane("start", "rt_noop", "--wait", "--timeout", "0.2", "--dsn", flows_dsn)
    assert result.returncode == 1
    assert "is still started after 0.2s" in result.stderr


def test_input_from_a_file_and_stdin_and_the_size_limit(flows_dsn: str, tmp_path: Path) -> None:
    source = tmp_path / "input.json"
    source.write_text(json.dumps({"from": "file"}))
    from_file = flowlane("start", "rt_noop", "--input", f"@{source}", "--dsn", flows_dsn)
    assert from_file.returncode == 0, from_file.stderr

    from_stdin = subprocess_with_stdin(flows_dsn, '{"from": "stdin"}')
    assert from_stdin.returncode == 0, from_stdin.stderr
    with Client(flows_dsn) as client:
        inputs = {
            client.get_run(r.strip()).run.input["from"]
            for r in (from_file.stdout, from_stdin.stdout)
        }
    assert inputs == {"file", "stdin"}

    big = tmp_path / "big.json"
    big.write_text(json.dumps({"blob": "x" * client_module.MAX_INPUT_BYTES}))
    too_big = flowlane("start", "rt_noop", "--input", f"@{big}", "--dsn", flows_dsn)
    assert too_big.returncode == 2
    assert f"over the limit of {client_module.MAX_INPUT_BYTES} bytes" in too_big.stderr
    missing = flowlane("start", "rt_noop", "--input", "@nope.json", "--dsn", flows_dsn)
    assert missing.returncode == 2 and "cannot read --input file nope.json" in missing.stderr
    with Client(flows_dsn) as client, pytest.raises(Exception, match="over the limit"):
        client.start("rt_noop", {"blob": "x" * client_module.MAX_INPUT_BYTES})


def subprocess_with_stdin(dsn: str, text: str) -> object:
    import subprocess
    import sys

    from tests.runtime.rt_support import PROJECT, env

    return subprocess.run(
        [sys.executable, "-m", "flowlane", "start", "rt_noop", "--input", "-", "--dsn", dsn],
        input=text, cwd=PROJECT, env=env(), capture_output=True, text=True, timeout=60,
        check=False,
    )


def test_runs_resolves_aliases_suggests_and_pages(flows_dsn: str) -> None:
    retry_runs = [start_run(flows_dsn, "rt_retry", {}) for _ in range(3)]
    start_run(flows_dsn, "rt_noop", {})
    listed = flowlane("runs", "--flow", "rt_latest_retry", "--format", "json", "--dsn", flows_dsn)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert sorted(r["run_id"] for r in rows) == sorted(retry_runs)
    assert {r["flow_slug"] for r in rows} == {"rt_retry"}

    typo = flowlane("runs", "--flow", "rt_retyr", "--dsn", flows_dsn)
    assert typo.returncode == 1  # an unknown name is a failure
    assert "no flow or alias `rt_retyr`" in typo.stderr and "did you mean rt_retry" in typo.stderr

    first = flowlane("runs", "--flow", "rt_retry", "--limit", "2", "--format", "json",
                     "--dsn", flows_dsn)
    page1 = [r["run_id"] for r in json.loads(first.stdout)]
    assert f"--before {page1[-1]}" in first.stderr
    second = flowlane("runs", "--flow", "rt_retry", "--before", page1[-1], "--format", "json",
                      "--dsn", flows_dsn)
    page2 = [r["run_id"] for r in json.loads(second.stdout)]
    assert len(page1) == 2 and len(page2) == 1 and sorted(page1 + page2) == sorted(retry_runs)

    gone = flowlane("runs", "--before", "6f1c54c2-52a6-4d8e-9d0e-2b8b5b2b3b3b", "--dsn", flows_dsn)
    assert gone.returncode == 1 and "--before: no run 6f1c54c2" in gone.stderr
    future = flowlane("runs", "--since", "2999-01-01T00:00:00+00:00", "--dsn", flows_dsn)
    assert future.returncode == 0 and "no runs" in future.stdout
    bad = flowlane("runs", "--since", "yesterday", "--dsn", flows_dsn)
    assert bad.returncode == 2 and "is not a time" in bad.stderr


def test_client_waits_are_woken_by_notifications(
    flows_dsn: str, spawn: Spawn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without a notification the waits would sleep an hour: returning proves they were woken
    monkeypatch.setattr(client_module, "FALLBACK_POLL_SECONDS", 3600.0)
    spawn("--flow", "rt_retry")
    with Client(flows_dsn) as client:
        run_id = client.start("rt_retry", {}).run_id
        state = client.wait(run_id, timeout=120)
    assert state.run.status == "completed"

    async def scenario() -> tuple[str, str, str]:
        async with AsyncClient(flows_dsn) as client:
            run_id = (await client.start("rt_retry", {})).run_id
            done = await client.wait(run_id, timeout=120)
            other = (await client.start("rt_slow", {"dir": "/nonexistent"})).run_id
            cancelled = await client.cancel(other, reason="async")
            listed = await client.list_runs(flow="rt_latest_retry", limit=1)
            return done.run.status, cancelled.status, listed[0].run_id == run_id and "ok"

    assert asyncio.run(scenario()) == ("completed", "cancelled", "ok")
