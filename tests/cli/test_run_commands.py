"""The run commands against a real database (the CLI in process, for speed): exit statuses as
README's table says (a refused input or an unknown name is a failure, 1; a malformed argument
a usage error, 2), run ids taken by unique prefix, hints that name the real steps and runs,
who sent a signal, and schedule times to the second."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flowlane.cli import main
from flowlane.runtime.client import Client
from tests.runtime.rt_support import applied_project
from tests.ui import ui_support

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: an_gate
input_schema:
  type: object
  properties: {mode: {enum: [good]}}
steps:
  approve:
    type: wait
    output_schema: {type: object, required: [approved]}
  review:
    type: wait
  after:
    needs: [approve, review]
    handler: an_handlers:done
---
kind: flow
slug: an_kid
steps:
  work:
    handler: an_handlers:done
---
kind: flow
slug: an_parent
steps:
  ask:
    type: wait
  child:
    needs: [ask]
    if: {ask: {approved: true}}
    flow: an_kid
---
kind: schedule
name: an_every_30s
flow: an_kid
every: 30s
---
kind: schedule
name: an_every_minute
flow: an_kid
every: 1m
"""

HANDLERS = "def done(input, ctx):\n    return {}\n"

# two runs whose ids share their first 8 hex digits, and one alone with its prefix
TWINS = ("6f2ab472-0000-4000-8000-000000000001", "6f2ab472-0000-4000-8000-000000000002")
LONE = "7a1c0000-0000-4000-8000-000000000003"


@pytest.fixture
def project(tmp_path: Path, dsn: str) -> Path:
    return applied_project(tmp_path / "proj", dsn, FLOWS, {"an_handlers": HANDLERS})


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_refused_inputs_and_unknown_names_exit_1_malformed_arguments_2(
        project: Path, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "start", "an_gate", "--input", '{"mode": "bad"}', "--dsn", dsn)
    assert code == 1 and "does not match the flow's input_schema" in err, err
    lines = project / "inputs.jsonl"
    lines.write_text('{"mode": "good"}\n{"mode": "bad"}\n')
    code, _, err = _cli(capsys, "start", "an_gate", "--input-file", str(lines), "--dsn", dsn)
    assert code == 1 and f"{lines}:2: " in err, err
    code, _, err = _cli(capsys, "start", "an_gat", "--dsn", dsn)
    assert code == 1 and "did you mean an_gate" in err, err
    code, _, err = _cli(capsys, "runs", "--flow", "an_gat", "--dsn", dsn)
    assert code == 1 and "no flow or alias `an_gat`" in err, err
    code, _, err = _cli(capsys, "graph", "an_gat", str(project / "flows"))
    assert code == 1 and "no flow or alias `an_gat`" in err, err

    run_id = Client(dsn).__enter__().start_run("an_gate", {"mode": "good"})
    code, _, err = _cli(capsys, "signal", run_id, "approve", "--data", '{"nope": 1}', "--dsn", dsn)
    assert code == 1 and "does not match the output_schema of step" in err, err
    code, _, err = _cli(capsys, "start", "an_gate", "--run-id", run_id, "--dsn", dsn)
    assert code == 1 and "a run id names one run" in err, err

    # malformed arguments stay usage errors
    code, _, err = _cli(capsys, "start", "an_gate", "--input", "{nope", "--dsn", dsn)
    assert code == 2 and "--input is not valid JSON" in err
    code, _, err = _cli(capsys, "signal", run_id, "approve", "--data", "{nope", "--dsn", dsn)
    assert code == 2 and "--data is not valid JSON" in err
    code, _, err = _cli(capsys, "run", "7a1", "--dsn", dsn)
    assert code == 2 and "is not a run id" in err


def test_run_ids_are_taken_by_unique_prefix(
        project: Path, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        for run_id in (*TWINS, LONE):
            client.start("an_parent", {}, run_id=run_id)

    code, out, err = _cli(capsys, "run", "7a1c", "--dsn", dsn)
    assert code == 0 and f"run       {LONE}" in out, err
    code, _, err = _cli(capsys, "run", "6f2ab472", "--dsn", dsn)
    assert code == 1 and "run id prefix 6f2ab472 is ambiguous" in err
    assert all(f"{twin} (an_parent, started)" in err for twin in TWINS), err
    assert "hint: give more of the run id" in err
    code, _, err = _cli(capsys, "cancel", "dead", "--dsn", dsn)
    assert code == 1 and "no run starts with dead" in err
    code, _, err = _cli(capsys, "run", "7A1C-0000", "--dsn", dsn)  # any case, with dashes
    assert code == 0, err

    code, out, err = _cli(capsys, "signal", "7a1c0000", "ask", "--dsn", dsn)
    assert code == 0 and f"of run {LONE} " in out, err
    code, out, err = _cli(capsys, "cancel", "6f2ab472-0000-4000-8000-00000000000", "--dsn", dsn)
    assert code == 1 and "is ambiguous" in err  # the twins differ in their last digit only
    code, out, err = _cli(capsys, "cancel", TWINS[0], "--format", "json", "--dsn", dsn)
    assert code == 0 and json.loads(out)["run_id"] == TWINS[0], err
    code, _, err = _cli(capsys, "retry", "7a1c", "--dsn", dsn)  # refused: not failed; the real id
    assert code == 1 and f"`flowlane run {LONE}` shows its state" in err, err
    code, out, err = _cli(capsys, "runs", "--parent", "7a1c", "--format", "json", "--dsn", dsn)
    assert code == 0 and json.loads(out) == [], err
    code, out, err = _cli(capsys, "runs", "--before", "7a1c", "--format", "json", "--dsn", dsn)
    assert code == 0 and {r["run_id"] for r in json.loads(out)} <= set(TWINS), err


def test_hints_name_the_real_steps_and_a_useful_command(
        project: Path, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        run_id = client.start("an_gate", {}).run_id
    code, out, _ = _cli(capsys, "run", run_id, "--dsn", dsn)
    assert code == 0
    assert (f"`flowlane signal {run_id} approve --data JSON` (or review in its place) "
            "completes one") in out
    assert "STEP" not in out.partition("wait steps")[2]

    code, out, err = _cli(capsys, "start", "an_kid", "--delay", "1h", "--dsn", dsn)
    assert code == 0 and f"(`flowlane cancel {out.strip()}` cancels it)" in err, err

    unknown = "0b5e0000-0000-4000-8000-0000000000ff"
    code, _, err = _cli(capsys, "signal", unknown, "approve", "--dsn", dsn)
    assert code == 1 and f"no run {unknown}" in err
    assert "hint: `flowlane runs` lists recent runs" in err and "flowlane run 0b5e" not in err


def test_the_cli_says_who_sent_a_signal_or_that_nobody_is_named(
        project: Path, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        named, unnamed, flagged = (client.start("an_gate", {}).run_id for _ in range(3))
    code, out, err = _cli(capsys, "signal", named, "review", "--data", '{"by": "ada"}', "--dsn", dsn)
    assert code == 0, err
    assert re.search(rf"step review of run {named} completed by a signal from ada at "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$", out.strip()), out
    code, out, _ = _cli(capsys, "signal", unnamed, "review", "--dsn", dsn)
    assert "completed by a signal from an unnamed sender at" in out
    code, out, err = _cli(capsys, "signal", flagged, "approve", "--data", '{"approved": false}',
                          "--by", "bo", "--dsn", dsn)
    assert code == 0 and "approve of run" in out and "rejected by a signal from bo at" in out, err
    code, _, err = _cli(capsys, "signal", flagged, "review", "--data", '[1]', "--by", "bo",
                        "--dsn", dsn)
    assert code == 2 and "takes a JSON object payload" in err

    code, shown, _ = _cli(capsys, "run", flagged, "--dsn", dsn)
    assert "rejected by a signal from bo at" in shown
    code, shown, _ = _cli(capsys, "run", unnamed, "--dsn", dsn)
    assert "review                 completed by a signal from an unnamed sender at" in shown
    with Client(dsn) as client:
        approve = client.get_run(flagged).step("approve")
    assert approve is not None and approve.output == {"approved": False, "by": "bo"}


def _wait_cell(page: str, step: str) -> str:
    """The text of a wait step's cell on the console's run page, tags removed."""
    cell = re.search(rf'<span class="wait" data-wait="{step}">(.*?)\n</span>', page, re.DOTALL)
    assert cell, page
    return " ".join(re.sub(r"<[^>]+>", "", cell[1]).split())


def test_the_console_says_who_signalled_as_the_cli_does_and_that_a_child_step_was_skipped(
        project: Path, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Client(dsn) as client:
        gate, parent = client.start("an_gate", {}).run_id, client.start("an_parent", {}).run_id
        client.signal(gate, "review", {"note": "fine"}, by="ada")
        client.signal(gate, "approve", {"approved": False})
        client.signal(parent, "ask", {"approved": False})
    _, shown, _ = _cli(capsys, "run", gate, "--dsn", dsn)
    said = dict(re.findall(r"^  (approve|review) +(.+)$", shown, re.MULTILINE))
    assert said["review"].startswith("completed by a signal from ada at "), shown
    assert said["approve"].startswith("rejected by a signal from an unnamed sender at "), shown
    with ui_support.ui_server(dsn) as console:
        page = ui_support.fetch(f"{console.url}/runs/{gate}").body
        family = ui_support.fetch(f"{console.url}/runs/{parent}").body
    assert _wait_cell(page, "review") == said["review"]
    assert _wait_cell(page, "approve") == said["approve"]
    child = re.search(r'<tr id="step-child".*?</tr>', family, re.DOTALL)
    assert child and "skipped: no child run started" in child[0], family
    assert "no child run yet" not in child[0]


def test_schedules_show_times_to_the_second_when_the_interval_needs_it(
        project: Path, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "schedules", "--dsn", dsn)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert "NEXT (UTC)" in header
    for row in rows:  # both rows, as the table lines them up: seconds on each
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  never$", row), row
    with Client(dsn) as client:
        by_name = {s.name: s for s in client.schedules()}
    assert by_name["an_every_30s"].to_the_second and not by_name["an_every_minute"].to_the_second
