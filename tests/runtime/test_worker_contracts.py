"""A real worker process checks each output against its step's output_schema: a wrong output
fails the task at its first attempt (no retry) with the JSON path, a right one completes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from flowlane import errors
from flowlane.cli import main
from flowlane.runtime.client import Client
from tests.runtime.rt_support import WorkerProcess, start_run, step, tasks, wait_run

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]


def test_a_wrong_output_fails_its_first_attempt_without_retry(flows_dsn: str, spawn: Spawn) -> None:
    worker = spawn("--flow", "rt_contract", "--log-level", "INFO")
    bad = start_run(flows_dsn, "rt_contract", {"mode": "bad"})
    good = start_run(flows_dsn, "rt_contract", {"mode": "good"})
    failed, completed = (wait_run(flows_dsn, run, workers=[worker]) for run in (bad, good))
    assert failed["run"]["status"] == "failed"
    [task] = tasks(failed, "make")
    assert task["status"] == "failed" and task["attempts_count"] == 1, task
    assert task["error_message"] == ("the output of step make does not match its output_schema: "
                                     "/total: -1 is less than the minimum 0 "
                                     "(rule output_schema/properties/total/minimum)")
    assert completed["run"]["status"] == "completed"
    assert step(completed, "make")["output"] == {"total": 3}
    assert worker.stop() == 0, worker.text()
    assert "OutputContractViolation" in worker.text()


def test_client_and_cli_starts_name_the_path_the_rule_and_the_file_line(
        flows_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(errors.InputRefused, match="/mode: \"fast\" is not one of") as one:
        start_run(flows_dsn, "rt_contract", {"mode": "fast"})
    assert (one.value.position, one.value.path, one.value.rule) == (None, "/mode", "/properties/mode/enum")
    with Client(flows_dsn) as client, pytest.raises(errors.InputRefused) as many:
        client.start_runs("rt_contract", [{"mode": "good"}] * 3 + [{"mode": "good"}, 7], chunk_size=3)
    assert (many.value.position, many.value.path, many.value.rule) == (4, "/", "/type")
    code = main(["start", "rt_contract", "--input", '{"mode": "fast"}', "--dsn", flows_dsn])
    err = capsys.readouterr().err
    assert code == 1, err  # a refused input is a failure, not a usage error
    assert '/mode: "fast" is not one of ["good", "bad"]' in err
    assert 'the rule at input_schema/properties/mode/enum of {"enum": ["good", "bad"]}' in err
    lines = tmp_path / "inputs.jsonl"
    lines.write_text('{"mode": "good"}\n\n{"mode": "bad"}\n{"mode": 3}\n')
    code = main(["start", "rt_contract", "--input-file", str(lines), "--dsn", flows_dsn])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{lines}:4: cannot start rt_contract" in err and "/mode: 3 is not one of" in err
    with psycopg.connect(flows_dsn) as conn:
        row = conn.execute("select count(*) from flowlane.runs where flow_slug = 'rt_contract'").fetchone()
    assert row == (0,)
