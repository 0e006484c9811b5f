"""Sending task results: completions batched through ``complete_tasks``, failures through
``fail_tasks`` (both set-based in the database: one call per batch).

Every call is fenced by worker id and attempt. The returned rows tell what
happened: accepted, a retry scheduled, the task exhausted, the output refused
by the engine (e.g. a map's parent must output an array), or rejected
because this worker lost its lease (the task was requeued and claimed again,
or finished elsewhere): a rejected result changes nothing and is only logged.
Errors a retry can fix (a lost connection, a deadlock: ``store.is_transient``)
are retried with backoff until the worker stops. A result the database
refuses (a program limit, an oversized value, any other error) fails its own
task with the database's message; the other results of the batch commit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from flowlane.runtime import log
from flowlane.runtime.backoff import Backoff
from flowlane.runtime.store import TRANSIENT, Row, is_transient
from flowlane.runtime.tasks import TaskResult, describe, first_line, short_text

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR


@dataclass
class Counters:
    """A worker's task counts (``worker_progress``, ``worker_stopped``): the poller counts
    claims; :meth:`ResultSender.send` returns the outcomes of the results it sent."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0

    def add(self, other: Counters) -> None:
        for key, value in other.as_dict().items():
            setattr(self, key, getattr(self, key) + value)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class ResultStore(Protocol):
    """The two calls of :class:`flowlane.runtime.store.Store` that send results."""

    async def complete_tasks(self, completions: list[dict[str, Any]]) -> list[Row]: ...

    async def fail_tasks(self, failures: list[dict[str, Any]]) -> list[Row]: ...


class ResultSender:
    def __init__(
        self,
        store: ResultStore,
        worker_id: str,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self._sleep = sleep  # between retries of a call a retry can fix

    async def send(self, results: list[TaskResult]) -> Counters:
        """Send every result (retrying what a retry can fix); return how they ended."""
        tally = Counters()
        completions = [r for r in results if r.ok]
        failures = [r for r in results if not r.ok]
        backoff = Backoff()
        while completions or failures:
            try:
                if completions:
                    await self._send_completions(completions, tally, refused=failures)
                    completions = []
                if failures:
                    await self._send_failures(failures, tally)
                    failures = []
            except TRANSIENT as exc:  # the two calls above raise only what a retry can fix
                pending = len(completions) + len(failures)
                await backoff.retry_later("flusher", exc, self._sleep, pending=pending)
        return tally

    async def _send_completions(
        self, results: list[TaskResult], tally: Counters, *, refused: list[TaskResult]
    ) -> None:
        """Complete a batch; the results the database refuses to store go to ``refused``
        (to fail instead). Split into single sends, each leaves ``results`` once settled, so
        that a retry after a transient error resends only what is still pending."""
        try:
            rows = await self.store.complete_tasks([r.completion(self.worker_id) for r in results])
        except psycopg.Error as exc:
            if is_transient(exc):
                raise
            if len(results) == 1:
                refused.append(
                    TaskResult(
                        results[0].task,
                        ok=False,
                        error=f"the database refused the handler output: {first_line(exc)}",
                    )
                )
                return
            for result in list(results):  # find the one(s) the database refuses
                await self._send_completions([result], tally, refused=refused)
                results.remove(result)
            return
        self._check_rows(rows, results, "completed", tally)

    async def _send_failures(self, results: list[TaskResult], tally: Counters) -> None:
        try:
            rows = await self.store.fail_tasks([r.failure(self.worker_id) for r in results])
        except psycopg.Error as exc:  # never expected; do not let one task stop the worker
            if is_transient(exc):
                raise
            if len(results) > 1:  # find the one(s) the database refuses; settled ones leave
                for result in list(results):
                    await self._send_failures([result], tally)
                    results.remove(result)
                return
            log.event(
                ERROR,
                "result_not_sent",
                **results[0].task.fields,
                error=describe(exc),
                note="left for stalled recovery",
            )
            return
        self._check_rows(rows, results, "failed", tally)

    def _check_rows(
        self, rows: list[Row], results: list[TaskResult], outcome: str, tally: Counters
    ) -> None:
        by_key = {(str(r["run_id"]), r["step_slug"], int(r["task_index"])): r for r in rows}
        for result in results:
            task = result.task
            row = by_key.get((task.run_id, task.step_slug, task.task_index))
            owned = (
                row is not None
                and str(row["last_worker_id"]) == self.worker_id
                and int(row["attempts_count"]) == task.attempt
            )
            if outcome == "completed" and owned and row is not None and row["status"] == "failed":
                # the engine refused the output (e.g. a map's parent must output an array)
                tally.failed += 1
                log.event(WARNING, "task_output_refused", **task.fields, error=row["error_message"])
                continue
            if outcome == "completed":
                accepted = owned and row is not None and row["status"] == "completed"
            else:
                accepted = owned and row is not None and row["status"] in ("failed", "queued")
            if not accepted:
                tally.rejected += 1
                log.event(
                    WARNING,
                    "result_rejected",
                    **task.fields,
                    outcome=outcome,
                    status=row["status"] if row else "missing",
                    note=_rejection_note(row),
                )
                continue
            if outcome == "completed":
                tally.completed += 1
                log.event(DEBUG, "task_completed", **task.fields, duration_ms=result.duration_ms)
            else:
                assert row is not None
                tally.failed += 1
                log.event(
                    INFO if row["status"] == "queued" else WARNING,
                    "task_retry_scheduled" if row["status"] == "queued" else "task_exhausted",
                    **task.fields,
                    error=result.error_type,
                    message=short_text(result.error),
                )


def _rejection_note(row: Row | None) -> str:
    # a completed task that no worker holds was completed by an operator (override_task)
    if row is not None and row["status"] == "completed" and row["last_worker_id"] is None:
        return "an operator completed the task by hand (override_task); result discarded"
    return "the task was requeued or finished elsewhere; result discarded"
