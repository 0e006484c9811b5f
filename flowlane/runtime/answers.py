"""What the client's operations answer, besides a run's state (``run_state.RunState``): a
start (:class:`Started`), a run changed (:class:`RunChange`), a signal (:class:`SignalSent`),
the runs listed (:class:`RunSummary`, :class:`StuckRun`), a bulk retry or cancel
(:class:`RunFilter` in, :class:`Repair` out), schedules, triggers and webhooks, and a wait
that timed out (:class:`RunTimeout`). Each is a frozen value read from the rows of one query;
``as_dict`` is its JSON form (the CLI's ``--format json``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flowlane import errors


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    flow_slug: str
    status: str
    remaining_steps: int
    started_at: datetime
    completed_at: datetime | None
    failed_at: datetime | None
    cancelled_at: datetime | None = None
    start_at: datetime | None = None  # a delayed start: when the run begins (or began)
    held: bool = False  # waiting for a slot of its flow's concurrency limit
    waiting_for: str | None = None  # the first thing the run waits for (the `run_waits` query)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "flow_slug": self.flow_slug,
            "status": self.status,
            "remaining_steps": self.remaining_steps,
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
            "failed_at": _iso(self.failed_at),
            "cancelled_at": _iso(self.cancelled_at),
            "start_at": _iso(self.start_at),
            "held": self.held,
            "waiting_for": self.waiting_for,
        }

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> RunSummary:
        return cls(
            run_id=str(r["run_id"]),
            flow_slug=r["flow_slug"],
            status=r["status"],
            remaining_steps=r["remaining_steps"],
            started_at=r["started_at"],
            completed_at=r["completed_at"],
            failed_at=r["failed_at"],
            cancelled_at=r["cancelled_at"],
            start_at=r.get("start_at"),
            held=bool(r.get("held")),
            waiting_for=r.get("waiting_for"),
        )


@dataclass(frozen=True)
class Started:
    """What a start did: the run (an alias: of its active version), and whether a keyed
    start found an earlier run instead of creating one (a debounced start: the pending run of
    its key, which begins with the last start's input)."""

    run_id: str
    flow_slug: str
    status: str  # started, or waiting for its start time
    start_at: datetime | None
    existed: bool
    debounced: bool = False  # waiting for its debounce key's starts to pause

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "flow_slug": self.flow_slug, "status": self.status,
                "start_at": _iso(self.start_at), "existed": self.existed, "debounced": self.debounced}


@dataclass(frozen=True)
class RunChange:
    """A run as ``cancel`` or ``retry`` left it."""

    run_id: str
    flow_slug: str
    status: str
    cancel_reason: str | None
    retry_count: int
    compensation: str | None  # a failed run's compensation: running, completed or stopped

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> RunChange:
        return cls(str(r["run_id"]), r["flow_slug"], r["status"], r["cancel_reason"], int(r["retry_count"]),
                   r.get("compensation"))


@dataclass(frozen=True)
class SignalSent:
    """A signal the SQL Core took: applied (its wait step completed with ``payload``) or,
    ``applied_at`` None, kept until the step starts."""

    run_id: str
    step_slug: str
    payload: Any
    received_at: datetime
    applied_at: datetime | None

    @property
    def applied(self) -> bool:
        return self.applied_at is not None

    @property
    def by(self) -> str | None:
        """Who sent it (the payload's ``by``), when it says."""
        by = self.payload.get("by") if isinstance(self.payload, dict) else None
        return None if by is None else str(by)


@dataclass(frozen=True)
class RunFilter:
    """Which runs a bulk retry or cancel takes: of a flow or alias (every version), failed in a
    step, with an error type among the failed attempts of their last round, with a text in
    their error (any case), started at or after ``since`` and before ``until``."""

    flow: str | None = None
    step: str | None = None
    error_type: str | None = None
    error: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in self.__dataclass_fields__)


@dataclass(frozen=True)
class MatchedRun:
    """A run a bulk retry or cancel took (``client_matching_runs``); its error cut to 200
    characters."""

    run_id: str
    flow_slug: str
    status: str
    started_at: datetime
    error_message: str | None

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> MatchedRun:
        return cls(str(r["run_id"]), r["flow_slug"], r["status"], r["started_at"], r["error_message"])

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "flow_slug": self.flow_slug, "status": self.status,
                "started_at": _iso(self.started_at), "error_message": self.error_message}


@dataclass(frozen=True)
class Repair:
    """What a bulk retry or cancel did (or, in a dry run, would do): the runs that matched, the
    runs it changed (a run that changed meanwhile is passed over), in how many batches (one
    transaction each), and the first runs matched."""

    action: str
    matched: int
    changed: int
    batches: int
    sample: list[MatchedRun]
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "matched": self.matched, "changed": self.changed,
                "batches": self.batches, "dry_run": self.dry_run,
                "sample": [r.as_dict() for r in self.sample]}


@dataclass(frozen=True)
class ScheduleSummary:
    """A schedule as ``flowlane schedules`` lists it."""

    name: str
    flow: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    next_slot: datetime
    next_local: str  # the next firing's wall time in the schedule's zone
    last_slot: datetime | None
    last_run_id: str | None
    last_status: str | None
    paused: bool
    paused_reason: str | None

    @property
    def timing(self) -> str:
        return f"cron {self.cron}" if self.cron is not None else f"every {self.every_seconds}s"

    @property
    def to_the_second(self) -> bool:
        """Its firings fall between whole minutes (an interval that is not a number of minutes)."""
        return self.every_seconds is not None and self.every_seconds % 60 != 0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flow": self.flow, "cron": self.cron,
                "every_seconds": self.every_seconds, "timezone": self.timezone,
                "next_slot": _iso(self.next_slot), "next_local": self.next_local,
                "last_slot": _iso(self.last_slot), "last_run_id": self.last_run_id,
                "last_status": self.last_status, "paused": self.paused,
                "paused_reason": self.paused_reason}

    @classmethod
    def from_row(cls, r: dict[str, Any]) -> ScheduleSummary:
        return cls(r["schedule_name"], r["flow_name"], r["cron"], r["every_seconds"], r["timezone"],
                   r["next_slot"], r["next_local"], r["last_slot"],
                   str(r["last_run_id"]) if r["last_run_id"] else None, r["last_status"],
                   r["paused"], r["paused_reason"])


@dataclass(frozen=True)
class TriggerActivity:
    """A trigger (``flowlane.trigger_activity``): what it listens to, the runs it started (in
    all, in the last day, the latest) and its refusals (how many, the latest)."""

    trigger_name: str
    flow_name: str
    table_name: str
    events: list[str]
    on_refused: str
    runs: int
    runs_last_day: int
    last_run_at: datetime | None
    refusals: int
    last_error: str | None
    last_error_at: datetime | None


@dataclass(frozen=True)
class WebhookActivity:
    """What a webhook did (``client_webhook_activity``): the runs it started and the signals it
    sent, in all and in the last day, and when it last did either."""

    webhook_name: str
    runs: int
    runs_last_day: int
    signals: int
    signals_last_day: int
    last_at: datetime | None


class RunTimeout(errors.FlowlaneError):
    """A run did not end within the time given to ``wait``: ``run_id``, the ``status`` it
    still had and the ``timeout`` in seconds."""

    def __init__(self, run_id: str, status: str, timeout: float) -> None:
        super().__init__(f"run {run_id} is still {status} after {timeout:g}s",
                         hint=f"it keeps running; `flowlane run {run_id}` shows where it is")
        self.run_id, self.status, self.timeout = run_id, status, timeout


@dataclass(frozen=True)
class StuckRun:
    """A started run that no task can move (``flowlane.stuck_runs()``)."""

    run_id: str
    flow_slug: str
    started_at: datetime
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "flow_slug": self.flow_slug,
                "started_at": _iso(self.started_at), "reason": self.reason}
