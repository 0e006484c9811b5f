"""Claimed tasks, their results, and running one handler."""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from flowlane.compiler import contracts
from flowlane.runtime import log
from flowlane.runtime.context import TaskContext
from flowlane.runtime.limits import check_output, undecodable_field
from flowlane.runtime.registry import Registered

MAX_ERROR_CHARS = 4000
MAX_TRACEBACK_CHARS = 16000  # the attempt history's bound (task_attempts_bounded)
LOGGED_MESSAGE_CHARS = 200
# the error type of an output that breaks its step's output_schema: the SQL Core never retries it
OUTPUT_CONTRACT_VIOLATION = "OutputContractViolation"


@dataclass(frozen=True)
class ClaimedTask:
    """One claimed row of ``flowlane.claim_tasks`` / ``start_tasks`` (``flow_input`` is
    shared by the tasks of one run in a batch)."""

    flow_slug: str
    step_slug: str
    queue_name: str
    run_id: str
    task_index: int
    input: Any
    flow_input: Any
    attempt: int
    msg_id: int
    deadline: datetime | None = None  # when the run has to be finished (the flow's deadline)

    @cached_property  # a task logs it two or three times (started, finished, its handler's log)
    def fields(self) -> dict[str, Any]:
        """Identifiers for log lines (never the payload); read-only."""
        return {
            "run_id": self.run_id,
            "flow": self.flow_slug,
            "step": self.step_slug,
            "task_index": self.task_index,
            "attempt": self.attempt,
            "msg_id": self.msg_id,
        }


@dataclass(frozen=True)
class TaskResult:
    task: ClaimedTask
    ok: bool
    output: Any = None
    error: str | None = None
    seconds: float = 0.0  # how long the handler ran (perf_counter: sub-millisecond)
    error_type: str | None = None
    traceback: str | None = None

    @property
    def duration_ms(self) -> int:
        return _ms(self.seconds)

    def completion(self, worker_id: str) -> dict[str, Any]:
        return {
            "run_id": self.task.run_id,
            "step_slug": self.task.step_slug,
            "task_index": self.task.task_index,
            "output": self.output,
            "worker_id": worker_id,
            "attempt": self.task.attempt,
        }

    def failure(self, worker_id: str) -> dict[str, Any]:
        return {
            "run_id": self.task.run_id,
            "step_slug": self.task.step_slug,
            "task_index": self.task.task_index,
            "error_message": (self.error or "failed").replace("\x00", "\\0"),
            "worker_id": worker_id,
            "attempt": self.task.attempt,
            "error_type": self.error_type,
            "traceback": self.traceback,
        }


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.replace("\x00", "\\0")[:MAX_ERROR_CHARS]  # PostgreSQL text cannot hold NUL


def error_type(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def bounded_traceback(exc: BaseException) -> str:
    """The traceback's last ``MAX_TRACEBACK_CHARS`` characters (the innermost frames matter most)."""
    text = "".join(traceback.format_exception(exc)).replace("\x00", "\\0")
    return text if len(text) <= MAX_TRACEBACK_CHARS else "...\n" + text[-(MAX_TRACEBACK_CHARS - 4) :]


def short_text(text: str | None) -> str | None:
    """An error text for a log line: one line, truncated; None when empty."""
    flat = " ".join((text or "").split())
    if not flat:
        return None
    return flat if len(flat) <= LOGGED_MESSAGE_CHARS else flat[: LOGGED_MESSAGE_CHARS - 3] + "..."


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (a database error's message without DETAIL/CONTEXT)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def execute(
    task: ClaimedTask,
    handler: Registered,
    ctx: TaskContext,
    threads: HandlerThreads,
    began: Callable[[float], None] | None = None,
) -> TaskResult:
    """Run the handler; exceptions and unserialisable outputs become a failed result.
    ``began``: called with the handler's start (``perf_counter``) by the thread that runs a
    sync handler, which may wait for a free thread first (the handler's time starts there)."""
    started = [time.perf_counter()]
    poison = undecodable_field(("input", task.input), ("run input", task.flow_input))
    if poison is not None:
        log.event(logging.WARNING, "task_failed", **task.fields, error="InputNotDecodable")
        return TaskResult(task, ok=False, error=poison)
    if log.logger.isEnabledFor(logging.DEBUG):
        log.event(logging.DEBUG, "task_started", **task.fields)
    try:
        if handler.is_async:
            output = await handler.func(task.input, ctx)
        else:

            def start(at: float) -> None:
                started[0] = at
                if began is not None:
                    began(at)

            output = await threads.submit(handler.func, task.input, ctx, start=start)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - any handler error fails the task
        # SystemExit/KeyboardInterrupt from an async handler too: escaping a task, they would
        # stop the event loop and kill the worker, dropping every buffered result
        elapsed = time.perf_counter() - started[0]  # seconds, sub-millisecond
        log.event(
            logging.WARNING,
            "task_failed",
            **task.fields,
            duration_ms=_ms(elapsed),
            error=error_type(exc),
            message=short_text(str(exc)),
        )
        trace = bounded_traceback(exc)
        log.logger.debug(
            "handler traceback for %s/%s[%s]:\n%s", task.run_id, task.step_slug, task.task_index, trace
        )
        return TaskResult(
            task,
            ok=False,
            error=describe(exc),
            seconds=elapsed,
            error_type=error_type(exc),
            traceback=trace,
        )
    problem = check_output(output)
    elapsed = time.perf_counter() - started[0]  # seconds, sub-millisecond
    if problem is None and handler.ref.output_schema is not None:
        broken = contracts.first_violation(handler.ref.output_schema, output)
        if broken is not None:
            log.event(logging.WARNING, "task_failed", **task.fields, duration_ms=_ms(elapsed),
                      error=OUTPUT_CONTRACT_VIOLATION, message=short_text(str(broken)))
            # the SQL Core fails the task at once (when_exhausted applies): no retry
            return TaskResult(task, ok=False, seconds=elapsed, error_type=OUTPUT_CONTRACT_VIOLATION,
                              error=(f"the output of step {task.step_slug} does not match its "
                                     f"output_schema: {broken} (rule output_schema"
                                     f"{broken.schema_path})")[:MAX_ERROR_CHARS])
    if problem is not None:
        log.event(
            logging.WARNING,
            "task_failed",
            **task.fields,
            duration_ms=_ms(elapsed),
            error="OutputRefused",
        )
        return TaskResult(
            task, ok=False, error=problem, seconds=elapsed, error_type="OutputRefused"
        )
    return TaskResult(task, ok=True, output=output, seconds=elapsed)


def _ms(seconds: float) -> int:
    """Whole milliseconds, as the log lines write durations."""
    return int(seconds * 1000)


class HandlerCrashed(Exception):
    """A sync handler raised what a Future cannot carry to the loop: a BaseException that
    is not an Exception (e.g. SystemExit), or StopIteration."""


Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]  # a handler's, for its future


class HandlerThreads:
    """A fixed set of daemon threads for sync handlers (one per handler slot), taking the
    handlers in the order they were submitted. A thread whose handler returns takes the
    next one at once, without waiting for the event loop; a handler whose future was
    cancelled before a thread took it (abandoned at shutdown) is not run.

    Daemon threads, not a ``ThreadPoolExecutor``: a handler abandoned at
    shutdown must never keep the process alive (its task is left to stalled
    recovery). Started once: starting a thread per task blocks the event loop
    until the new thread is scheduled.

    Finished handlers wake the loop once per burst, not once per task: a
    thread queues its outcome and schedules ``_settle_done`` only when none is
    pending. A wake-up per task costs the loop a callback per task, and with
    no-op handlers those callbacks are most of a worker's own CPU (one worker
    draining no-op handlers: about 7k tasks/s, against 5k with a wake-up per
    task).
    """

    def __init__(self, size: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        # outcomes waiting for their loop, per loop: present while a _settle_done is scheduled
        self._settling: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"flowlane-handler-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, func: Callable[..., Any], *args: Any, start: Callable[[float], None] | None = None
    ) -> asyncio.Future[Any]:
        """``func(*args)`` in a thread; ``start`` is called there first, with the time
        (``perf_counter``) the thread takes it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((loop, future, func, args, start))
        return future

    def close(self) -> None:
        """Let idle threads exit; busy (abandoned) ones end with the process."""
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, func, args, start = job
            if future.cancelled():  # abandoned while it waited for a thread
                continue
            value: Any = None
            error: BaseException | None = None
            try:
                if start is not None:
                    start(time.perf_counter())
                value = func(*args)
                if inspect.isawaitable(value):
                    value = asyncio.run(_await(value))
            except StopIteration as exc:  # a Future refuses it: the task would hang forever
                error = HandlerCrashed(describe(exc))
            except Exception as exc:  # noqa: BLE001 - any handler error fails the task
                error = exc
            except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt in a handler
                error = HandlerCrashed(describe(exc))
            self._queue_outcome(loop, (future, value, error))

    def _queue_outcome(self, loop: asyncio.AbstractEventLoop, outcome: Outcome) -> None:
        with self._lock:
            waiting = self._settling.get(loop)
            if waiting is not None:  # the scheduled _settle_done takes this one too
                waiting.append(outcome)
                return
            self._settling[loop] = [outcome]
        try:
            loop.call_soon_threadsafe(self._settle_done, loop)
        except RuntimeError:  # the loop is gone: its tasks were abandoned
            with self._lock:
                self._settling.pop(loop, None)

    def _settle_done(self, loop: asyncio.AbstractEventLoop) -> None:
        """On ``loop``: settle its queued outcomes (an outcome queued later schedules a
        call of its own)."""
        with self._lock:
            outcomes = self._settling.pop(loop, [])
        for outcome in outcomes:
            _settle(*outcome)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled: abandoned at shutdown
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


async def _await(value: Any) -> Any:
    return await value
