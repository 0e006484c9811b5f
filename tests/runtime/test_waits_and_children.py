"""``flowlane signal``, ``Client.signal`` and ``AsyncClient.signal`` against a real database
(the CLI in process, for speed); one real ``flowlane serve`` runs an approval flow completed
by a signal from the CLI in a subprocess, as a user sends it, and a parent whose map step
starts a child run per element."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowlane import errors
from flowlane.cli import main
from flowlane.runtime.client import AsyncClient, Client
from flowlane.runtime.run_state import WaitStep
from tests.runtime.rt_support import apply_flows, env, flowlane, wait_until

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: sg_approval
defaults: {base_delay: 0, timeout: 5}
steps:
  prepare:
    handler: sg_handlers:prepare
  approve:
    needs: [prepare]
    type: wait
    timeout: 1h
  ship:
    needs: [approve]
    if: {approve: {approved: true}}
    handler: sg_handlers:ship
---
kind: flow
slug: sg_gate
steps:
  hold:
    type: wait
  after:
    needs: [hold]
    handler: sg_handlers:ship
---
kind: flow
slug: sg_parent
defaults: {base_delay: 0, timeout: 5}
steps:
  split:
    handler: sg_handlers:split
  each:
    needs: [split]
    type: map
    flow: sg_child
  total:
    needs: [each]
    handler: sg_handlers:total
---
kind: flow
slug: sg_child
defaults: {base_delay: 0, timeout: 5}
steps:
  square:
    handler: sg_handlers:square
"""

HANDLERS = """\
def prepare(input, ctx):
    return {"order": input["order"]}


def ship(input, ctx):
    return {"shipped": True, "by": input.get("approve", input.get("hold", {})).get("by")}


def split(input, ctx):
    return input["items"]


def square(input, ctx):
    return input * input


def total(input, ctx):
    return sum(child["square"] for child in input["each"])
"""


@pytest.fixture
def project(tmp_path: Path, dsn: str) -> Path:
    root = tmp_path / "proj"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "sg.yaml").write_text(FLOWS)
    (root / "sg_handlers.py").write_text(HANDLERS)
    apply_flows(dsn, root)
    return root


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_signal_from_the_cli_completes_a_wait_step_and_refusals_change_nothing(
    project: Path, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(dsn) as client:
        run_id = client.start("sg_gate").run_id
    code, waiting, _ = _cli(capsys, "run", run_id, "--dsn", dsn)
    assert "hold" in waiting and "waiting for a signal since" in waiting
    assert f"`flowlane signal {run_id} hold --data JSON` completes it" in waiting

    code, _, err = _cli(capsys, "signal", run_id, "hold", "--data", "{nope", "--dsn", dsn)
    assert code == 2 and "--data is not valid JSON" in err
    code, _, err = _cli(capsys, "signal", run_id, "after", "--dsn", dsn)
    assert code == 1 and "is not a wait step" in err
    assert "Traceback" not in err and "wait steps of flow sg_gate: hold" in err  # the hint

    code, out, err = _cli(capsys, "signal", run_id, "hold", "--data", '{"by": "ana"}', "--dsn", dsn)
    assert code == 0, err
    assert f"step hold of run {run_id} completed by a signal from ana at " in out
    code, _, err = _cli(capsys, "signal", run_id, "hold", "--data", '{"by": "bo"}', "--dsn", dsn)
    assert code == 1 and "already has a signal" in err

    with Client(dsn) as client:
        state = client.get_run(run_id)
    hold = state.step("hold")
    assert hold is not None and (hold.status, hold.output) == ("completed", {"by": "ana"})
    signal = state.waits[0].signal
    assert signal is not None and signal.payload == {"by": "ana"}
    _, shown, _ = _cli(capsys, "run", run_id, "--dsn", dsn)
    assert "completed by a signal from ana at" in shown


def test_client_signal_sync_and_async_keep_early_signals_and_raise_refusals(
    project: Path, dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(dsn) as client:
        run_id = client.start("sg_approval", {"order": 1}).run_id
        kept = client.signal(run_id, "approve", {"approved": True})
        assert not kept.applied and kept.applied_at is None  # prepare has not run: kept
        with pytest.raises(errors.SignalRefused) as info:
            client.signal(run_id, "approve", {"approved": False})
        assert info.value.sqlstate == "55000" and "already has a signal" in str(info.value)
        with pytest.raises(errors.UsageError):
            client.signal(run_id, "approve", {"bad": float("nan")})

    async def refused() -> errors.SignalRefused:
        async with AsyncClient(dsn) as client:
            with pytest.raises(errors.SignalRefused) as info:
                await client.signal(run_id, "ship", {})
            gate = (await client.start("sg_gate")).run_id
            applied = await client.signal(gate, "hold", [1])
            assert applied.applied and applied.payload == [1] and applied.by is None
            return info.value

    assert "is not a wait step" in str(asyncio.run(refused()))
    data = tmp_path / "payload.json"
    data.write_text('{"by": "file"}')
    with Client(dsn) as client:
        gate_id = client.start("sg_gate").run_id
    _, sent, _ = _cli(capsys, "signal", gate_id, "hold", "--data", f"@{data}", "--dsn", dsn,
                      "--format", "json")
    assert json.loads(sent) == {"run_id": gate_id, "step": "hold", "applied": True, "by": "file"}


def _approve_waiting(dsn: str, run_id: str) -> WaitStep | None:
    with Client(dsn) as client:
        waits = client.get_run(run_id).waits
    return waits[0] if waits[0].status == "started" else None


def test_serve_runs_an_approval_flow_a_signal_completes_and_a_map_of_child_runs(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "serve", "--dsn", dsn, "--shutdown-timeout", "5"],
            cwd=project, env=env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        with Client(dsn) as client:
            run_id = client.start("sg_approval", {"order": 42}).run_id
            parent_id = client.start("sg_parent", {"items": [1, 2, 3]}).run_id
        wait_until(lambda: _approve_waiting(dsn, run_id), timeout=60,
                   message="prepare done by the served worker, approve waiting")
        sent = flowlane("signal", run_id, "approve", "--data", '{"approved": true, "by": "ana"}',
                        "--dsn", dsn, cwd=project)
        assert sent.returncode == 0, sent.stderr
        with Client(dsn) as client:
            state = client.wait(run_id, timeout=60)
        assert state.run.status == "completed", out.read_text()
        assert state.run.output == {"ship": {"shipped": True, "by": "ana"}}
        with Client(dsn) as client:
            parent = client.wait(parent_id, timeout=60)
            children = client.list_runs(parent=parent_id)
        assert parent.run.output == {"total": 14}, out.read_text()
        assert sorted((c.flow_slug, c.status) for c in children) == [("sg_child", "completed")] * 3
        assert [(c.step_slug, c.task_index) for c in parent.children] == [
            ("each", 0), ("each", 1), ("each", 2)]
        listed = flowlane("runs", "--parent", parent_id, "--dsn", dsn, "--format", "json", cwd=project)
        assert {r["run_id"] for r in json.loads(listed.stdout)} == {c.run_id for c in children}
        shown = flowlane("run", children[0].run_id, "--dsn", dsn, cwd=project).stdout
        assert f"parent    {parent_id} (sg_parent, completed; step each[" in shown
    finally:
        proc.terminate()
        proc.wait(timeout=30)
