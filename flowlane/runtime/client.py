"""Start runs, operate on them (cancel, retry, wait) and inspect them.

:class:`Client` is synchronous, :class:`AsyncClient` the same API for asyncio, and both
come from one definition: each operation is written once, in :class:`Operations`, as a
*plan*: a generator that validates its arguments, yields what it needs from the database
(:class:`Fetch` a named query, :class:`Atomic` one transaction for the rest of the
operation, :class:`Listen` and :class:`Notified` for run-end notifications) and shapes
the answers into results and errors. The two clients only carry those requests out, one
blocking, one awaiting: each public method is the plan's signature written out, handing its
arguments to the plan, with the plan's docstring (tests/runtime/test_client_parity.py holds
the three signatures equal). What the operations return are typed values
(``flowlane/runtime/answers.py``, and ``run_state.RunState`` for a run), importable from here.

Every operation on a run takes its id or a unique prefix of it (``client_runs_by_prefix``
finds the run; a worker role, which may not read the runs table, passes whole ids).

``wait`` listens on ``flowlane_run_finished`` through ``flowlane.listen_run_finished``
(the SQL Core notifies a run's end only while a session listens that way) and
re-reads the run only when woken, with a slow fallback poll in case a
notification cannot arrive. Through a transaction-mode pooler (a DSN with
``pooler=transaction``) it does not listen, since a LISTEN and the listeners' session lock
would stay behind in whichever server session ran them: it re-reads the run every
``POOLER_POLL_SECONDS`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import re
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import psycopg
from psycopg.rows import dict_row

from flowlane import errors
from flowlane.core import db
from flowlane.core.queries import query
from flowlane.runtime import limits
from flowlane.runtime.answers import (
    MatchedRun,
    Repair,
    RunChange,
    RunFilter,
    RunSummary,
    RunTimeout,
    ScheduleSummary,
    SignalSent,
    Started,
    StuckRun,
    TriggerActivity,
    WebhookActivity,
)
from flowlane.runtime.limits import MAX_INPUT_BYTES, STATUSES, TERMINAL
from flowlane.runtime.migration_hint import missing_core_hint
from flowlane.runtime.report import first_waits
from flowlane.runtime.run_state import RunState
from flowlane.runtime.tracing import current_traceparent

__all__ = [  # with the answers of its operations, which applications import from here too
    "AsyncClient", "Client", "MatchedRun", "Operations", "Repair", "RunChange", "RunFilter", "RunState",
    "RunSummary", "RunTimeout", "ScheduleSummary", "SignalSent", "Started", "StuckRun",
    "TriggerActivity", "WebhookActivity", "encode_input", "only_run", "prefix_range",
]

FALLBACK_POLL_SECONDS = 5.0
POOLER_POLL_SECONDS = 0.2  # wait's re-reads through a transaction-mode pooler (no LISTEN)


# what a bulk retry or cancel takes: the states it can change, and the function per batch
REPAIRS: dict[str, tuple[tuple[str, ...], str]] = {
    "retry": (("failed",), "client_retry_runs"),
    "cancel": (("started", "waiting"), "client_cancel_runs"),
}
REPAIR_BATCH = 100
MAX_REPAIR_BATCH = 1000  # what flowlane.retry_runs and cancel_runs take in one call
DRY_RUN_PAGE = 1000


StartAt = datetime | timedelta | None  # a time, or a delay on the database's clock


def _priority(priority: int | None) -> int | None:
    """A run's priority, checked here as the SQL Core checks it (a clear error, no round
    trip)."""
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or not limits.MIN_PRIORITY <= priority <= limits.MAX_PRIORITY:
        raise errors.UsageError(f"priority must be an integer from {limits.MIN_PRIORITY} to "
                                f"{limits.MAX_PRIORITY}, not {priority!r}",
                                hint="higher priorities are claimed first; the default is the "
                                "flow's `priority` (0 when it has none)")
    return priority


def _start_time(start_at: StartAt) -> dict[str, Any]:
    """The query parameters of a start time (an aware datetime or a non-negative delay)."""
    if isinstance(start_at, timedelta):
        if start_at < timedelta(0):
            raise errors.UsageError(f"a start delay is not negative: {start_at}")
        return {"start_at": None, "delay": start_at.total_seconds()}
    if start_at is not None and start_at.tzinfo is None:
        raise errors.UsageError(f"start_at {start_at.isoformat()} has no time zone",
                                hint="pass an aware datetime, e.g. datetime.now(timezone.utc)")
    return {"start_at": start_at, "delay": None}


# start_flow's refusals of the caller's input (not of the database state)
_START_HINTS = {
    "22023": "this flow's first step maps over the run input: pass a JSON array, e.g. --input '[1, 2, 3]'",
    "23505": "a run id names one run: pass another --run-id, or none for a new one",
}
_NO_RUN = "P0002"
_WRONG_STATE = "55000"
_BAD_ARGUMENT = "22023"


def _run_id(text: str) -> str:
    """``text`` as a canonical UUID string; a usage error when it is not one."""
    try:
        return str(uuid.UUID(str(text)))
    except ValueError:
        raise errors.UsageError(
            f"{text!r} is not a run id (expected a UUID)",
            hint="`flowlane runs` lists run ids",
        ) from None


MIN_PREFIX = 4  # hex digits of the shortest run id prefix taken
PREFIX_CANDIDATES = 5  # the candidates an ambiguous prefix lists


def prefix_range(text: str) -> tuple[str, str]:
    """The lowest and the highest UUID that start with the run id prefix ``text``."""
    digits = str(text).strip().lower().replace("-", "")
    if len(digits) < MIN_PREFIX or len(digits) >= 32 or any(c not in "0123456789abcdef" for c in digits):
        raise errors.UsageError(
            f"{text!r} is not a run id (expected a UUID, or at least its first {MIN_PREFIX} "
            "hex digits)", hint="`flowlane runs` lists run ids") from None
    return (str(uuid.UUID(digits.ljust(32, "0"))), str(uuid.UUID(digits.ljust(32, "f"))))


def only_run(rows: list[dict[str, Any]], prefix: str) -> str:
    """The one run a prefix names; an error naming the candidates when it names several."""
    if not rows:
        raise errors.NotFound(f"no run starts with {prefix}", hint="`flowlane runs` lists run ids")
    if len(rows) > 1:
        shown = rows[:PREFIX_CANDIDATES - 1]
        more = ", ..." if len(rows) > len(shown) else ""
        candidates = ", ".join(f"{r['run_id']} ({r['flow_slug']}, {r['status']})" for r in shown)
        raise errors.NotFound(f"run id prefix {prefix} is ambiguous: {candidates}{more}",
                              hint="give more of the run id")
    return str(rows[0]["run_id"])


def _resolve_run(text: str) -> Plan[str]:
    """The run id ``text`` stands for: a UUID as it is, a prefix (as `flowlane runs` and the
    console cut ids) the one run whose id starts with it."""
    try:
        return _run_id(text)
    except errors.UsageError:
        low, high = prefix_range(text)
    rows = yield Fetch("client_runs_by_prefix", "cannot find the run",
                       {"low": low, "high": high, "limit": PREFIX_CANDIDATES})
    return only_run(rows, str(text).strip())


def encode_input(input: Any, what: str = "the run input") -> str:
    """The run input (or a signal's payload: ``what``) as JSON text; a usage error when it
    cannot be one or is too large."""
    if limits.depth_exceeds(input):  # before json.dumps, which recurses (RecursionError)
        raise errors.UsageError(
            f"{what} is nested deeper than {limits.MAX_DEPTH} levels (the limit)",
            hint="flatten the input, or pass a reference to the data instead")
    try:
        payload = json.dumps({} if input is None else input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise errors.UsageError(f"{what} is not JSON-serialisable: {exc}") from exc
    size = len(payload.encode("utf-8"))
    if size > MAX_INPUT_BYTES:
        raise errors.UsageError(
            f"{what} is {size} bytes of JSON, over the limit of {MAX_INPUT_BYTES} bytes",
            hint="pass a reference (a URL, a table key, a file path) instead of the data itself",
        )
    return payload


START_CHUNK = 500  # runs per start_flows call


def _chunks(inputs: Iterable[Any], size: int) -> Iterator[tuple[int, list[str]]]:
    """(offset of the chunk's first input, the chunk's inputs as JSON text)."""
    chunk: list[str] = []
    offset = 0
    for position, item in enumerate(inputs):
        try:
            chunk.append(encode_input(item))
        except errors.UsageError as exc:
            raise errors.UsageError(f"input {position}: {exc}", hint=exc.hint) from exc
        if len(chunk) == size:
            yield offset, chunk
            offset, chunk = position + 1, []
    if chunk:
        yield offset, chunk


def _chunk_error(exc: errors.DatabaseError, offset: int) -> errors.FlowlaneError:
    """start_flows names a position within its chunk: say where the chunk starts."""
    where = f" (positions count from input {offset}, the first of its chunk)" if offset else ""
    return _start_error(
        type(exc)(
            f"{exc}{where}; no run was started",
            hint=exc.hint,
            detail=exc.detail,
            sqlstate=exc.sqlstate,
        ),
        offset,
    )


# how the SQL Core names an input its flow's input_schema refuses (the position only when it
# checked more than one input), and the rule in its detail
_SCHEMA_REFUSAL = re.compile(r"the run input(?: (?P<position>\d+))? does not match the flow's "
                             r"input_schema: (?P<path>[^:]*): ")
_SCHEMA_RULE = re.compile(r"the rule at input_schema(?P<rule>\S*) of ")


def _start_error(exc: errors.DatabaseError, offset: int | None = None) -> errors.FlowlaneError:
    """The error of a refused start, with what refused it as data; ``offset``: a start of
    many runs, the position of the first input of the refused chunk."""
    hint = _START_HINTS.get(exc.sqlstate or "")
    if hint is None:
        return exc
    # the database's own hint first (e.g. the input limits); its detail (e.g. the rule of an
    # input_schema that refused the input) stays in the message
    message = f"{exc}\n{exc.detail}" if exc.detail else str(exc)
    refusal = _SCHEMA_REFUSAL.search(str(exc))
    rule = _SCHEMA_RULE.search(exc.detail or "") if refusal else None
    return errors.InputRefused(
        message, hint=exc.hint or hint, detail=exc.detail, sqlstate=exc.sqlstate,
        position=offset + int(refusal["position"] or 0) if refusal and offset is not None else None,
        path=refusal["path"] if refusal else None,
        rule=(rule["rule"] or "/") if rule else None,
    )


def _operation_error(exc: errors.DatabaseError, run_id: str) -> errors.FlowlaneError:
    if exc.sqlstate == _NO_RUN:
        return errors.NotFound(f"no run {run_id}", hint="`flowlane runs` lists recent runs")
    if exc.sqlstate in (_WRONG_STATE, _BAD_ARGUMENT):
        return errors.FlowlaneError(
            str(exc).split(": ", 1)[-1], hint=exc.hint or f"`flowlane run {run_id}` shows its state and steps"
        )
    return exc


# what flowlane.signal refuses with (no run or step, not a wait step, a finished run or
# step or a second signal, a payload its step cannot give, a null argument)
_SIGNAL_REFUSALS = frozenset({_NO_RUN, "42809", _WRONG_STATE, "22023", "22004"})


def _signal_error(exc: errors.DatabaseError, run_id: str) -> errors.FlowlaneError:
    if exc.sqlstate not in _SIGNAL_REFUSALS:
        return exc
    no_run = exc.sqlstate == _NO_RUN and not exc.hint  # no step of the run: the hint names them
    return errors.SignalRefused(
        str(exc).replace(": signal: ", ": ", 1),
        hint=exc.hint or ("`flowlane runs` lists recent runs" if no_run
                          else f"`flowlane run {run_id}` shows its wait steps and their signals"),
        detail=exc.detail, sqlstate=exc.sqlstate)


def _signed(payload: Any, by: str | None) -> Any:
    """The signal payload with its sender as ``by`` (when one is given)."""
    if by is None:
        return payload
    body = {} if payload is None else payload
    if not isinstance(body, dict):
        raise errors.UsageError("a signal that names its sender (by) takes a JSON object payload",
                                hint='e.g. --data \'{"approved": true}\' --by ada')
    if body.get("by", by) != by:
        raise errors.UsageError(f"the payload says by {body['by']!r} and the sender is {by!r}",
                                hint="name the sender once")
    return {**body, "by": by}


def _run_document(rows: list[dict[str, Any]], run_id: str) -> dict[str, Any]:
    if not rows or rows[0]["run"] is None:
        raise errors.NotFound(f"no run {run_id}", hint="`flowlane runs` lists recent runs")
    document: dict[str, Any] = rows[0]["run"]
    return document


def _trace_parent(flow: str, value: str, *, local: bool) -> Fetch:
    """Runs started next remember ``value`` as their trace context (``flowlane.traceparent``)."""
    return Fetch("client_trace_parent", f"cannot start {flow}", {"traceparent": value, "local": local})


def _flow_filter(rows: list[dict[str, Any]], flow: str) -> list[str]:
    """The concrete slugs a ``--flow`` name stands for; unknown names get a suggestion."""
    row = rows[0]
    if row["flows"]:
        return list(row["flows"])
    raise errors.NotFound(f"no flow or alias `{flow}` in the database",
                          hint=_unknown_flow_hint(flow, rows))


def _repair_kind(action: str) -> tuple[tuple[str, ...], str]:
    if action not in REPAIRS:
        raise errors.UsageError(f"unknown bulk action {action!r}", hint="retry or cancel")
    return REPAIRS[action]


def _repair_statuses(action: str, allowed: tuple[str, ...],
                     statuses: Iterable[str] | None) -> tuple[str, ...]:
    chosen = tuple(statuses) if statuses is not None else allowed
    wrong = [s for s in chosen if s not in allowed]
    if wrong or not chosen:
        raise errors.UsageError(f"a bulk {action} takes runs that are {' or '.join(allowed)}, not "
                                f"{', '.join(wrong) or 'none'}")
    return chosen


def _unknown_flow_hint(flow: str, rows: list[dict[str, Any]]) -> str:
    """The close names (``client_flow_filter``'s ``known``), else how a flow gets there."""
    known: list[str] = list(rows[0]["known"] or []) if rows else []
    close = difflib.get_close_matches(flow, known, n=3)
    return (f"did you mean {', '.join(close)}?" if close
            else "`flowlane plan` lists the flows; a new flow needs `flowlane apply` first")


def _check_page(rows: list[dict[str, Any]], before: str) -> None:
    if not rows[0]["found"]:
        raise errors.NotFound(f"--before: no run {before}", hint="`flowlane runs` lists run ids")


def _list_params(
    limit: int, flows: list[str] | None, status: str | None, before: str | None,
    since: datetime | None, parent: str | None = None,
) -> dict[str, Any]:
    if limit < 0:
        raise errors.UsageError(f"the run limit must be 0 or more, not {limit}")
    if status is not None and status not in STATUSES:
        raise errors.UsageError(f"unknown run status {status!r}", hint=f"one of {', '.join(STATUSES)}")
    return {
        "limit": limit,
        "flows": flows,
        "status": status,
        "before": _run_id(before) if before else None,
        "since": since,
        "parent": _run_id(parent) if parent else None,
    }


# -- what a plan asks of its client ------------------------------------------------

T = TypeVar("T")
WAITING = "cannot wait for the run"


@dataclass(frozen=True)
class Fetch:
    """Run the named query (``flowlane/core/sql/runtime.sql``); the plan receives its rows.
    An error says ``action`` first, e.g. "cannot cancel: ..."."""

    name: str
    action: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Atomic:
    """The rest of the operation runs in one transaction: all of it or nothing."""

    action: str


@dataclass(frozen=True)
class Listen:
    """Listen for ended runs for the rest of the operation; the plan receives a listener."""


@dataclass(frozen=True)
class Notified:
    """Wait up to ``timeout`` seconds for ``listener`` to hear that ``run_id`` ended."""

    listener: Any
    run_id: str
    timeout: float


Request = Fetch | Atomic | Listen | Notified
Plan = Generator[Request, Any, T]  # yields requests, receives their answers, returns T


@dataclass(frozen=True)
class _PlanResult(Generic[T]):
    """What a plan returned: the operation's result."""

    value: T


def _advance(plan: Plan[T], answer: Any, failure: Exception | None) -> Request | _PlanResult[T]:
    """The plan's next request after ``answer`` (or after ``failure`` raised where it
    waits, for it to turn into its own error), or its result."""
    try:
        return plan.throw(failure) if failure is not None else plan.send(answer)
    except StopIteration as done:
        return _PlanResult(done.value)


# -- every operation, once ---------------------------------------------------------


class Operations:
    """The plans of the clients' public methods (``Client.cancel`` carries out ``cancel``)."""

    @staticmethod
    def start(flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
              start_at: StartAt = None, priority: int | None = None,
              origin: Mapping[str, str] | None = None) -> Plan[Started]:
        """Start a run of a flow or an alias (its active version), now or at ``start_at``;
        return what the start did (:class:`Started`: the run id, the concrete flow, its
        status, its start time, ``existed``). With ``key`` (or the flow's dedup key) a second
        start with the same (name, key) returns the first run (``existed``). ``priority``
        (default: the flow's) orders its tasks' claims: higher first, FIFO within one.
        ``origin``: what the run records as having started it, for a server that starts runs
        on others' behalf (the webhook endpoint: ``{"webhook": name, "delivery": id}``)."""
        payload = encode_input(input)
        run_id = _run_id(run_id) if run_id is not None else None
        params = {"flow": flow, "input": payload, "run_id": run_id, "key": key,
                  "priority": _priority(priority), **_start_time(start_at)}
        if origin is not None:  # for the start's transaction only
            yield Atomic(f"cannot start {flow}")
            yield Fetch("client_start_origin", f"cannot start {flow}",
                        {"origin": json.dumps(dict(origin), ensure_ascii=False)})
        trace_parent = current_traceparent()
        if trace_parent:  # the connection is in autocommit: set for the session, then reset
            yield _trace_parent(flow, trace_parent, local=False)
        try:
            rows = yield Fetch("client_start_flow", f"cannot start {flow}", params)
        except errors.DatabaseError as exc:
            if exc.sqlstate == _NO_RUN:  # no flow or alias of that name: name the close ones
                known = yield Fetch("client_flow_filter", "cannot list flows", {"flow": flow})
                raise type(exc)(str(exc), hint=_unknown_flow_hint(flow, known), detail=exc.detail,
                                sqlstate=exc.sqlstate) from exc
            raise _start_error(exc) from exc
        finally:
            if trace_parent:
                yield _trace_parent(flow, "", local=False)
        if not rows:
            raise errors.DatabaseError(f"start_flow({flow!r}) returned no run")
        row = rows[0]
        return Started(str(row["run_id"]), str(row["flow_slug"]), row["status"], row["start_at"],
                       bool(row["existed"]), bool(row["debounced"]))

    @staticmethod
    def begin(flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
              start_at: StartAt = None, priority: int | None = None,
              origin: Mapping[str, str] | None = None) -> Plan[Started]:
        """Deprecated: ``start`` (the same)."""
        _deprecated("begin", "start(...)")
        return (yield from Operations.start(flow, input, run_id=run_id, key=key, start_at=start_at,
                                            priority=priority, origin=origin))

    @staticmethod
    def start_run(flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
                  start_at: StartAt = None, priority: int | None = None) -> Plan[str]:
        """Deprecated: ``start(...).run_id``."""
        _deprecated("start_run", "start(...).run_id")
        started = yield from Operations.start(flow, input, run_id=run_id, key=key, start_at=start_at,
                                              priority=priority)
        return started.run_id

    @staticmethod
    def start_runs(flow: str, inputs: Iterable[Any], *, chunk_size: int = START_CHUNK,
                   start_at: StartAt = None, priority: int | None = None) -> Plan[list[str]]:
        """Start one run per input (any iterable, consumed in chunks of ``chunk_size``
        through ``flowlane.start_flows``); return the run ids in input order. All or
        nothing: the chunks share one transaction, so a bad input starts no run."""
        if chunk_size < 1:
            raise errors.UsageError(f"chunk_size must be at least 1, not {chunk_size}")
        yield Atomic(f"cannot start {flow}")
        trace_parent = current_traceparent()
        if trace_parent:
            yield _trace_parent(flow, trace_parent, local=True)
        run_ids: list[str] = []
        for offset, chunk in _chunks(inputs, chunk_size):
            try:
                rows = yield Fetch("client_start_flows", f"cannot start {flow}",
                                   {"flow": flow, "inputs": chunk, "priority": _priority(priority),
                                    **_start_time(start_at)})
            except errors.DatabaseError as exc:
                raise _chunk_error(exc, offset) from exc
            run_ids.extend(str(r["run_id"]) for r in rows)
        return run_ids

    @staticmethod
    def cancel(run_id: str, *, reason: str | None = None) -> Plan[RunChange]:
        """Cancel a started run (idempotent for a cancelled one); return it as it is now."""
        run_id = yield from _resolve_run(run_id)
        try:
            rows = yield Fetch("client_cancel_run", "cannot cancel",
                               {"run_id": run_id, "reason": reason})
        except errors.DatabaseError as exc:
            raise _operation_error(exc, run_id) from exc
        return RunChange.from_row(rows[0])

    @staticmethod
    def retry(run_id: str, *, from_step: str | None = None,
              compensation: bool = False) -> Plan[RunChange]:
        """Resume a failed run from its failed steps with a fresh attempt budget; with
        ``from_step``, a failed or completed run reruns that step and every step that depends
        on it (the other steps keep their outputs, the attempt history is kept); with
        ``compensation``, a failed run's stopped compensation resumes (its failed
        compensations are retried and the rest follow)."""
        run_id = yield from _resolve_run(run_id)
        try:
            if compensation:
                if from_step is not None:
                    raise errors.UsageError("a compensation is resumed whole, not from a step")
                rows = yield Fetch("client_retry_compensation", "cannot resume the compensation",
                                   {"run_id": run_id})
            elif from_step is None:
                rows = yield Fetch("client_retry_run", "cannot retry", {"run_id": run_id})
            else:
                rows = yield Fetch("client_retry_run_from", "cannot retry",
                                   {"run_id": run_id, "step_slug": from_step})
        except errors.DatabaseError as exc:
            raise _operation_error(exc, run_id) from exc
        return RunChange.from_row(rows[0])

    @staticmethod
    def repair(action: str, where: RunFilter, *, dry_run: bool = False, batch_size: int = REPAIR_BATCH,
               statuses: Iterable[str] | None = None, reason: str | None = None,
               sample_size: int = 10) -> Plan[Repair]:
        """Retry (``action="retry"``: failed runs) or cancel (``"cancel"``: started and waiting
        runs, or those of ``statuses``) every run ``where`` matches, oldest first, in batches of
        ``batch_size`` runs, each its own short transaction; runs started after the call began
        are left alone. ``dry_run`` changes nothing and counts them."""
        allowed, function = _repair_kind(action)
        chosen = _repair_statuses(action, allowed, statuses)
        if not 1 <= batch_size <= MAX_REPAIR_BATCH:
            raise errors.UsageError(f"the batch size is 1 to {MAX_REPAIR_BATCH} runs, not {batch_size}")
        if where.is_empty():
            raise errors.UsageError(f"a bulk {action} needs a filter",
                                    hint="--flow, --step, --error-type, --error, --since or --until")
        flows = (yield from Operations.flows_named(where.flow)) if where.flow else None
        until = where.until or (yield Fetch("client_now", "cannot read the time"))[0]["now"]
        params = {"statuses": list(chosen), "flows": flows, "since": where.since, "until": until,
                  "step": where.step, "error_type": where.error_type, "error": where.error,
                  "limit": DRY_RUN_PAGE if dry_run else batch_size, "after_at": None, "after_id": None}
        matched, changed, batches = 0, 0, 0
        sample: list[MatchedRun] = []
        while rows := (yield Fetch("client_matching_runs", f"cannot {action} runs", params)):
            matched += len(rows)
            sample.extend(map(MatchedRun.from_row, rows[: max(0, sample_size - len(sample))]))
            if not dry_run:
                done = yield Fetch(function, f"cannot {action} runs",
                                   {"run_ids": [r["run_id"] for r in rows], "reason": reason})
                changed += len(done)
                batches += 1
            params = {**params, "after_at": rows[-1]["started_at"], "after_id": rows[-1]["run_id"]}
        return Repair(action, matched, changed, batches, sample, dry_run)

    @staticmethod
    def schedules() -> Plan[list[ScheduleSummary]]:
        """Every schedule with its next firing, its last run and whether it is paused."""
        rows = yield Fetch("client_schedules", "cannot list schedules")
        return [ScheduleSummary.from_row(r) for r in rows]

    @staticmethod
    def triggers() -> Plan[list[TriggerActivity]]:
        """Every trigger (`kind: trigger`) with what it started and its latest refusal."""
        rows = yield Fetch("client_triggers", "cannot list triggers")
        return [TriggerActivity(**r) for r in rows]

    @staticmethod
    def webhook_activity() -> Plan[dict[str, WebhookActivity]]:
        """By webhook name: the runs it started and the signals it sent (in all, in the last
        day) and when it last did either. Webhooks are read from the YAML, not the database:
        a name here is one that started something."""
        rows = yield Fetch("client_webhook_activity", "cannot list what webhooks started")
        return {str(r["webhook_name"]): WebhookActivity(**r) for r in rows}

    @staticmethod
    def pause_schedule(name: str, *, reason: str | None = None) -> Plan[None]:
        """Stop a schedule firing until resumed (an operator's override: apply keeps it)."""
        yield from _pause(name, True, reason)

    @staticmethod
    def resume_schedule(name: str) -> Plan[None]:
        """Fire a paused schedule again, from its next slot (missed slots are not caught up)."""
        yield from _pause(name, False, None)

    @staticmethod
    def trigger_schedule(name: str, input: Any = None) -> Plan[str]:
        """Start a run of the schedule now (``input``: instead of the schedule's); its id."""
        payload = None if input is None else encode_input(input)
        try:
            rows = yield Fetch("client_trigger_schedule", f"cannot trigger schedule {name}",
                               {"name": name, "input": payload})
        except errors.DatabaseError as exc:
            raise _start_error(exc) from exc
        return str(rows[0]["run_id"])

    @staticmethod
    def signal(run_id: str, step: str, payload: Any = None, *, by: str | None = None
               ) -> Plan[SignalSent]:
        """Send a signal to wait step ``step`` of a run: it completes the step with
        ``payload`` (default ``{}``) as its output, or is kept until the step starts.
        ``by`` names the sender: the payload's ``by`` (the payload is then a JSON object).
        Returns the signal (:class:`SignalSent`; not ``applied``: kept). Raises
        :class:`flowlane.errors.SignalRefused` when the SQL Core refuses it (nothing changed)."""
        run_id = yield from _resolve_run(run_id)
        body = encode_input(_signed(payload, by), "the signal payload")
        try:
            rows = yield Fetch("client_signal", f"cannot signal {step}",
                               {"run_id": run_id, "step": step, "payload": body})
        except errors.DatabaseError as exc:
            raise _signal_error(exc, run_id) from exc
        r = rows[0]
        return SignalSent(str(r["run_id"]), r["step_slug"], r["payload"], r["received_at"], r["applied_at"])

    @staticmethod
    def flows_named(flow: str) -> Plan[list[str]]:
        """The concrete slugs of a flow or alias (an alias: every version it ever pointed at)."""
        rows = yield Fetch("client_flow_filter", "cannot list flows", {"flow": flow})
        return _flow_filter(rows, flow)

    @staticmethod
    def list_runs(
        *,
        limit: int = 20,
        flow: str | None = None,
        status: str | None = None,
        before: str | None = None,
        since: datetime | None = None,
        parent: str | None = None,
    ) -> Plan[list[RunSummary]]:
        """Runs newest first; ``before`` = a run id (the next page), ``since`` = a time,
        ``parent`` = a run id (only the child runs its child-flow steps started)."""
        flows = (yield from Operations.flows_named(flow)) if flow else None
        before = (yield from _resolve_run(before)) if before else None
        parent = (yield from _resolve_run(parent)) if parent else None
        params = _list_params(limit, flows, status, before, since, parent)
        if params["before"]:
            found = yield Fetch("client_run_exists", "cannot list runs",
                                {"run_id": params["before"]})
            _check_page(found, params["before"])
        rows = yield Fetch("client_list_runs", "cannot list runs", params)
        waiting = [str(r["run_id"]) for r in rows if r["status"] in ("started", "waiting")]
        waits = first_waits((yield from _run_waits(waiting))) if waiting else {}
        return [RunSummary.from_row({**r, "waiting_for": waits.get(str(r["run_id"]))}) for r in rows]

    @staticmethod
    def stuck_runs() -> Plan[list[StuckRun]]:
        """Started runs without a queued, leased or retry-delayed task: nothing will move them."""
        rows = yield Fetch("client_stuck_runs", "cannot check for stuck runs")
        return [StuckRun(str(r["run_id"]), r["flow_slug"], r["started_at"], r["reason"])
                for r in rows]

    @staticmethod
    def get_run(run_id: str) -> Plan[RunState]:
        """The run with its steps, tasks, attempts, wait steps, what it waits for and its
        family (:class:`RunState`; ``to_json()``: as a JSON document); raises
        :class:`flowlane.errors.NotFound` when there is no such run."""
        run_id = yield from _resolve_run(run_id)
        rows = yield Fetch("client_get_run", "cannot read the run", {"run_id": run_id})
        document = _run_document(rows, run_id)
        return RunState.from_json(document, (yield from _run_waits([run_id])))

    @staticmethod
    def wait(run_id: str, *, timeout: float = 60.0) -> Plan[RunState]:
        """Wait until the run ends (completed, failed or cancelled); return its state.

        Woken by the run's notification; raises :class:`RunTimeout` after ``timeout`` s."""
        run_id = yield from _resolve_run(run_id)
        deadline = time.monotonic() + timeout
        listener = yield Listen()  # before the first read: an end in between still wakes us
        while True:
            state = yield from Operations.get_run(run_id)
            if state.run.status in TERMINAL:
                return state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunTimeout(run_id, state.run.status, timeout)
            yield Notified(listener, run_id, min(remaining, FALLBACK_POLL_SECONDS))


def _deprecated(name: str, instead: str) -> None:
    # the plan runs in _advance, in the client's _run, in its method: warn the method's caller
    warnings.warn(f"Client.{name} is deprecated: use {instead}", DeprecationWarning, stacklevel=6)


def _run_waits(run_ids: list[str]) -> Plan[list[dict[str, Any]]]:
    """What each of these runs waits for (``run_waits``): one row per waiting thing."""
    rows: list[dict[str, Any]] = yield Fetch("run_waits", "cannot read what runs wait for",
                                             {"run_ids": run_ids})
    return rows


def _pause(name: str, paused: bool, reason: str | None) -> Plan[None]:
    yield Fetch("client_pause_schedule", f"cannot {'pause' if paused else 'resume'} schedule {name}",
                {"name": name, "paused": paused, "reason": reason})


# -- the two clients: each carries plans out -----------------------------------------


C = TypeVar("C", bound=type)


def _documented(client: C) -> C:
    """Each public method of ``client`` says what its plan says (docstrings are written once,
    in :class:`Operations`)."""
    for name in vars(Operations):
        if not name.startswith("_"):
            getattr(client, name).__doc__ = getattr(Operations, name).__doc__
    return client


@_documented
class Client:
    """``Client(dsn)``: one connection; also a context manager.

    ``dsn`` None resolves like the CLI: ``FLOWLANE_DSN``, ``DATABASE_URL``, else
    the embedded database of ``project_dir`` (default: the project root).
    """

    def __init__(self, dsn: str | None = None, *, project_dir: Path | None = None) -> None:
        self.target = db.resolve(dsn, project_dir)
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.target, autocommit=True, row_factory=dict_row)
        return self._conn

    def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self, flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
              start_at: StartAt = None, priority: int | None = None, origin: Mapping[str, str] | None = None
    ) -> Started:
        return self._run(Operations.start(flow, input, run_id=run_id, key=key, start_at=start_at,
                                          priority=priority, origin=origin))

    def begin(self, flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
              start_at: StartAt = None, priority: int | None = None, origin: Mapping[str, str] | None = None
    ) -> Started:
        return self._run(Operations.begin(flow, input, run_id=run_id, key=key, start_at=start_at,
                                          priority=priority, origin=origin))

    def start_run(self, flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
                  start_at: StartAt = None, priority: int | None = None) -> str:
        return self._run(Operations.start_run(flow, input, run_id=run_id, key=key, start_at=start_at,
                                              priority=priority))

    def start_runs(self, flow: str, inputs: Iterable[Any], *, chunk_size: int = START_CHUNK,
                   start_at: StartAt = None, priority: int | None = None) -> list[str]:
        return self._run(Operations.start_runs(flow, inputs, chunk_size=chunk_size, start_at=start_at,
                                               priority=priority))

    def cancel(self, run_id: str, *, reason: str | None = None) -> RunChange:
        return self._run(Operations.cancel(run_id, reason=reason))

    def retry(self, run_id: str, *, from_step: str | None = None, compensation: bool = False) -> RunChange:
        return self._run(Operations.retry(run_id, from_step=from_step, compensation=compensation))

    def repair(self, action: str, where: RunFilter, *, dry_run: bool = False, batch_size: int = REPAIR_BATCH,
               statuses: Iterable[str] | None = None, reason: str | None = None, sample_size: int = 10
    ) -> Repair:
        return self._run(Operations.repair(action, where, dry_run=dry_run, batch_size=batch_size,
                                           statuses=statuses, reason=reason, sample_size=sample_size))

    def signal(self, run_id: str, step: str, payload: Any = None, *, by: str | None = None) -> SignalSent:
        return self._run(Operations.signal(run_id, step, payload, by=by))

    def flows_named(self, flow: str) -> list[str]:
        return self._run(Operations.flows_named(flow))

    def list_runs(self, *, limit: int = 20, flow: str | None = None, status: str | None = None,
                  before: str | None = None, since: datetime | None = None, parent: str | None = None
    ) -> list[RunSummary]:
        return self._run(Operations.list_runs(limit=limit, flow=flow, status=status, before=before,
                                              since=since, parent=parent))

    def stuck_runs(self) -> list[StuckRun]:
        return self._run(Operations.stuck_runs())

    def get_run(self, run_id: str) -> RunState:
        return self._run(Operations.get_run(run_id))

    def wait(self, run_id: str, *, timeout: float = 60.0) -> RunState:
        return self._run(Operations.wait(run_id, timeout=timeout))

    def schedules(self) -> list[ScheduleSummary]:
        return self._run(Operations.schedules())

    def triggers(self) -> list[TriggerActivity]:
        return self._run(Operations.triggers())

    def webhook_activity(self) -> dict[str, WebhookActivity]:
        return self._run(Operations.webhook_activity())

    def pause_schedule(self, name: str, *, reason: str | None = None) -> None:
        return self._run(Operations.pause_schedule(name, reason=reason))

    def resume_schedule(self, name: str) -> None:
        return self._run(Operations.resume_schedule(name))

    def trigger_schedule(self, name: str, input: Any = None) -> str:
        return self._run(Operations.trigger_schedule(name, input))

    def _run(self, plan: Plan[T]) -> T:
        """Carry out the plan's requests in turn; a transaction or a LISTEN it asked for
        ends with it."""
        with contextlib.ExitStack() as scope:
            answer: Any = None
            failure: Exception | None = None
            while not isinstance(step := _advance(plan, answer, failure), _PlanResult):
                answer, failure = None, None
                try:
                    answer = self._carry_out(step, scope)
                except Exception as exc:  # noqa: BLE001 - handed to the plan, which may own it
                    failure = exc
            return step.value

    def _carry_out(self, request: Request, scope: contextlib.ExitStack) -> Any:
        if isinstance(request, Fetch):
            with missing_core_hint(), db.wrap_errors(request.action):
                return self._connection().execute(query(request.name), request.params).fetchall()
        if isinstance(request, Atomic):
            scope.enter_context(missing_core_hint())
            scope.enter_context(db.wrap_errors(request.action))  # the commit's errors too
            return scope.enter_context(self._connection().transaction())
        if isinstance(request, Listen):
            return None if self.target.pooled else scope.enter_context(self._listening())
        if request.listener is None:  # through a pooler: poll
            time.sleep(min(request.timeout, POOLER_POLL_SECONDS))
            return None
        with db.wrap_errors(WAITING):
            for note in request.listener.notifies(timeout=request.timeout):
                if note.payload == request.run_id:
                    break
        return None

    @contextlib.contextmanager
    def _listening(self) -> Iterator[psycopg.Connection[Any]]:
        conn = self._connection()  # notifications arrive between this client's calls
        with db.wrap_errors(WAITING):
            conn.execute(query("client_listen_finished"))
        try:
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):  # a broken connection: the error says why
                conn.execute(query("client_unlisten_finished"))


@_documented
class AsyncClient:
    """The :class:`Client` API for asyncio: ``async with AsyncClient(dsn) as client: ...``."""

    def __init__(self, dsn: str | None = None, *, project_dir: Path | None = None) -> None:
        self.target = db.resolve(dsn, project_dir)
        self._conn: psycopg.AsyncConnection[dict[str, Any]] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = await db.connect_async(self.target, autocommit=True, row_factory=dict_row)
        return self._conn

    async def close(self) -> None:
        """Close the connection (the next call opens a new one)."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self, flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
                    start_at: StartAt = None, priority: int | None = None,
                    origin: Mapping[str, str] | None = None) -> Started:
        return await self._run(Operations.start(flow, input, run_id=run_id, key=key, start_at=start_at,
                                                priority=priority, origin=origin))

    async def begin(self, flow: str, input: Any = None, *, run_id: str | None = None, key: str | None = None,
                    start_at: StartAt = None, priority: int | None = None,
                    origin: Mapping[str, str] | None = None) -> Started:
        return await self._run(Operations.begin(flow, input, run_id=run_id, key=key, start_at=start_at,
                                                priority=priority, origin=origin))

    async def start_run(self, flow: str, input: Any = None, *, run_id: str | None = None,
                        key: str | None = None, start_at: StartAt = None, priority: int | None = None) -> str:
        return await self._run(Operations.start_run(flow, input, run_id=run_id, key=key, start_at=start_at,
                                                    priority=priority))

    async def start_runs(self, flow: str, inputs: Iterable[Any], *, chunk_size: int = START_CHUNK,
                         start_at: StartAt = None, priority: int | None = None) -> list[str]:
        return await self._run(Operations.start_runs(flow, inputs, chunk_size=chunk_size, start_at=start_at,
                                                     priority=priority))

    async def cancel(self, run_id: str, *, reason: str | None = None) -> RunChange:
        return await self._run(Operations.cancel(run_id, reason=reason))

    async def retry(self, run_id: str, *, from_step: str | None = None, compensation: bool = False
    ) -> RunChange:
        return await self._run(Operations.retry(run_id, from_step=from_step, compensation=compensation))

    async def repair(self, action: str, where: RunFilter, *, dry_run: bool = False,
                     batch_size: int = REPAIR_BATCH, statuses: Iterable[str] | None = None,
                     reason: str | None = None, sample_size: int = 10) -> Repair:
        return await self._run(Operations.repair(action, where, dry_run=dry_run, batch_size=batch_size,
                                                 statuses=statuses, reason=reason, sample_size=sample_size))

    async def signal(self, run_id: str, step: str, payload: Any = None, *, by: str | None = None
    ) -> SignalSent:
        return await self._run(Operations.signal(run_id, step, payload, by=by))

    async def flows_named(self, flow: str) -> list[str]:
        return await self._run(Operations.flows_named(flow))

    async def list_runs(self, *, limit: int = 20, flow: str | None = None, status: str | None = None,
                        before: str | None = None, since: datetime | None = None, parent: str | None = None
    ) -> list[RunSummary]:
        return await self._run(Operations.list_runs(limit=limit, flow=flow, status=status, before=before,
                                                    since=since, parent=parent))

    async def stuck_runs(self) -> list[StuckRun]:
        return await self._run(Operations.stuck_runs())

    async def get_run(self, run_id: str) -> RunState:
        return await self._run(Operations.get_run(run_id))

    async def wait(self, run_id: str, *, timeout: float = 60.0) -> RunState:
        return await self._run(Operations.wait(run_id, timeout=timeout))

    async def schedules(self) -> list[ScheduleSummary]:
        return await self._run(Operations.schedules())

    async def triggers(self) -> list[TriggerActivity]:
        return await self._run(Operations.triggers())

    async def webhook_activity(self) -> dict[str, WebhookActivity]:
        return await self._run(Operations.webhook_activity())

    async def pause_schedule(self, name: str, *, reason: str | None = None) -> None:
        return await self._run(Operations.pause_schedule(name, reason=reason))

    async def resume_schedule(self, name: str) -> None:
        return await self._run(Operations.resume_schedule(name))

    async def trigger_schedule(self, name: str, input: Any = None) -> str:
        return await self._run(Operations.trigger_schedule(name, input))

    async def _run(self, plan: Plan[T]) -> T:
        """:meth:`Client._run`, awaiting each request."""
        async with contextlib.AsyncExitStack() as scope:
            answer: Any = None
            failure: Exception | None = None
            while not isinstance(step := _advance(plan, answer, failure), _PlanResult):
                answer, failure = None, None
                try:
                    answer = await self._carry_out(step, scope)
                except Exception as exc:  # noqa: BLE001 - handed to the plan, which may own it
                    failure = exc
            return step.value

    async def _carry_out(self, request: Request, scope: contextlib.AsyncExitStack) -> Any:
        if isinstance(request, Fetch):
            conn = await self._connection()
            with missing_core_hint(), db.wrap_errors(request.action):
                cursor = await conn.execute(query(request.name), request.params)
                return await cursor.fetchall()
        if isinstance(request, Atomic):
            conn = await self._connection()
            scope.enter_context(missing_core_hint())
            scope.enter_context(db.wrap_errors(request.action))  # the commit's errors too
            return await scope.enter_async_context(conn.transaction())
        if isinstance(request, Listen):
            return None if self.target.pooled else await scope.enter_async_context(self._listening())
        if request.listener is None:  # through a pooler: poll
            await asyncio.sleep(min(request.timeout, POOLER_POLL_SECONDS))
            return None
        with db.wrap_errors(WAITING):
            async for note in request.listener.notifies(timeout=request.timeout):
                if note.payload == request.run_id:
                    break
        return None

    @contextlib.asynccontextmanager
    async def _listening(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        # a connection of its own: notifications arrive while other calls use the main one
        listener = await db.connect_async(self.target, autocommit=True)
        try:
            with db.wrap_errors(WAITING):
                await listener.execute(query("client_listen_finished"))
            yield listener
        finally:
            await listener.close()
