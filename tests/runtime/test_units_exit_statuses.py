"""A worker's exit statuses are ``errors.WorkerExit``: its errors carry them, and
docs/runtime.md's table lists exactly them, in order (read as data, not as lines)."""

from __future__ import annotations

from pathlib import Path

from flowlane import errors
from flowlane.errors import WorkerExit
from tests.docs_support import table

RUNTIME = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def _exit_status_table() -> dict[int, str]:
    """``status -> meaning`` of the rows of the "Exit status" table."""
    section = RUNTIME.read_text(encoding="utf-8").partition("\n## Exit status\n")[2]
    return {int(row["status"]): row["meaning"] for row in table(section.partition("\n## ")[0], "status")}


def test_the_docs_table_lists_every_exit_status_of_the_enum_in_order() -> None:
    table = _exit_status_table()
    assert list(table) == [status.value for status in WorkerExit]
    assert all(table.values())


def test_the_worker_errors_exit_with_the_enum_statuses() -> None:
    assert errors.WorkerError().exit_code == WorkerExit.FAILED
    assert errors.UsageError().exit_code == WorkerExit.USAGE
    assert errors.WorkerDisabled().exit_code == WorkerExit.DISABLED
    assert errors.WorkerOutdated().exit_code == WorkerExit.RESTART


def test_each_stop_reason_has_one_exit_status_and_run_raises_the_error_that_carries_it() -> None:
    from flowlane.runtime.worker import Stop, StopReason

    assert {reason: Stop(reason).exit_status for reason in StopReason} == {
        StopReason.REQUESTED: WorkerExit.STOPPED,
        StopReason.SIGNAL: WorkerExit.STOPPED,
        StopReason.CRASHED: WorkerExit.FAILED,
        StopReason.DEPRECATED: WorkerExit.RESTART,
        StopReason.OUTDATED: WorkerExit.RESTART,
        StopReason.UNSUPPORTED_WORK: WorkerExit.DISABLED,
    }
    for reason in StopReason:
        stop = Stop(reason, "why")
        try:
            stop.raise_unless_requested()
        except errors.WorkerError as raised:
            assert raised.exit_code == stop.exit_status and str(raised) == "why"
        else:
            assert stop.exit_status == WorkerExit.STOPPED
