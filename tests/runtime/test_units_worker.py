"""Unit tests of the worker's parts: no database, no process (part of the fast loop).

``ResultSender`` against a fake of the two store calls it makes, ``HandlerThreads``,
``Backoff``, and ``WorkerConfig`` / the ``flowlane worker`` and ``serve`` arguments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowlane import defaults, errors
from flowlane.cli import build_parser, main
from flowlane.cli.worker import worker_config
from flowlane.compiler import WorkerDoc, project_from_text
from flowlane.runtime import results as results_module
from flowlane.runtime.backoff import JITTER, Backoff
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.results import Counters, ResultSender
from flowlane.runtime.store import Row, TaskOutcome
from flowlane.runtime.tasks import ClaimedTask, HandlerCrashed, HandlerThreads, TaskResult
from flowlane.runtime.worker import InFlightTask, Phase, Session, Stop, StopReason, Worker

WORKER = "11111111-1111-1111-1111-111111111111"
OTHER_WORKER = "22222222-2222-2222-2222-222222222222"


def _task(index: int = 0, attempt: int = 1) -> ClaimedTask:
    return ClaimedTask(
        flow_slug="f",
        step_slug="s",
        queue_name="q",
        run_id=str(uuid.uuid4()),
        task_index=index,
        input=None,
        flow_input={},
        attempt=attempt,
        msg_id=100 + index,
    )


def _ok(output: Any = 1, attempt: int = 1) -> TaskResult:
    return TaskResult(_task(attempt=attempt), ok=True, output=output)


def _failed(error: str = "ValueError: boom") -> TaskResult:
    return TaskResult(_task(), ok=False, error=error, error_type="ValueError")


class FakeStore:
    """``complete_tasks`` / ``fail_tasks`` as the database answers them: one row per item,
    owned by the sender, unless a run id is given another ``answer``; ``errors`` are raised
    by the next calls, in order; items whose output is ``REFUSED`` raise a permanent error."""

    REFUSED = "too big for the database"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []
        self.errors: list[BaseException] = []
        self.answer: dict[str, dict[str, Any]] = {}  # run_id -> row fields, or {"missing": True}
        self.failing_runs: set[str] = set()  # fail_tasks refuses these permanently

    async def complete_tasks(self, completions: list[dict[str, Any]]) -> list[TaskOutcome]:
        self.calls.append(("complete", completions))
        self._raise_next()
        if any(item["output"] == self.REFUSED for item in completions):
            raise psycopg.errors.ProgramLimitExceeded("value too long for the index")
        return self._rows(completions, "completed")

    async def fail_tasks(self, failures: list[dict[str, Any]]) -> list[TaskOutcome]:
        self.calls.append(("fail", failures))
        self._raise_next()
        if any(item["run_id"] in self.failing_runs for item in failures):
            raise psycopg.errors.DataException("invalid input")
        return self._rows(failures, "queued")

    def _raise_next(self) -> None:
        if self.errors:
            raise self.errors.pop(0)

    def _rows(self, items: list[dict[str, Any]], status: str) -> list[TaskOutcome]:
        rows = []
        for item in items:
            answer = self.answer.get(item["run_id"], {})
            if answer.get("missing"):
                continue
            rows.append(TaskOutcome.from_row({
                "run_id": uuid.UUID(item["run_id"]),
                "step_slug": item["step_slug"],
                "task_index": item["task_index"],
                "last_worker_id": uuid.UUID(item["worker_id"]),
                "attempts_count": item["attempt"],
                "status": status,
                "error_message": None,
                **answer,
            }))
        return rows


def _send(
    store: FakeStore, results: list[TaskResult], sleeps: list[float] | None = None
) -> Counters:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    return asyncio.run(ResultSender(store, WORKER, sleep=sleep).send(results))


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, Any]]:
    return [
        record.flowlane  # type: ignore[attr-defined]
        for record in caplog.records
        if getattr(record, "flowlane", {}).get("event") == name
    ]


# -- ResultSender -------------------------------------------------------------


def test_results_go_out_in_one_fenced_call_per_kind() -> None:
    store = FakeStore()
    done = [_ok(i) for i in range(3)]
    failed = [_failed(), _failed()]
    counts = _send(store, [done[0], failed[0], done[1], failed[1], done[2]])
    assert [kind for kind, _ in store.calls] == ["complete", "fail"]
    completions, failures = store.calls[0][1], store.calls[1][1]
    assert [c["run_id"] for c in completions] == [r.task.run_id for r in done]
    assert [c["output"] for c in completions] == [0, 1, 2]
    assert [f["run_id"] for f in failures] == [r.task.run_id for r in failed]
    assert {(c["worker_id"], c["attempt"]) for c in completions + failures} == {(WORKER, 1)}
    assert failures[0]["error_type"] == "ValueError"
    assert counts == Counters(completed=3, failed=2)


def test_results_of_lost_leases_are_rejected_and_change_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "flowlane")
    store = FakeStore()
    kept, other_worker, other_attempt, gone, retried = _ok(), _ok(), _ok(), _ok(), _failed()
    store.answer[other_worker.task.run_id] = {"last_worker_id": uuid.UUID(OTHER_WORKER)}
    store.answer[other_attempt.task.run_id] = {"attempts_count": 2, "status": "started"}
    store.answer[gone.task.run_id] = {"missing": True}
    store.answer[retried.task.run_id] = {"last_worker_id": uuid.UUID(OTHER_WORKER)}
    counts = _send(store, [kept, other_worker, other_attempt, gone, retried])
    assert counts == Counters(completed=1, rejected=4)
    rejected = _events(caplog, "result_rejected")
    assert {(e["run_id"], e["outcome"], e["status"]) for e in rejected} == {
        (other_worker.task.run_id, "completed", "completed"),
        (other_attempt.task.run_id, "completed", "started"),
        (gone.task.run_id, "completed", "missing"),
        (retried.task.run_id, "failed", "queued"),
    }
    assert [e["run_id"] for e in _events(caplog, "task_completed")] == [kept.task.run_id]


def test_failure_rows_say_retry_or_exhausted_and_refused_outputs_count_as_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "flowlane")
    store = FakeStore()
    retry, exhausted, refused = _failed(), _failed("boom " * 100), _ok([1])
    store.answer[exhausted.task.run_id] = {"status": "failed"}
    store.answer[refused.task.run_id] = {"status": "failed", "error_message": "not an array"}
    counts = _send(store, [retry, exhausted, refused])
    assert counts == Counters(failed=3)
    assert [e["run_id"] for e in _events(caplog, "task_retry_scheduled")] == [retry.task.run_id]
    [gave_up] = _events(caplog, "task_exhausted")
    assert gave_up["run_id"] == exhausted.task.run_id and len(gave_up["message"]) == 200
    [output] = _events(caplog, "task_output_refused")
    assert (output["run_id"], output["error"]) == (refused.task.run_id, "not an array")


def test_errors_a_retry_can_fix_are_retried_with_growing_delays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "flowlane")
    store = FakeStore()
    store.errors = [psycopg.OperationalError("server closed the connection")] * 3
    sleeps: list[float] = []
    counts = _send(store, [_ok(), _ok(), _failed()], sleeps)
    assert counts == Counters(completed=2, failed=1)
    assert [kind for kind, _ in store.calls] == ["complete"] * 4 + ["fail"]
    assert len(sleeps) == 3 and sleeps[0] < sleeps[1] < sleeps[2]
    lost = _events(caplog, "database_unavailable")
    assert [(e["component"], e["pending"]) for e in lost] == [("flusher", 3)] * 3


def test_a_transient_error_while_failing_resends_only_the_failures() -> None:
    store = FakeStore()
    done, failed = _ok(), _failed()

    async def flaky_fail(failures: list[dict[str, Any]]) -> list[TaskOutcome]:
        store.fail_tasks = real_fail  # type: ignore[method-assign]
        raise psycopg.OperationalError("connection lost")

    real_fail = store.fail_tasks
    store.fail_tasks = flaky_fail  # type: ignore[method-assign]
    assert _send(store, [done, failed], []) == Counters(completed=1, failed=1)
    assert [kind for kind, _ in store.calls] == ["complete", "fail"]  # the completion: once


def test_a_completion_the_database_refuses_fails_only_its_own_task() -> None:
    store = FakeStore()
    good, bad, also_good = _ok(1), _ok(FakeStore.REFUSED), _ok(2)
    counts = _send(store, [good, bad, also_good], [])
    assert counts == Counters(completed=2, failed=1)
    one_by_one = [items[0]["run_id"] for kind, items in store.calls
                  if kind == "complete" and len(items) == 1]
    assert one_by_one == [good.task.run_id, bad.task.run_id, also_good.task.run_id]
    [[failure]] = [items for kind, items in store.calls if kind == "fail"]
    assert failure["run_id"] == bad.task.run_id
    assert failure["error_message"] == (
        "the database refused the handler output: value too long for the index"
    )


def test_a_transient_error_while_sending_one_by_one_resends_only_what_is_pending() -> None:
    store = FakeStore()
    good, bad, also_good = _ok(1), _ok(FakeStore.REFUSED), _ok(2)
    real_complete = store.complete_tasks
    lost_once = [also_good.task.run_id]

    async def flaky_complete(completions: list[dict[str, Any]]) -> list[TaskOutcome]:
        if [item["run_id"] for item in completions] == lost_once:
            lost_once.clear()
            raise psycopg.OperationalError("connection lost")
        return await real_complete(completions)

    store.complete_tasks = flaky_complete  # type: ignore[method-assign]
    assert _send(store, [good, bad, also_good], []) == Counters(completed=2, failed=1)
    sent = [[item["run_id"] for item in items] for kind, items in store.calls]
    assert sent.count([good.task.run_id]) == 1 and sent.count([bad.task.run_id]) == 2  # bad: complete, fail


def test_a_failure_the_database_refuses_is_logged_and_the_others_are_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "flowlane")
    store = FakeStore()
    refused, fine = _failed(), _failed()
    store.failing_runs.add(refused.task.run_id)
    assert _send(store, [refused, fine], []) == Counters(failed=1)
    [not_sent] = _events(caplog, "result_not_sent")
    assert not_sent["run_id"] == refused.task.run_id
    assert not_sent["note"] == "left for stalled recovery"


def test_counters_add_up() -> None:
    total = Counters(claimed=2)
    total.add(Counters(completed=1, failed=2, rejected=3))
    total.add(Counters(claimed=1, completed=1))
    assert total.as_dict() == {"claimed": 3, "completed": 2, "failed": 2, "rejected": 3}


# -- HandlerThreads -------------------------------------------------------------


def _in_loop(body: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(body())


def _call(threads: HandlerThreads, func: Callable[..., Any]) -> Any:
    """``func`` run by ``threads``, awaited on a fresh event loop."""

    async def submit() -> Any:
        return await threads.submit(func)

    return asyncio.run(submit())


def test_handler_threads_run_sync_handlers_side_by_side() -> None:
    threads = HandlerThreads(3)
    together = threading.Barrier(3, timeout=30)  # breaks unless all three run at once

    def handler(value: int) -> tuple[int, str]:
        together.wait()
        return value * 2, threading.current_thread().name

    async def body() -> list[Any]:
        return list(await asyncio.gather(*(threads.submit(handler, i) for i in range(3))))

    try:
        results = _in_loop(body)
    finally:
        threads.close()
    assert [value for value, _ in results] == [0, 2, 4]
    assert len({name for _, name in results}) == 3
    assert all(name.startswith("flowlane-handler-") for _, name in results)


def test_handler_threads_carry_errors_to_the_loop() -> None:
    threads = HandlerThreads(1)

    def raises(exc: BaseException) -> None:
        raise exc

    async def outcome(exc: BaseException) -> BaseException:
        with pytest.raises(BaseException) as info:
            await threads.submit(raises, exc)
        return info.value

    def raised_by(exc: BaseException) -> BaseException:
        return _in_loop(lambda: outcome(exc))  # type: ignore[no-any-return]

    try:
        assert isinstance(raised_by(ValueError("bad input")), ValueError)
        # what a Future cannot carry becomes HandlerCrashed; the thread survives each
        for exc in (SystemExit(3), KeyboardInterrupt(), StopIteration()):
            crashed = raised_by(exc)
            assert isinstance(crashed, HandlerCrashed)
            assert type(exc).__name__ in str(crashed)
        assert _call(threads, lambda: "still serving") == "still serving"
    finally:
        threads.close()


def test_a_sync_handler_returning_a_coroutine_is_awaited_in_its_thread() -> None:
    threads = HandlerThreads(1)

    async def inner() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    try:
        name = _call(threads, inner)
    finally:
        threads.close()
    assert name == "flowlane-handler-0"


def test_outcomes_queued_before_the_loop_runs_are_settled_by_one_call() -> None:
    threads = HandlerThreads(1)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(4)]
        for i, future in enumerate(futures[:3]):  # a burst: one _settle_done scheduled
            threads._queue_outcome(loop, (future, i, None))
        assert [len(waiting) for waiting in threads._settling.values()] == [3]
        await asyncio.sleep(0)
        assert [f.result() for f in futures[:3]] == [0, 1, 2] and not threads._settling
        threads._queue_outcome(loop, (futures[3], None, ValueError("later")))  # schedules anew
        with pytest.raises(ValueError, match="later"):
            await futures[3]

    try:
        _in_loop(body)
    finally:
        threads.close()


def test_an_outcome_for_a_closed_loop_is_dropped() -> None:
    threads = HandlerThreads(1)
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    loop.close()
    try:
        threads._queue_outcome(loop, (future, "late", None))
        assert threads._settling == {} and not future.done()
        assert _call(threads, lambda: "next") == "next"
    finally:
        threads.close()


def test_a_queued_handler_starts_when_a_thread_takes_it_and_an_abandoned_one_never_runs() -> None:
    # the threads are the slots: queued handlers wait for one; a cancelled one is skipped
    threads = HandlerThreads(1)
    release = threading.Event()
    ran: list[str] = []
    starts: list[float] = []

    def handler(name: str) -> str:
        if name == "first":
            release.wait(30)
        ran.append(name)
        return name

    async def body() -> list[str]:
        first = threads.submit(handler, "first", start=starts.append)
        abandoned = threads.submit(handler, "abandoned", start=starts.append)
        last = threads.submit(handler, "last", start=starts.append)
        abandoned.cancel()  # before the only thread is free
        await asyncio.sleep(0)
        assert len(starts) <= 1  # the queued ones have not started
        release.set()
        return [await first, await last]

    try:
        assert _in_loop(body) == ["first", "last"]
    finally:
        threads.close()
    assert ran == ["first", "last"]  # the abandoned handler never ran
    assert len(starts) == 2 and starts == sorted(starts)


def test_an_abandoned_handler_keeps_its_thread_and_close_lets_idle_threads_exit() -> None:
    threads = HandlerThreads(1)
    started, release = threading.Event(), threading.Event()

    def blocked() -> str:
        started.set()
        release.wait(30)
        return "late"

    async def abandon() -> None:
        future = threads.submit(blocked)
        assert await asyncio.to_thread(started.wait, 30)
        future.cancel()  # shutdown abandons it; its loop ends before the handler does

    _in_loop(abandon)
    release.set()  # the result has no loop to go to: dropped, the thread lives on
    assert _call(threads, lambda: "next") == "next"
    [thread] = threads._threads
    threads.close()
    thread.join(30)
    assert not thread.is_alive()


# -- Backoff ------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_and_starts_over_on_reset() -> None:
    drawn: list[tuple[float, float]] = []

    def no_jitter(low: float, high: float) -> float:
        drawn.append((low, high))
        return 1.0

    backoff = Backoff(0.1, 1.0, uniform=no_jitter)
    assert [round(backoff.next(), 6) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert set(drawn) == {JITTER}
    backoff.reset()
    assert backoff.next() == pytest.approx(0.1)


def test_backoff_jitter_scales_each_delay_within_its_bounds() -> None:
    low = Backoff(1.0, 8.0, uniform=lambda lo, hi: lo)
    high = Backoff(1.0, 8.0, uniform=lambda lo, hi: hi)
    assert [low.next() for _ in range(3)] == [0.75, 1.5, 3.0]
    assert [high.next() for _ in range(3)] == [1.25, 2.5, 5.0]
    real = Backoff(2.0, 2.0)
    assert all(1.5 <= real.next() <= 2.5 for _ in range(200))


def test_retry_later_logs_and_waits_the_next_delay(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "flowlane")
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    backoff = Backoff(0.5, 5.0, uniform=lambda lo, hi: 1.0)
    error = psycopg.OperationalError("terminating connection")
    asyncio.run(backoff.retry_later("poller", error, sleep, pending=4))
    asyncio.run(backoff.retry_later("poller", error, sleep))
    assert waited == [0.5, 1.0]
    first, second = _events(caplog, "database_unavailable")
    assert first == {"event": "database_unavailable", "component": "poller",
                     "error": "OperationalError: terminating connection", "pending": 4,
                     "retry_in": "0.50s"}
    assert second["retry_in"] == "1.00s"


# -- WorkerConfig ----------------------------------------------------------------


def test_worker_config_defaults_and_limits() -> None:
    config = WorkerConfig()
    assert (config.poll_interval, config.shutdown_timeout, config.requeue_interval) == (2, 30, 15)
    assert (config.notify, config.compile, config.log_level, config.log_format) == (
        True, False, "INFO", "text")
    assert config.changed() == {}
    assert config.limits(None) == (defaults.MAX_CONCURRENT, defaults.BATCH_SIZE)
    document = WorkerDoc("jobs_worker", "jobs", ("shared",), max_concurrent=3, batch_size=7)
    assert config.limits(document) == (3, 7)
    assert WorkerConfig(max_concurrent=9).limits(document) == (9, 7)
    assert WorkerConfig(batch_size=2).limits(None) == (defaults.MAX_CONCURRENT, 2)


def test_worker_config_is_frozen_and_stores_tuples() -> None:
    config = WorkerConfig(queue="q", flows=["a", "b"], import_paths=["lib"], log_level="debug")
    assert (config.flows, config.import_paths, config.log_level) == (("a", "b"), ("lib",), "DEBUG")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.queue = "other"  # type: ignore[misc]
    assert config.changed() == {"queue": "q", "flows": ("a", "b"), "import_paths": ("lib",),
                                "log_level": "DEBUG"}


@pytest.mark.parametrize(
    ("options", "message", "hint"),
    [
        ({"max_concurrent": 0}, "max_concurrent must be at least 1, not 0", "--max-concurrent"),
        ({"batch_size": -2}, "batch_size must be at least 1, not -2", "--batch-size"),
        ({"batch_size": 2.5}, "batch_size must be a whole number, not 2.5", "--batch-size"),
        ({"max_concurrent": True}, "max_concurrent must be a whole number", "--max-concurrent"),
        ({"read_vt": 0}, "read_vt must be at least 1", "read_vt takes a positive whole number"),
        ({"poll_interval": 0}, "poll_interval must be a positive number of seconds, not 0",
         "--poll-interval takes seconds greater than 0"),
        ({"poll_interval": float("nan")}, "must be a positive number of seconds, not nan",
         "--poll-interval"),
        ({"poll_interval": float("inf")}, "not inf", "--poll-interval"),
        ({"requeue_interval": -1}, "requeue_interval must be a positive number", "--requeue"),
        ({"heartbeat_interval": "5"}, "heartbeat_interval must be a number of seconds, not '5'",
         "--heartbeat-interval"),
        ({"shutdown_timeout": -1}, "shutdown_timeout must be 0 or more seconds, not -1",
         "--shutdown-timeout 0 abandons"),
        ({"shutdown_timeout": float("nan")}, "shutdown_timeout must be 0 or more", "0 abandons"),
        ({"log_level": "LOUD"}, "log_level must be one of DEBUG, INFO, WARNING, ERROR, not 'LOUD'",
         "--log-level DEBUG"),
        ({"log_format": "xml"}, "log_format must be one of text, json", "--log-format"),
        ({"queue": ""}, "queue must be a non-empty string, not ''", "leave queue out"),
        ({"flow": 3}, "flow must be a non-empty string, not 3", "leave flow out"),
        ({"flows": "a,b"}, "flows must be a list of strings, not 'a,b'", "flows=['a', 'b']"),
        ({"flows": ["a", ""]}, "flows must be a non-empty string, not ''", "flows"),
        ({"import_paths": [1]}, "import_paths must be a non-empty string", "import_paths"),
        ({"notify": "no"}, "notify must be True or False, not 'no'", None),
        ({"dsn": 5}, "dsn must be a connection string, not 5", None),
    ],
)
def test_worker_config_refuses_bad_values_with_a_hint(
    options: dict[str, Any], message: str, hint: str | None
) -> None:
    with pytest.raises(errors.UsageError) as info:
        WorkerConfig(**options)
    assert message in str(info.value)
    assert info.value.exit_code == 2
    if hint is not None:
        assert info.value.hint is not None and hint in info.value.hint


def test_worker_config_accepts_whole_seconds_and_zero_shutdown_timeout() -> None:
    config = WorkerConfig(poll_interval=1, shutdown_timeout=0, dsn="")
    assert (config.poll_interval, config.shutdown_timeout, config.dsn) == (1, 0, "")


def test_from_options_replaces_given_values_and_names_unknown_options() -> None:
    base = WorkerConfig(queue="q", batch_size=4)
    assert WorkerConfig.from_options(base, batch_size=8) == WorkerConfig(queue="q", batch_size=8)
    assert WorkerConfig.from_options(queue="q") == WorkerConfig(queue="q")
    with pytest.raises(errors.UsageError, match=r"unknown worker option\(s\): concurrency, qeue") as e:
        WorkerConfig.from_options(qeue="q", concurrency=3)
    assert e.value.hint is not None and "max_concurrent" in e.value.hint
    with pytest.raises(errors.UsageError, match="max_concurrent must be at least 1"):
        WorkerConfig.from_options(base, max_concurrent=0)


# -- flowlane worker / serve arguments (in-process: no worker, no database) --------------


def _worker_args(*argv: str) -> WorkerConfig:
    return worker_config(build_parser().parse_args(["worker", *argv]))


def test_the_worker_command_passes_only_what_the_user_gave() -> None:
    assert _worker_args("--queue", "q").changed() == {"queue": "q"}
    given = _worker_args(
        "--flow", "f", "--max-concurrent", "4", "--no-notify", "--compile", "--import-path", "a",
        "--import-path", "b", "--poll-interval", "0.5", "--shutdown-timeout", "0",
        "--log-format", "json", "--heartbeat-interval", "1",
    )
    assert given.changed() == {
        "flow": "f", "max_concurrent": 4, "notify": False, "compile": True,
        "import_paths": ("a", "b"), "poll_interval": 0.5, "shutdown_timeout": 0.0,
        "log_format": "json", "heartbeat_interval": 1.0,
    }
    assert _worker_args("--queue", "q", "--flows", " a, ,b ").flows == ("a", "b")
    assert _worker_args("--queue", "q", "--flows", " , ").flows is None  # blank: not given


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--queue", "q", "--batch-size", "0"], "batch_size must be at least 1, not 0"),
        (["--queue", "q", "--max-concurrent", "-3"], "max_concurrent must be at least 1, not -3"),
        (["--poll-interval", "nan"], "poll_interval must be a positive number of seconds"),
        (["--requeue-interval", "0"], "requeue_interval must be a positive number of seconds"),
        (["--shutdown-timeout", "-1"], "shutdown_timeout must be 0 or more seconds, not -1"),
        (["--log-level", "chatty"], "log_level must be one of DEBUG, INFO, WARNING, ERROR"),
    ],
)
def test_worker_command_refuses_bad_numbers_before_loading_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-flows")  # never read: the options fail first
    assert main(["worker", missing, *argv]) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err
    assert re.search(r"^hint: .*--[a-z]", err, re.MULTILINE), err


@pytest.mark.parametrize("argv", [["--max-concurrent", "many"], ["--poll-interval", "soon"]])
def test_worker_command_refuses_text_for_numbers(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["worker", "--queue", "q", *argv])
    assert info.value.code == 2
    assert "invalid" in capsys.readouterr().err


ONE_FLOW = """\
kind: flow
slug: orders
queues: {charge: jobs}
steps:
  charge: {handler: "json:dumps"}
"""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "a worker needs --queue Q, --flow F, --flow F --step S, or --name of a worker"),
        (["--queue", "jobs", "--flow", "orders"], "--queue cannot be combined with --flow/--step"),
        (["--queue", "jobs", "--step", "charge"], "--queue cannot be combined with --flow/--step"),
        (["--name", "nobody"], "no `kind: worker` document is named 'nobody'"),
        (["--queue", "nowhere"], "no step of the project is routed to queue 'nowhere'"),
    ],
)
def test_worker_command_refuses_a_missing_or_contradictory_selection(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "flows.yaml").write_text(ONE_FLOW)
    assert main(["worker", str(tmp_path / "flows.yaml"), *argv]) == 2  # before any database
    assert f"error: {message}" in capsys.readouterr().err


def test_serve_starts_each_worker_from_its_config_not_from_a_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from flowlane.runtime import launch
    from flowlane.runtime.serve import plan_workers

    served = worker_config(build_parser().parse_args(
        ["serve", "--log-format", "json", "--shutdown-timeout", "2.5", "--import-path", "/lib"]))
    project = project_from_text(SHUTDOWN_FLOW + "---\nkind: worker\nname: w\nqueue: f\nflows: [f]\n")
    [spec] = plan_workers(project, served)
    assert spec.config == WorkerConfig(name="w", shutdown_timeout=2.5, log_format="json",
                                       import_paths=("/lib",))
    command = launch.worker_command(["flows"], spec.config)
    assert command[1:3] == ["-m", "flowlane.runtime.launch"]
    handed = json.loads(command[3])
    assert handed["paths"] == [os.path.abspath("flows")]
    # the launched worker reads back exactly the settings serve planned, none of its defaults
    assert WorkerConfig.from_options(**handed["config"]) == spec.config
    assert set(handed["config"]) == {"name", "shutdown_timeout", "log_format", "import_paths"}
    with pytest.raises(ValueError, match="FLOWLANE_DSN"):  # a password never goes in argv
        launch.worker_command(["flows"], WorkerConfig(queue="q", dsn="postgresql://u:pw@h/db"))
    assert main(["serve", "--shutdown-timeout", "-1"]) == 2
    assert "error: shutdown_timeout must be 0 or more seconds" in capsys.readouterr().err


def test_a_worker_process_freezes_what_it_holds_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from flowlane.runtime import launch

    (tmp_path / "f.yaml").write_text(SHUTDOWN_FLOW)
    frozen_when_serving: list[int] = []
    monkeypatch.setattr(Worker, "run", lambda self: frozen_when_serving.append(gc.get_freeze_count()))
    gc.unfreeze()
    try:
        launch.run_worker([str(tmp_path)], WorkerConfig(queue="f", handle_signals=False))
    finally:
        gc.unfreeze()
    assert frozen_when_serving and frozen_when_serving[0] > 0


def test_a_claim_shares_each_runs_input_by_position_even_when_it_is_json_null() -> None:
    from flowlane.runtime.store import _claim

    def row(msg_id: int, run: str, flow_input: Any) -> Row:
        return {"outcome": "claimed", "flow_slug": "f", "step_slug": "s", "queue_name": "f",
                "run_id": run, "task_index": msg_id, "input": None, "flow_input": flow_input,
                "attempt": 1, "msg_id": msg_id}

    # claim_tasks sends a run's input on its first row only; a JSON null input reads as None
    claim = _claim([row(1, "a", None), row(2, "b", {"x": 1}), row(3, "a", None), row(4, "b", None)])
    assert [(t.run_id, t.flow_input) for t in claim.tasks] == [
        ("a", None), ("b", {"x": 1}), ("a", None), ("b", {"x": 1})]
    assert claim.tasks[1].flow_input is claim.tasks[3].flow_input
    assert claim.batch == [1, 2, 3, 4]


# -- shutdown ---------------------------------------------------------------------

SHUTDOWN_FLOW = """\
kind: flow
slug: f
steps:
  s: {handler: json:dumps}
"""


class LeaseStore:
    def __init__(self) -> None:
        self.extended: list[dict[str, Any]] = []

    async def extend_leases(self, worker_id: str, held: list[dict[str, Any]]) -> int:
        self.extended.extend(held)
        return len(held)


def test_shutdown_abandons_running_handlers_and_keeps_leasing_results_not_yet_committed() -> None:
    worker = Worker(project_from_text(SHUTDOWN_FLOW), queue="f", handle_signals=False, shutdown_timeout=0)
    store = LeaseStore()

    async def body() -> None:
        session = Session(store, None, None, None)  # type: ignore[arg-type]
        never = asyncio.Event()

        async def held_until_cancelled() -> None:
            await never.wait()

        running = asyncio.create_task(held_until_cancelled())
        queued = asyncio.create_task(held_until_cancelled())
        session.held[running] = InFlightTask(_task(0), 0.0)  # its handler still runs
        session.held[queued] = InFlightTask(_task(1), 0.0, running=False)  # its result waits for the flusher
        for handle in (running, queued):
            handle.add_done_callback(session.finished)
        await worker._drain_in_flight(session)
        await asyncio.wait([running])
        # the running handler is abandoned; the finished one waits for the flusher, still held
        assert [held.task.task_index for held in session.held.values()] == [1]
        await worker._extend_leases(session, time.monotonic())
        assert [item["task_index"] for item in store.extended] == [1]  # its lease is renewed
        queued.cancel()

    _in_loop(body)


def test_a_worker_claims_beyond_its_slots_only_while_its_handlers_are_short() -> None:
    # a prefetched task's timeout runs from its claim: it must not wait long for a slot
    worker = Worker(project_from_text(SHUTDOWN_FLOW), queue="f", handle_signals=False,
                    max_concurrent=8, batch_size=50)

    async def body() -> None:
        session = Session(None, None, None, None)  # type: ignore[arg-type]
        assert worker._prefetch(session) == 0  # no handler has returned: nothing known yet
        session.handler_returned(0.001)
        assert session.capacity.is_set()  # the slot is free before the result commits
        assert worker._prefetch(session) == 50  # the 8 slots run 800 in 0.1 s: a batch
        session.handler_seconds = 0.04
        assert worker._prefetch(session) == 20  # what the 8 slots run in 0.1 s
        for _ in range(20):
            session.handler_returned(5.0)
        assert worker._prefetch(session) == 0

    _in_loop(body)


class BlockingStore(FakeStore):
    """The first ``complete_tasks`` call waits for ``release``; the others answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.first_called = asyncio.Event()

    async def complete_tasks(self, completions: list[dict[str, Any]]) -> list[TaskOutcome]:
        if not self.first_called.is_set():
            self.first_called.set()
            await self.release.wait()
        return await super().complete_tasks(completions)


def test_a_result_commits_while_an_earlier_commit_is_still_in_flight() -> None:
    worker = Worker(project_from_text(SHUTDOWN_FLOW), queue="f", handle_signals=False)
    store = BlockingStore()

    async def body() -> None:
        session = Session(None, None, ResultSender(store, WORKER), None)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        flusher = asyncio.create_task(worker._flush_loop(session))
        session.results.put_nowait((_ok(), first))
        await store.first_called.wait()
        session.results.put_nowait((_ok(), second))
        # committed by a second flush while the first still waits for its commit (a flusher
        # with one commit in flight never gets here: the deadline only turns a hang into a failure)
        await asyncio.wait_for(second, 30)
        assert not first.done()
        store.release.set()
        await first
        session.results.put_nowait(None)
        await flusher
        assert [len(items) for _, items in store.calls] == [1, 1]
        assert session.counters.completed == 2

    _in_loop(body)


def _running_handlers(session: Session, claims: list[float]) -> list[InFlightTask]:
    """Handlers that hold a slot and still run, claimed at ``claims`` (the same time: claimed
    together); their tasks' indexes are their positions."""
    loop = asyncio.get_running_loop()
    helds = [InFlightTask(_task(i), claimed_at, started=True) for i, claimed_at in enumerate(claims)]
    for held in helds:
        session.held[loop.create_future()] = held  # type: ignore[index]
    return helds


def _finish(session: Session, held: InFlightTask) -> asyncio.Future[None]:
    """The handler of ``held`` returns: its result goes to the flusher."""
    held.running = False
    committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    session.results.put_nowait((TaskResult(held.task, ok=True, output=held.task.task_index), committed))
    return committed


async def _turns(n: int = 20) -> None:
    """Let the other tasks of the loop take ``n`` turns (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


Scenario = Callable[[Session, list[InFlightTask], FakeStore], Coroutine[Any, Any, None]]


def _flush_calls(
    monkeypatch: pytest.MonkeyPatch, gather: float, claims: list[float], scenario: Scenario
) -> list[list[int]]:
    """Run the flusher with ``RESULT_GATHER = gather`` and handlers still running, claimed at
    ``claims``, through ``scenario``, then stop it: the task indexes of each
    ``complete_tasks`` call."""
    monkeypatch.setattr(results_module, "RESULT_GATHER", gather)
    worker = Worker(project_from_text(SHUTDOWN_FLOW), queue="f", handle_signals=False)
    store = FakeStore()

    async def body() -> None:
        session = Session(None, None, ResultSender(store, WORKER), None)  # type: ignore[arg-type]
        helds = _running_handlers(session, claims)
        flusher = asyncio.create_task(worker._flush_loop(session))
        await scenario(session, helds, store)
        session.results.put_nowait(None)
        await flusher

    _in_loop(body)
    return [[item["task_index"] for item in items] for _, items in store.calls]


def test_results_of_handlers_finishing_together_share_one_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(session: Session, helds: list[InFlightTask], store: FakeStore) -> None:
        first = _finish(session, helds[0])
        await _turns()
        assert store.calls == []  # the other handler still runs: the result waits for it
        await asyncio.wait_for(asyncio.gather(first, _finish(session, helds[1])), 30)

    # a gather of 30 s: its end would only turn a hang into a failure
    assert _flush_calls(monkeypatch, 30.0, [0.0, 0.0], scenario) == [[0, 1]]


def test_a_result_with_no_handler_left_running_is_sent_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(session: Session, helds: list[InFlightTask], store: FakeStore) -> None:
        await asyncio.wait_for(_finish(session, helds[0]), 30)  # a wait for nothing would hang

    assert _flush_calls(monkeypatch, 30.0, [0.0], scenario) == [[0]]


def test_a_result_waits_for_running_handlers_at_most_the_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(session: Session, helds: list[InFlightTask], store: FakeStore) -> None:
        first, slow = helds
        await asyncio.wait_for(_finish(session, first), 30)
        assert slow.running and len(store.calls) == 1  # sent without the slow handler's result
        await asyncio.wait_for(_finish(session, slow), 30)

    assert _flush_calls(monkeypatch, 0.0, [0.0, 0.0], scenario) == [[0], [1]]


def test_a_result_does_not_wait_for_handlers_of_another_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(session: Session, helds: list[InFlightTask], store: FakeStore) -> None:
        first, other = helds
        await asyncio.wait_for(_finish(session, first), 30)  # a wait for the other would hang
        assert other.running and len(store.calls) == 1
        await asyncio.wait_for(_finish(session, other), 30)

    assert _flush_calls(monkeypatch, 30.0, [0.0, 1.0], scenario) == [[0], [1]]


def test_a_flush_that_crashes_stops_the_flusher_without_waiting_for_another_result() -> None:
    worker = Worker(project_from_text(SHUTDOWN_FLOW), queue="f", handle_signals=False)
    store = FakeStore()
    store.errors = [RuntimeError("a bug in the flush")]

    async def body() -> None:
        session = Session(None, None, ResultSender(store, WORKER), None)  # type: ignore[arg-type]
        flusher = asyncio.create_task(worker._flush_loop(session))
        session.results.put_nowait((_ok(), asyncio.get_running_loop().create_future()))
        with pytest.raises(RuntimeError, match="a bug in the flush"):
            await asyncio.wait_for(flusher, 30)  # the deadline only turns a hang into a failure

    _in_loop(body)


def test_handler_durations_keep_sub_millisecond_resolution() -> None:
    from prometheus_client import REGISTRY

    from flowlane.runtime import metrics

    task = dataclasses.replace(_task(), flow_slug="fast_flow", step_slug="fast_step")
    labels = {"flow": "fast_flow", "step": "fast_step"}

    def sample(name: str, **extra: str) -> float:
        return REGISTRY.get_sample_value(f"flowlane_handler_duration_seconds_{name}",
                                         {**labels, **extra}) or 0.0

    before_sum, before_fast = sample("sum"), sample("bucket", le="0.001")
    metrics.task_finished(task, TaskResult(task, ok=True, output=1, seconds=0.0004))
    assert sample("sum") - before_sum == pytest.approx(0.0004)  # not 0: no whole milliseconds
    assert sample("bucket", le="0.001") - before_fast == 1
    assert TaskResult(task, ok=True, seconds=0.0004).duration_ms == 0  # the log line's whole ms


def test_every_stop_moves_the_lifecycle_forward_and_keeps_the_heaviest_reason() -> None:
    worker = Worker(project_from_text(SHUTDOWN_FLOW), queue="f", handle_signals=False)
    assert worker.phase is Phase.STARTING and worker.stopped_by is None
    worker.stop()  # before run(): the session starts stopped
    assert worker.phase is Phase.DRAINING and worker.not_ready() == ["the worker is stopping"]
    crashed = Stop(StopReason.CRASHED, "crashed")
    assert worker._request_stop(crashed)  # a crash outweighs a request
    assert not worker._request_stop(Stop(StopReason.SIGNAL))
    assert worker._request_stop(Stop(StopReason.DEPRECATED, "deprecated"))  # and is outweighed
    assert not worker._request_stop(Stop(StopReason.OUTDATED, "outdated"))  # the first of equals
    assert worker.stopped_by is not None and worker.stopped_by.reason is StopReason.DEPRECATED
    worker.stop(force=True)  # a second signal, or stop(force=True): abandon running handlers
    assert worker.phase is Phase.ABANDONING
