"""``RunState``: a run's JSON document (as ``client_get_run`` reads it) as typed values, and
back as the same document (``flowlane run --format json``), every column included."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from flowlane.runtime.run_state import RunState

RUN = "6f2ab472-0000-4000-8000-000000000001"
CHILD = "6f2ab472-0000-4000-8000-000000000002"
DOCUMENT: dict[str, Any] = {
    "run": {"run_id": RUN, "flow_slug": "orders_v2", "status": "started", "input": {"n": 1},
            "output": None, "error_message": None, "cancel_reason": None, "retry_count": 1,
            "compensation": None, "started_at": "2026-05-01T12:00:03.5+00:00", "completed_at": None,
            "failed_at": None, "cancelled_at": None, "idempotency_key": "invoice-9"},
    "steps": [{"step_slug": "prepare", "status": "completed", "output": {"ok": True},
               "error_message": None, "skip_reason": None, "remaining_tasks": 0},
              {"step_slug": "approve", "status": "started", "output": None, "error_message": None,
               "skip_reason": None, "remaining_tasks": 1}],
    "tasks": [{"step_slug": "prepare", "task_index": 0, "status": "completed", "attempts_count": 2,
               "output": {"ok": True}, "error_message": None, "queue_name": "orders"}],
    "attempts": [{"step_slug": "prepare", "task_index": 0, "attempt": 1, "retry_round": 0,
                  "outcome": "retry", "error_type": "ValueError", "error_message": "ValueError: no",
                  "traceback": "Traceback ...", "output": None, "worker_id": str(uuid.UUID(int=7))}],
    "waits": [{"step_slug": "approve", "status": "started", "waiting_since": "2026-05-01T12:00:04+00:00",
               "expires_at": None, "timeout": None,
               "signal": {"payload": {"by": "ada"}, "received_at": "2026-05-01T12:00:01+00:00",
                          "applied_at": None}}],
    "parent": None,
    "children": [{"run_id": CHILD, "flow_slug": "each_v1", "status": "started", "step_slug": "fan",
                  "task_index": 0, "started_at": "2026-05-01T12:00:05+00:00"}],
    "failure_handler": None, "failure_of": None, "compensations": [], "compensation_of": None,
}
HOLDS = [{"run_id": uuid.UUID(RUN), "step_slug": "approve", "task_index": None,
          "waiting_for": "signal approve since 2026-05-01 12:00:04 UTC", "place": None}]


def test_a_run_document_reads_as_typed_values() -> None:
    state = RunState.from_json(DOCUMENT, HOLDS)
    assert (state.run.run_id, state.run.status, state.run.retry_count) == (RUN, "started", 1)
    assert state.run.started_at == datetime(2026, 5, 1, 12, 0, 3, 500000, tzinfo=UTC)
    assert [s.step_slug for s in state.steps] == ["prepare", "approve"]
    approve = state.step("approve")
    assert approve is not None and approve.status == "started" and state.step("ship") is None
    assert state.tasks[0].attempts_count == 2 and state.attempts[0].traceback == "Traceback ..."
    signal = state.waits[0].signal
    assert signal is not None and signal.payload == {"by": "ada"} and signal.applied_at is None
    assert state.holds[0].run_id == RUN and state.holds[0].step_slug == "approve"
    assert [(c.run_id, c.step_slug, c.task_index) for c in state.children] == [(CHILD, "fan", 0)]
    assert state.parent is None and state.compensations == ()


def test_to_json_gives_the_document_back_with_every_column_and_the_holds() -> None:
    state = RunState.from_json(DOCUMENT, HOLDS)
    assert state.to_json() == {**DOCUMENT, "holds": HOLDS}
    assert state.to_json()["run"]["idempotency_key"] == "invoice-9"  # no typed field for it


def test_reading_a_run_state_by_key_still_works_and_warns() -> None:
    state = RunState.from_json(DOCUMENT, HOLDS)
    with pytest.warns(DeprecationWarning, match=r"state\.run\.status"):
        assert state["run"]["status"] == "started"
