"""Keyed and delayed starts through the Client and the CLI; a worker's maintenance tick begins
a delayed run (time is moved by backdating the run's start time, never by sleeping)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from flowlane import errors
from flowlane.cli import main
from flowlane.runtime.client import Client
from tests.runtime.rt_support import WorkerProcess, wait_run

pytestmark = pytest.mark.slow


def test_client_keyed_start_says_when_the_run_existed(flows_dsn: str) -> None:
    with Client(flows_dsn) as client:
        first = client.start("rt_noop", {"width": 1}, key="invoice-9")
        again = client.start("rt_noop", {"width": 5}, key="invoice-9")
        assert (first.existed, again.existed) == (False, True)
        assert again.run_id == first.run_id and again.status == "started"
        with pytest.warns(DeprecationWarning, match=r"use start\(\.\.\.\)\.run_id"):
            assert client.start_run("rt_noop", {}, key="invoice-9") == first.run_id
        with pytest.warns(DeprecationWarning, match=r"Client.begin is deprecated"):
            assert client.begin("rt_noop", {}, key="invoice-9") == again
        state = client.get_run(first.run_id)
    run = state.to_json()["run"]  # columns the typed run leaves in its document
    assert (run["idempotency_key"], run["called_as"]) == ("invoice-9", "rt_noop")


def test_client_delayed_start_waits_listed_and_cancellable(flows_dsn: str) -> None:
    at = datetime.now(UTC) + timedelta(hours=2)
    with Client(flows_dsn) as client:
        later = client.start("rt_noop", {}, start_at=at)
        assert later.status == "waiting" and later.start_at == at
        delayed = client.start_runs("rt_noop", [{}, {}], start_at=timedelta(minutes=5))
        listed = client.list_runs(status="waiting")
        assert {r.run_id for r in listed} == {later.run_id, *delayed}
        assert all(r.start_at is not None for r in listed)
        cancelled = client.cancel(later.run_id, reason="not needed")
        assert (cancelled.status, cancelled.cancel_reason) == ("cancelled", "not needed")
        with pytest.raises(errors.UsageError, match="no time zone"):
            client.start("rt_noop", {}, start_at=datetime(2030, 1, 1))


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The CLI in this process (each command as `flowlane` runs it, without a new interpreter)."""
    try:
        code = main(list(argv))
    except SystemExit as exit:  # argparse's usage errors
        code = int(exit.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_key_delay_and_at(flows_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    dsn = ("--dsn", flows_dsn)
    code, out, _ = _cli(capsys, "start", "rt_noop", "--key", "k1", *dsn, "--format", "json")
    shown = json.loads(out)
    assert code == 0 and shown["existed"] is False and shown["status"] == "started"
    code, out, err = _cli(capsys, "start", "rt_noop", "--key", "k1", *dsn)
    assert code == 0 and out.strip() == shown["run_id"] and "already existed for key k1" in err

    code, out, err = _cli(capsys, "start", "rt_noop", "--delay", "2h", *dsn, "--format", "json")
    delayed = json.loads(out)
    assert code == 0 and delayed["status"] == "waiting", err
    _, listed, _ = _cli(capsys, "runs", "--status", "waiting", *dsn)
    assert delayed["run_id"] in listed and "until" in listed

    code, _, err = _cli(capsys, "start", "rt_noop", "--delay", "5 minutes", *dsn)
    assert code == 2 and "--delay '5 minutes' is not a duration" in err
    code, _, err = _cli(capsys, "start", "rt_noop", "--delay", "5m", "--at", "2030-01-01T00:00Z", *dsn)
    assert code == 2 and "not allowed with argument" in err
    code, out, _ = _cli(capsys, "start", "rt_noop", "--at", "2030-01-01T00:00+00:00", *dsn,
                        "--format", "json")
    assert code == 0 and json.loads(out)["start_at"].startswith("2030-01-01T00:00:00")


def test_a_workers_tick_begins_a_delayed_run_whose_handler_reads_its_deadline(
    flows_dsn: str, spawn: Callable[..., WorkerProcess]
) -> None:
    with Client(flows_dsn) as client:
        run_id = client.start("rt_deadline", {}, start_at=timedelta(days=1)).run_id
    worker = spawn("--flow", "rt_deadline")
    with psycopg.connect(flows_dsn, autocommit=True) as conn:  # its time has come
        conn.execute("update flowlane.runs set start_at = now() - interval '1 second' "
                     "where run_id = %s", (run_id,))
    state = wait_run(flows_dsn, run_id, workers=[worker])
    run = state["run"]
    assert run["status"] == "completed" and run["started_at"] >= run["start_at"]
    told = datetime.fromisoformat(run["output"]["when"])
    assert told == datetime.fromisoformat(run["deadline_at"])
    assert told - datetime.fromisoformat(run["started_at"]) == timedelta(hours=1)
