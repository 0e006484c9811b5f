"""A worker on a queue with limits (``kind: queue``): claims that the limits hold back make
it wait, not crash or spin, and the queue's concurrency holds across its handler slots."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import psycopg
import pytest

from flowlane import load_project
from flowlane.runtime.store import _claim
from flowlane.runtime.worker import Worker
from tests.runtime.rt_support import PROJECT, start_run, step, wait_run


@pytest.fixture
def handlers() -> Iterator[object]:
    sys.path.insert(0, str(PROJECT))
    import rt_handlers

    rt_handlers.GAUGE.update(now=0, peak=0)
    yield rt_handlers
    sys.path.remove(str(PROJECT))


def test_a_held_back_claim_says_how_long_to_wait() -> None:
    row = {"outcome": "rate_limited", "msg_id": None, "input": {"wait_ms": 400}}
    assert _claim([row]).rate_limited_ms == 400
    full = _claim([{"outcome": "at_capacity", "msg_id": None, "input": {"started": 2}}])
    assert full.at_capacity and not full.batch and not full.tasks


def test_the_queue_concurrency_holds_below_the_workers_slots(flows_dsn: str, handlers: object) -> None:
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        conn.execute("select flowlane.set_queue_limits('rt_gauge', 2, null, null)")
    worker = Worker(load_project(PROJECT / "flows"), flow="rt_gauge", dsn=flows_dsn,
                    max_concurrent=10, batch_size=10, handle_signals=False,
                    import_paths=[str(PROJECT)])
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert worker.ready.wait(60)
        run_id = start_run(flows_dsn, "rt_gauge", list(range(6)))
        state = wait_run(flows_dsn, run_id)
        assert step(state, "fan")["output"] == list(range(6))
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert handlers.GAUGE["peak"] == 2  # type: ignore[attr-defined]  # 10 slots, limit 2
    assert worker.stats["completed"] == 6 and worker.stats["rejected"] == 0
    with psycopg.connect(flows_dsn) as conn:
        assert conn.execute("select max(attempts_count) from flowlane.step_tasks "
                            "where run_id = %s", (run_id,)).fetchone() == (1,)
