"""Sending task results: :class:`ResultFlusher` batches the results as handlers finish;
:class:`ResultSender` sends a batch, completions through ``complete_tasks``, failures through
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
from flowlane.runtime.store import TRANSIENT, TaskOutcome, is_transient
from flowlane.runtime.tasks import TaskResult, describe, first_line, short_text

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
FLUSHES = 2  # result commits in flight at once (the pool's fourth connection takes the second)
# seconds a finished result waits for the handlers claimed with it that still run, so that
# their results share one commit (a result with none left running does not wait)
RESULT_GATHER = 0.001

UncommittedResult = tuple[TaskResult, asyncio.Future[None]]  # a result and its commit signal


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

    async def complete_tasks(self, completions: list[dict[str, Any]]) -> list[TaskOutcome]: ...

    async def fail_tasks(self, failures: list[dict[str, Any]]) -> list[TaskOutcome]: ...


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
        self, rows: list[TaskOutcome], results: list[TaskResult], outcome: str, tally: Counters
    ) -> None:
        by_key = {r.key: r for r in rows}
        debug = log.logger.isEnabledFor(DEBUG)  # a line per task only when it is written
        for result in results:
            task = result.task
            row = by_key.get((task.run_id, task.step_slug, task.task_index))
            owned = (
                row is not None
                and row.last_worker_id == self.worker_id
                and row.attempts_count == task.attempt
            )
            if outcome == "completed" and owned and row is not None and row.status == "failed":
                # the engine refused the output (e.g. a map's parent must output an array)
                tally.failed += 1
                log.event(WARNING, "task_output_refused", **task.fields, error=row.error_message)
                continue
            if outcome == "completed":
                accepted = owned and row is not None and row.status == "completed"
            else:
                accepted = owned and row is not None and row.status in ("failed", "queued")
            if not accepted:
                tally.rejected += 1
                log.event(
                    WARNING,
                    "result_rejected",
                    **task.fields,
                    outcome=outcome,
                    status=row.status if row else "missing",
                    note=_rejection_note(row),
                )
                continue
            if outcome == "completed":
                tally.completed += 1
                if debug:
                    log.event(DEBUG, "task_completed", **task.fields, duration_ms=result.duration_ms)
            else:
                assert row is not None
                tally.failed += 1
                log.event(
                    INFO if row.status == "queued" else WARNING,
                    "task_retry_scheduled" if row.status == "queued" else "task_exhausted",
                    **task.fields,
                    error=result.error_type,
                    message=short_text(result.error),
                )


class ResultFlusher:
    """Send what has finished at once, up to ``FLUSHES`` commits in flight: a result
    waits for about one commit, not for the commit before it as well; under load the
    results that finish meanwhile make the next batch. A result waits at most
    ``RESULT_GATHER`` for the handlers claimed with it that still run: handlers claimed
    together often finish together, and their results then share one call instead of
    one call each. ``None`` on ``results`` ends :meth:`run` once everything before it is
    committed; each result's future is set when its commit is done."""

    def __init__(
        self,
        sender: ResultSender,
        results: asyncio.Queue[UncommittedResult | None],
        counters: Counters,
        *,
        claim_mates_running: Callable[[list[TaskResult]], bool],
        committed: Callable[[], None],
    ) -> None:
        self.sender = sender
        self.results = results
        self.counters = counters
        self._claim_mates_running = claim_mates_running
        self._committed = committed  # after each commit (a dependent may now be ready)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while True:
                first = await self._next_result(in_flight)
                gathered_by = loop.time() + RESULT_GATHER
                while len(in_flight) >= FLUSHES:  # both commits in flight: the results wait
                    full = asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    await _settle_flushes(in_flight, full)
                batch = [first]
                await self._gather_results(batch, gathered_by)
                items = [item for item in batch if item is not None]
                if items:
                    in_flight.add(asyncio.create_task(self._flush(items)))
                if None in batch:
                    await asyncio.gather(*in_flight)
                    return
        finally:
            for flush in in_flight:  # left only when the flusher is cancelled or crashed
                flush.cancel()

    async def _flush(self, items: list[UncommittedResult]) -> None:
        self.counters.add(await self.sender.send([result for result, _ in items]))
        for _, committed in items:
            if not committed.done():
                committed.set_result(None)
        self._committed()

    async def _next_result(self, in_flight: set[asyncio.Task[None]]) -> UncommittedResult | None:
        """The next finished result (None: stop), while watching the flushes in flight."""
        getter = asyncio.ensure_future(self.results.get())
        try:
            while True:
                waiting = asyncio.wait({getter, *in_flight}, return_when=asyncio.FIRST_COMPLETED)
                if getter in await _settle_flushes(in_flight, waiting):
                    return getter.result()
        finally:
            getter.cancel()  # a no-op once it has its item

    async def _gather_results(self, batch: list[UncommittedResult | None], until: float) -> None:
        """Add to ``batch`` the results already queued, then those that finish before ``until``
        (loop time) while a handler claimed with one of its tasks still runs."""
        loop = asyncio.get_running_loop()
        while True:
            while not self.results.empty():
                batch.append(self.results.get_nowait())
            left = until - loop.time()
            if None in batch or left <= 0 or not self._mates_running(batch):
                return
            getter = asyncio.ensure_future(self.results.get())
            try:
                await asyncio.wait({getter}, timeout=left)
            finally:
                getter.cancel()  # a no-op once it has its item
            if not getter.done() or getter.cancelled():
                return
            batch.append(getter.result())

    def _mates_running(self, batch: list[UncommittedResult | None]) -> bool:
        return self._claim_mates_running([item[0] for item in batch if item is not None])


async def _settle_flushes(in_flight: set[asyncio.Task[None]], waiting: Awaitable[Any]) -> set[Any]:
    """Await ``waiting`` (an ``asyncio.wait`` over flushes and more); the flushes it finds done
    leave ``in_flight``, and one that crashed raises its error (it stops the flusher at once,
    not at the next result). Returns what is done."""
    done, _ = await waiting
    for flush in in_flight & done:
        in_flight.discard(flush)
        flush.result()
    return set(done)


def _rejection_note(row: TaskOutcome | None) -> str:
    # a completed task that no worker holds was completed by an operator (override_task)
    if row is not None and row.status == "completed" and row.last_worker_id is None:
        return "an operator completed the task by hand (override_task); result discarded"
    return "the task was requeued or finished elsewhere; result discarded"
