"""A run as ``Client.get_run`` and ``Client.wait`` return it: :class:`RunState`, typed.

The SQL Core reads a run as one JSON document (``client_get_run``: the run, its steps,
tasks, attempts, wait steps and family) and the runtime adds what it waits for
(``run_waits``). Each part becomes a frozen value with the fields callers read; each keeps
the document it came from (``document``), so that :meth:`RunState.to_json` gives every
column the SQL Core returns, as it returned them (``flowlane run --format json``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

Document = Mapping[str, Any]


def _time(value: Any) -> datetime | None:
    """A time of the JSON document (ISO text), or one psycopg read (a datetime)."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class RunRecord:
    """The run itself (a row of ``flowlane.runs``)."""

    run_id: str
    flow_slug: str
    status: str
    input: Any
    output: Any
    error_message: str | None
    cancel_reason: str | None
    retry_count: int
    compensation: str | None  # a failed run's compensation: running, completed or stopped
    started_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    cancelled_at: datetime | None
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Document) -> RunRecord:
        return cls(str(doc["run_id"]), doc["flow_slug"], doc["status"], doc.get("input"), doc.get("output"),
                   doc.get("error_message"), doc.get("cancel_reason"), int(doc.get("retry_count") or 0),
                   doc.get("compensation"), _time(doc.get("started_at")), _time(doc.get("completed_at")),
                   _time(doc.get("failed_at")), _time(doc.get("cancelled_at")), doc)


@dataclass(frozen=True)
class StepState:
    """One step of the run (a row of ``flowlane.all_step_states``), in the flow's step order."""

    step_slug: str
    status: str
    output: Any
    error_message: str | None
    skip_reason: str | None
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Document) -> StepState:
        return cls(doc["step_slug"], doc["status"], doc.get("output"), doc.get("error_message"),
                   doc.get("skip_reason"), doc)


@dataclass(frozen=True)
class TaskState:
    """One task of a step (a row of ``flowlane.step_tasks``)."""

    step_slug: str
    task_index: int
    status: str
    attempts_count: int
    output: Any
    error_message: str | None
    cached: bool = False  # completed from its step's cache, without a message or a worker
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Document) -> TaskState:
        return cls(doc["step_slug"], int(doc["task_index"]), doc["status"],
                   int(doc.get("attempts_count") or 0), doc.get("output"), doc.get("error_message"),
                   bool(doc.get("cached")), doc)


@dataclass(frozen=True)
class Attempt:
    """One attempt of a task that did not complete it for good (``flowlane.task_attempts``):
    ``outcome`` retry or failed (with its error and traceback), or superseded (a rerun
    replaced its output)."""

    step_slug: str
    task_index: int
    attempt: int
    retry_round: int
    outcome: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    output: Any
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Document) -> Attempt:
        return cls(doc["step_slug"], int(doc["task_index"]), int(doc["attempt"]),
                   int(doc.get("retry_round") or 0), doc["outcome"], doc.get("error_type"),
                   doc.get("error_message"), doc.get("traceback"), doc.get("output"), doc)


@dataclass(frozen=True)
class WaitSignal:
    """The signal a wait step got: applied (``applied_at``) or kept until the step starts."""

    payload: Any
    received_at: datetime | None
    applied_at: datetime | None


@dataclass(frozen=True)
class WaitStep:
    """A wait step of the run: its state, since when it waits and when it gives up, its signal."""

    step_slug: str
    status: str
    waiting_since: datetime | None
    expires_at: datetime | None
    signal: WaitSignal | None
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Document) -> WaitStep:
        got = doc.get("signal")
        signal = None if got is None else WaitSignal(got.get("payload"), _time(got.get("received_at")),
                                                     _time(got.get("applied_at")))
        return cls(doc["step_slug"], doc["status"], _time(doc.get("waiting_since")),
                   _time(doc.get("expires_at")), signal, doc)


@dataclass(frozen=True)
class Hold:
    """One thing a run waits for (a row of the ``run_waits`` query): the run itself
    (``step_slug`` None; ``place`` its place in line for its flow's concurrency), a whole
    step (``task_index`` None) or a task."""

    run_id: str
    step_slug: str | None
    task_index: int | None
    waiting_for: str
    place: int | None
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: Document) -> Hold:
        return cls(str(row["run_id"]), row["step_slug"], row["task_index"], str(row["waiting_for"]),
                   row.get("place"), row)


@dataclass(frozen=True)
class RelatedRun:
    """Another run of the family: the parent or a child (with the step and task that
    started the child), a failure handler's run or the run it handles, a compensation's
    run or the run (and step) it compensates."""

    run_id: str | None
    flow_slug: str | None
    status: str
    step_slug: str | None = None
    task_index: int | None = None
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, doc: Document | None) -> RelatedRun | None:
        if doc is None:
            return None
        return cls(_text(doc.get("run_id")), doc.get("flow_slug"), doc["status"], doc.get("step_slug"),
                   doc.get("task_index"), doc)


def _related(docs: Any) -> tuple[RelatedRun, ...]:
    return tuple(run for run in map(RelatedRun.from_json, docs or []) if run is not None)


@dataclass(frozen=True)
class RunState:
    """A run with everything about it: its steps and tasks, its failed and superseded
    attempts, its wait steps, what it waits for (``holds``), and its family (``parent``,
    ``children``, ``failure_handler``, ``failure_of``, ``compensations``: a compensation's
    ``status`` is the compensation's, ``compensation_of``)."""

    run: RunRecord
    steps: tuple[StepState, ...]
    tasks: tuple[TaskState, ...]
    attempts: tuple[Attempt, ...]
    waits: tuple[WaitStep, ...]
    holds: tuple[Hold, ...]
    parent: RelatedRun | None
    children: tuple[RelatedRun, ...]
    failure_handler: RelatedRun | None
    failure_of: RelatedRun | None
    compensations: tuple[RelatedRun, ...]
    compensation_of: RelatedRun | None
    document: Document = field(default_factory=dict, repr=False, compare=False)

    @property
    def status(self) -> str:
        return self.run.status

    def step(self, slug: str) -> StepState | None:
        return next((s for s in self.steps if s.step_slug == slug), None)

    @classmethod
    def from_json(cls, doc: Document, holds: Sequence[Document]) -> RunState:
        return cls(
            RunRecord.from_json(doc["run"]),
            tuple(map(StepState.from_json, doc.get("steps") or [])),
            tuple(map(TaskState.from_json, doc.get("tasks") or [])),
            tuple(map(Attempt.from_json, doc.get("attempts") or [])),
            tuple(map(WaitStep.from_json, doc.get("waits") or [])),
            tuple(map(Hold.from_row, holds)),
            RelatedRun.from_json(doc.get("parent")),
            _related(doc.get("children")),
            RelatedRun.from_json(doc.get("failure_handler")),
            RelatedRun.from_json(doc.get("failure_of")),
            _related(doc.get("compensations")),
            RelatedRun.from_json(doc.get("compensation_of")),
            {**doc, "holds": list(holds)},
        )

    def to_json(self) -> dict[str, Any]:
        """The run as the SQL Core read it: ``{"run", "steps", "tasks", "attempts", "waits",
        "holds", "parent", "children", ...}`` (times as text in JSON, the holds as read)."""
        return dict(self.document)

    def __getitem__(self, key: str) -> Any:
        """Deprecated: ``state["run"]["status"]`` is ``state.run.status``; ``to_json()``
        gives the whole document."""
        warnings.warn("a run state read by key is deprecated: use its fields (state.run.status) or "
                      "state.to_json()", DeprecationWarning, stacklevel=2)
        return self.document[key]
