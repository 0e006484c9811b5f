"""``flowlane start|runs|run`` and the Client, against a real database and a real worker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

from rt_support import WorkerProcess, flowlane, wait_run

from flowlane.runtime.client import Client


def test_start_runs_and_run_in_text_and_json(
    flows_dsn: str, spawn: Callable[..., WorkerProcess]
) -> None:
    started = flowlane(
        "start", "rt_diamond", "--input", '{"numbers": [1, 2, 3, 4]}', "--dsn", flows_dsn
    )
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
    shown = json.loads(
        flowlane("run", data["run_id"], "--dsn", flows_dsn, "--format", "json").stdout
    )
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
        run_id = client.start_run("rt_retry", {"x": 1})
        state = client.get_run(run_id)
        assert state["run"]["input"] == {"x": 1} and state["run"]["status"] == "started"
        assert [r.run_id for r in client.list_runs(flow="rt_retry")] == [run_id]
        assert client.list_runs(flow="rt_diamond") == []
