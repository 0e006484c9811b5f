"""The Python API: ``Worker(...).run()`` in a thread, ``stop()``; concurrency bound; log hygiene."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from flowlane import errors, load_project
from flowlane.runtime.worker import Worker
from tests.runtime.rt_support import PROJECT, WorkerProcess, start_run, step, wait_run, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def handlers() -> Iterator[object]:
    sys.path.insert(0, str(PROJECT))
    import rt_handlers

    yield rt_handlers
    sys.path.remove(str(PROJECT))


def test_at_most_max_concurrent_handlers_run(flows_dsn: str, handlers: object) -> None:
    worker = Worker(
        load_project(PROJECT / "flows"),
        flow="rt_gauge",
        dsn=flows_dsn,
        max_concurrent=3,
        batch_size=10,
        handle_signals=False,
        import_paths=[str(PROJECT)],
    )
    before = _handler_threads()
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.ready.wait(60)
        run_id = start_run(flows_dsn, "rt_gauge", list(range(12)))
        state = wait_run(flows_dsn, run_id)
        assert step(state, "fan")["output"] == list(range(12))
    finally:
        sync_threads = _handler_threads()
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert handlers.GAUGE["peak"] == 3  # type: ignore[attr-defined]
    assert worker.stats["completed"] == 12 and worker.stats["rejected"] == 0
    # sync handlers run in threads: one per slot
    assert len(sync_threads - before) == 3


def _handler_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("flowlane-handler-")}


def test_a_worker_serving_async_handlers_starts_no_handler_thread(
    flows_dsn: str, handlers: object, tmp_path: Path
) -> None:
    before = _handler_threads()
    worker = Worker(load_project(PROJECT / "flows"), flow="rt_slow_async", dsn=flows_dsn,
                    handle_signals=False, import_paths=[str(PROJECT)])
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.ready.wait(60)
        idle = _handler_threads() - before
        run_id = start_run(flows_dsn, "rt_slow_async", {"dir": str(tmp_path)})
        wait_until(lambda: any(tmp_path.glob(f"started-{run_id}-*")), message="the async handler")
        busy = _handler_threads() - before
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert idle == set() and busy == set()  # max_concurrent is 200 here: no thread for any slot
    assert step(wait_run(flows_dsn, run_id), "hold")["output"] == {"saw_shutdown": True}


def test_json_logs_carry_ids_and_never_payloads(
    flows_dsn: str, spawn: Callable[..., WorkerProcess]
) -> None:
    worker = spawn("--flow", "rt_diamond", "--log-level", "DEBUG", "--log-format", "json")
    secret = 987654321
    run_id = start_run(flows_dsn, "rt_diamond", {"numbers": [secret], "token": "s3cr3t"})
    wait_run(flows_dsn, run_id, workers=[worker])
    assert worker.stop() == 0
    events = [json.loads(line) for line in worker.text().splitlines() if line.strip()]
    names = [e.get("event") for e in events]
    assert {"worker_started", "task_started", "task_completed", "worker_stopped"} <= set(names)
    completed = [e for e in events if e.get("event") == "task_completed"]
    assert {e["step"] for e in completed} == {"split", "square", "meta", "total"}
    assert all(e["run_id"] == run_id and "task_index" in e and "attempt" in e for e in completed)
    text = worker.text()
    assert str(secret) not in text and "s3cr3t" not in text


def test_info_logs_counters_not_a_line_per_task(
    flows_dsn: str, spawn: Callable[..., WorkerProcess]
) -> None:
    worker = spawn("--flow", "rt_diamond", "--log-level", "INFO", "--log-format", "json")
    run_id = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2, 3]})
    wait_run(flows_dsn, run_id, workers=[worker])
    assert worker.stop() == 0
    events = [json.loads(line) for line in worker.text().splitlines() if line.strip()]
    names = {e.get("event") for e in events}
    assert not names & {"task_started", "task_completed"}
    [stopped] = [e for e in events if e.get("event") == "worker_stopped"]
    assert stopped["completed"] == 6 and stopped["claimed"] == 6


def test_heartbeats_and_deprecation_stop_the_worker(flows_dsn: str) -> None:
    worker = Worker(
        load_project(PROJECT / "flows"),
        flow="rt_diamond",
        dsn=flows_dsn,
        heartbeat_interval=0.05,
        handle_signals=False,
        import_paths=[str(PROJECT)],
    )
    ended: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except errors.WorkerDeprecated as exc:
            ended.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert worker.ready.wait(60)
        with psycopg.connect(flows_dsn, autocommit=True) as conn:

            def beats() -> bool:
                row = conn.execute(
                    "select last_heartbeat_at > started_at from flowlane.workers"
                    " where worker_id = %s",
                    (worker.worker_id,),
                ).fetchone()
                return bool(row and row[0])

            wait_until(beats, message="a heartbeat")
            conn.execute(
                "update flowlane.workers set deprecated_at = now() where worker_id = %s",
                (worker.worker_id,),
            )
        thread.join(60)  # the next heartbeat sees the deprecation and stops gracefully
        assert not thread.is_alive()
        [deprecated] = ended  # then asks to be restarted with the rollout's definitions
        assert isinstance(deprecated, errors.WorkerDeprecated)
        assert deprecated.exit_code == errors.WorkerExit.RESTART
        with psycopg.connect(flows_dsn, autocommit=True) as conn:
            row = conn.execute("select stopped_at is not null from flowlane.workers").fetchone()
        assert row == (True,)
    finally:
        worker.stop()
        thread.join(60)


def test_a_worker_prunes_finished_runs_past_their_retention(flows_dsn: str, handlers: object) -> None:
    from flowlane.runtime.client import Client

    with Client(flows_dsn) as client:
        old = [client.start("rt_gauge", [1]).run_id for _ in range(2)]
        for run_id in old:
            client.cancel(run_id)
        recent = client.start("rt_gauge", [2]).run_id
        client.cancel(recent)
    with psycopg.connect(flows_dsn, autocommit=True) as conn:  # cancelled 31 days ago
        conn.execute("update flowlane.runs set started_at = started_at - interval '31 days', "
                     "cancelled_at = cancelled_at - interval '31 days' where run_id = any (%s)", (old,))
        worker = Worker(load_project(PROJECT / "flows"), flow="rt_gauge", dsn=flows_dsn,
                        handle_signals=False, import_paths=[str(PROJECT)])
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            def pruned() -> bool:
                return conn.execute("select count(*) from flowlane.runs where run_id = any (%s)",
                                    (old,)).fetchone() == (0,)

            wait_until(pruned, timeout=60, message="the worker's maintenance to prune")
            assert conn.execute("select status from flowlane.runs where run_id = %s",
                                (recent,)).fetchone() == ("cancelled",)
        finally:
            worker.stop()
            thread.join(60)
    assert not thread.is_alive()
