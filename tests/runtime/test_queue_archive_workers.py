"""A worker on a queue whose archive is off (``archive: false`` in its ``kind: queue``
document): its runs complete as on any queue, every task keeps its queue and message id,
and the messages of the ended tasks are deleted: the queue and its archive are empty."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from flowlane import load_project
from flowlane.runtime.worker import Worker
from tests.runtime.rt_support import PROJECT, start_run, step, wait_run

pytestmark = pytest.mark.slow

RUNS = 4


def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_runs_complete_on_a_queue_without_archive_and_its_archive_stays_empty(flows_dsn: str) -> None:
    _rows(flows_dsn, "select flowlane.set_queue_limits('rt_diamond', null, null, null, archive => false)")
    worker = Worker(load_project(PROJECT / "flows"), flow="rt_diamond", dsn=flows_dsn,
                    max_concurrent=4, batch_size=10, handle_signals=False, import_paths=[str(PROJECT)])
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.ready.wait(60)
        run_ids = [start_run(flows_dsn, "rt_diamond", {"numbers": list(range(n + 2))}) for n in range(RUNS)]
        states = [wait_run(flows_dsn, run_id) for run_id in run_ids]
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert [s["run"]["status"] for s in states] == ["completed"] * RUNS
    assert [step(s, "total")["output"]["count"] for s in states] == [n + 2 for n in range(RUNS)]
    assert worker.stats["rejected"] == 0
    tasks = _rows(flows_dsn, "select queue_name, message_id from flowlane.step_tasks "
                             "where run_id = any (%s::uuid[])", run_ids)
    assert worker.stats["completed"] == len(tasks) > RUNS * 4
    assert {queue for queue, _ in tasks} == {"rt_diamond"}
    assert all(message_id is not None for _, message_id in tasks)
    assert _rows(flows_dsn, "select count(*) from pgmq.q_rt_diamond") == [(0,)]
    assert _rows(flows_dsn, "select count(*) from pgmq.a_rt_diamond") == [(0,)]
