"""``flowlane start|runs|run`` and the Client, against a real database and a real worker."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from flowlane import errors
from flowlane.runtime.client import Client
from tests.runtime.rt_support import WorkerProcess, flowlane, wait_run

pytestmark = pytest.mark.slow


def test_start_runs_and_run_in_text_and_json(flows_dsn: str, spawn: Callable[..., WorkerProcess]) -> None:
    started = flowlane("start", "rt_diamond", "--input", '{"numbers": [1, 2, 3, 4]}', "--dsn", flows_dsn)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert str(uuid.UUID(run_id)) == run_id
    as_json = flowlane(
        "start", "rt_diamond", "--input", '{"numbers": []}', "--dsn", flows_dsn, "--format", "json"
    )
    assert as_json.returncode == 0, as_json.stderr
    other = json.loads(as_json.stdout)["run_id"]

    waiting = flowlane("run", run_id, "--dsn", flows_dsn, "--format", "json")
    assert json.loads(waiting.stdout)["run"]["status"] == "started"

    worker = spawn("--flow", "rt_diamond")
    wait_run(flows_dsn, run_id, workers=[worker])
    wait_run(flows_dsn, other, workers=[worker])

    shown = flowlane("run", run_id, "--dsn", flows_dsn, "--format", "json")
    state = json.loads(shown.stdout)
    assert state["run"]["status"] == "completed"
    assert {s["step_slug"]: s["status"] for s in state["steps"]} == {
        "split": "completed",
        "square": "completed",
        "meta": "completed",
        "total": "completed",
        "alert": "completed",
    }
    text = flowlane("run", run_id, "--dsn", flows_dsn).stdout
    assert "status    completed" in text and '"sum_of_squares": 30' in text
    assert "alert" in text and "4 completed" in text  # the map step's tasks

    listed = flowlane("runs", "--dsn", flows_dsn, "--format", "json")
    runs = json.loads(listed.stdout)
    assert {r["run_id"] for r in runs} == {run_id, other}
    assert all(r["status"] == "completed" and r["flow_slug"] == "rt_diamond" for r in runs)
    table = flowlane("runs", "--dsn", flows_dsn, "--status", "completed").stdout
    assert run_id in table and other in table
    assert flowlane("runs", "--dsn", flows_dsn, "--status", "failed").stdout.strip() == "no runs"


def test_start_an_alias_records_the_concrete_flow(flows_dsn: str) -> None:
    started = flowlane("start", "rt_latest_retry", "--dsn", flows_dsn, "--format", "json")
    assert started.returncode == 0, started.stderr
    data = json.loads(started.stdout)
    assert data["flow"] == "rt_latest_retry" and data["flow_slug"] == "rt_retry"
    shown = json.loads(flowlane("run", data["run_id"], "--dsn", flows_dsn, "--format", "json").stdout)
    assert shown["run"]["flow_slug"] == "rt_retry"


def test_cli_errors_are_one_line_without_traceback(flows_dsn: str) -> None:
    bad_json = flowlane("start", "rt_diamond", "--input", "{nope", "--dsn", flows_dsn)
    assert bad_json.returncode == 2 and "--input is not valid JSON" in bad_json.stderr
    unknown = flowlane("start", "no_such_flow", "--dsn", flows_dsn)
    assert unknown.returncode == 1 and "no_such_flow" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    missing = flowlane("run", str(uuid.uuid4()), "--dsn", flows_dsn)
    assert missing.returncode == 1 and "no run" in missing.stderr
    garbage = flowlane("run", "not-a-uuid", "--dsn", flows_dsn)
    assert garbage.returncode == 2 and "not a run id" in garbage.stderr


def test_client_api(flows_dsn: str) -> None:
    with Client(flows_dsn) as client:
        run_id = client.start("rt_retry", {"x": 1}).run_id
        state = client.get_run(run_id)
        assert state.run.input == {"x": 1} and state.run.status == "started"
        assert [s.step_slug for s in state.steps] == [s["step_slug"] for s in state.to_json()["steps"]]
        with pytest.warns(DeprecationWarning, match=r"state\.run\.status"):  # the former dict, by key
            assert state["run"]["run_id"] == run_id
        assert [r.run_id for r in client.list_runs(flow="rt_retry")] == [run_id]
        assert client.list_runs(flow="rt_diamond") == []


def _one_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit ``code``, one ``error:`` line (+ ``hint:``) on stderr, no traceback."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and all(line.startswith(("error: ", "hint: ")) for line in lines), (
        result.stderr
    )
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def test_bad_arguments_are_one_error_line_and_json_stays_json(flows_dsn: str) -> None:
    cases: list[tuple[list[str], int, str]] = [
        (["start", "no_such_flow"], 1, "no_such_flow"),
        (["start", "rt_diamond", "--input", "{nope"], 2, "--input is not valid JSON"),
        (["start", "rt_diamond", "--run-id", "xyz"], 2, "'xyz' is not a run id"),
        (["start", "rt_gauge", "--input", '{"not": "an array"}'], 1, "must be a JSON array"),
        (["run", "not-a-uuid"], 2, "not a run id"),
        (["run", str(uuid.uuid4())], 1, "no run"),
        (["runs", "--limit", "-1"], 2, "limit must be 0 or more"),
    ]
    for args, code, needle in cases:
        text = flowlane(*args, "--dsn", flows_dsn)
        _one_error(text, code, needle)
        assert text.stdout == ""
        as_json = flowlane(*args, "--dsn", flows_dsn, "--format", "json")
        _one_error(as_json, code, needle)
        data = json.loads(as_json.stdout)  # stdout is JSON even for an error
        assert needle in data["error"] and set(data) == {"error", "hint"}, (args, data)
    with psycopg.connect(flows_dsn) as conn:
        row = conn.execute("select count(*) from flowlane.runs").fetchone()
    assert row == (0,)  # no bad input started a run
    run_id = str(uuid.uuid4())
    for _ in range(2):  # the same id and input twice: the same run
        again = flowlane("start", "rt_retry", "--run-id", run_id, "--dsn", flows_dsn)
        assert again.returncode == 0 and again.stdout.strip() == run_id, again.stderr
    clash = flowlane("start", "rt_retry", "--run-id", run_id, "--input", '{"other": 1}', "--dsn", flows_dsn)
    _one_error(clash, 1, f"run {run_id} already exists", "pass another --run-id")
    assert json.loads(flowlane("runs", "--limit", "0", "--dsn", flows_dsn, "--format", "json").stdout) == []


def test_cli_on_a_missing_or_unmigrated_database(db_factory: Any) -> None:
    bare = db_factory("none")  # PGMQ only, no flowlane schema
    nowhere = "postgresql://nobody@127.0.0.1:1/x"
    for args in (["start", "rt_diamond"], ["runs"], ["run", str(uuid.uuid4())]):
        unmigrated = flowlane(*args, "--dsn", bare, "--format", "json")
        _one_error(unmigrated, 1, "flowlane db migrate")
        assert "flowlane db migrate" in json.loads(unmigrated.stdout)["hint"]
        missing = flowlane(*args, "--dsn", nowhere)
        _one_error(missing, 1, "cannot connect", "hint: ")


def test_worker_refuses_nonsense_numbers(flows_dsn: str) -> None:
    for option, value in [
        ("--max-concurrent", "0"),
        ("--batch-size", "0"),
        ("--max-concurrent", "-2"),
        ("--poll-interval", "0"),
        ("--requeue-interval", "-1"),
        ("--poll-interval", "nan"),
        ("--shutdown-timeout", "-1"),
    ]:
        result = flowlane("worker", "--flow", "rt_diamond", option, value, "--dsn", flows_dsn, timeout=60)
        _one_error(result, 2, option.lstrip("-").split("-")[0])


def test_runs_stuck_lists_runs_that_nothing_can_move(flows_dsn: str) -> None:
    fine = flowlane("runs", "--stuck", "--dsn", flows_dsn)
    assert (fine.returncode, fine.stdout.strip()) == (0, "no stuck runs")
    run_id = flowlane("start", "rt_retry", "--dsn", flows_dsn).stdout.strip()
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        # what 0001-0005 left behind after repeated stalls: the task's message archived
        conn.execute("select pgmq.archive('rt_retry', message_id) from flowlane.step_tasks "
                     "where run_id = %s", (run_id,))
    text = flowlane("runs", "--stuck", "--dsn", flows_dsn)
    assert text.returncode == 1
    assert run_id in text.stdout and "no message on their queue" in text.stdout
    assert f"`flowlane run {run_id}` shows its tasks" in text.stderr  # the real id
    as_json = flowlane("runs", "--stuck", "--dsn", flows_dsn, "--format", "json")
    assert as_json.returncode == 1
    assert [r["run_id"] for r in json.loads(as_json.stdout)] == [run_id]


def test_start_refuses_input_nested_past_the_limit_with_a_hint(flows_dsn: str) -> None:
    deep = "[" * 150 + "]" * 150
    result = flowlane("start", "rt_retry", "--input", deep, "--dsn", flows_dsn)
    assert result.returncode == 2, result.stderr
    assert "nested deeper than 100 levels" in result.stderr
    assert "hint: flatten the input" in result.stderr and "Traceback" not in result.stderr


def test_start_input_file_starts_one_run_per_line_in_one_transaction(
    flows_dsn: str, tmp_path: Any
) -> None:
    good = tmp_path / "runs.jsonl"
    good.write_text('{"x": 1}\n\n{"x": 2}\n{"x": 3}\n')
    started = flowlane("start", "rt_retry", "--input-file", str(good), "--dsn", flows_dsn)
    assert started.returncode == 0, started.stderr
    run_ids = started.stdout.split()
    assert len(run_ids) == 3 and "started 3 runs of rt_retry" in started.stderr
    with Client(flows_dsn) as client:
        assert [client.get_run(r).run.input for r in run_ids] == [{"x": 1}, {"x": 2}, {"x": 3}]
        many = client.start_runs("rt_retry", ({"n": i} for i in range(7)), chunk_size=3)
        assert [client.get_run(r).run.input for r in many] == [{"n": i} for i in range(7)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 4}\n{"x": \n')
    _one_error(
        flowlane("start", "rt_retry", "--input-file", str(bad), "--dsn", flows_dsn),
        2,
        f"{bad}:2:7: not valid JSON: Expecting value",  # one position: line 2, column 7
        "no run was started",
    )
    mixed = flowlane("start", "rt_retry", "--input-file", str(good), "--wait", "--dsn", flows_dsn)
    _one_error(mixed, 2, "--input-file cannot be combined")
    with Client(flows_dsn) as client:
        assert len(client.list_runs(flow="rt_retry", limit=100)) == 10


def test_start_runs_with_a_refused_input_starts_none(flows_dsn: str) -> None:
    with Client(flows_dsn) as client, psycopg.connect(flows_dsn) as conn:
        before = conn.execute("select count(*) from flowlane.runs").fetchone()
        # the first chunk is already in the database when the third input is refused
        with pytest.raises(errors.UsageError, match="input 2: the run input is not JSON-serialisable"):
            client.start_runs("rt_retry", [{"ok": 1}, {"ok": 2}, {"bad": float("nan")}], chunk_size=2)
        assert conn.execute("select count(*) from flowlane.runs").fetchone() == before


def test_every_wait_says_why_no_worker_and_a_disabled_deployment(
    flows_dsn: str, spawn: Callable[..., Any]
) -> None:
    started = flowlane("start", "rt_noop", "--wait", "--timeout", "1", "--dsn", flows_dsn)
    assert started.returncode == 1 and "still started after 1s" in started.stderr
    reason = ("no live worker serves queue rt_noop; "
              "`flowlane serve` or `flowlane worker --queue rt_noop`")
    assert reason in started.stderr
    run_id = started.stderr.split("started run ")[1].split()[0]
    for command in (("runs",), ("runs", "--stuck"), ("run", run_id), ("queue", "list")):
        shown = flowlane(*command, "--dsn", flows_dsn)
        assert f"waiting: queue rt_noop: 1 queued task(s); {reason}" in shown.stderr, command

    worker = spawn("--flow", "rt_noop")  # registers the deployment rt_noop, then stops
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "completed"
    worker.stop()
    disabled = flowlane("worker", "disable", "rt_noop", "--reason", "bad release", "--dsn", flows_dsn)
    assert disabled.returncode == 0, disabled.stderr
    again = flowlane("start", "rt_noop", "--wait", "--timeout", "1", "--dsn", flows_dsn)
    assert ("worker deployment rt_noop is disabled (bad release); "
            "`flowlane worker enable rt_noop` once its cause is fixed") in again.stderr


def test_start_of_a_misspelled_flow_suggests_the_close_names(flows_dsn: str) -> None:
    result = flowlane("start", "rt_retri", "--dsn", flows_dsn)
    assert result.returncode == 1
    assert "unknown flow \"rt_retri\"" in result.stderr
    assert "hint: did you mean rt_retry" in result.stderr, result.stderr
