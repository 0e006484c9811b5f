"""Workers on a queue with limits (``kind: queue``): a claim the limits hold back makes a
worker wait, not crash or spin; the queue's concurrency holds below a worker's handler
slots; and a rate limit holds across real worker processes: the starts recorded in the
database never exceed the token bucket's rule (at most ``limit`` at once, then ``limit``
per ``per`` seconds), however many workers claim."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane import load_project
from flowlane.runtime.store import _claim
from flowlane.runtime.worker import Worker
from tests.runtime.rt_support import PROJECT, WorkerProcess, start_run, step, wait_run, wait_until

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]
LIMIT, PER, RUNS = 5, 1, 30


def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_four_workers_never_start_more_than_the_rate_limit_allows(flows_dsn: str, spawn: Spawn) -> None:
    _rows(flows_dsn, "select flowlane.set_queue_limits('rt_jobs', null, %s, %s)", LIMIT, PER)
    workers = [spawn("--name", "rt_jobs_worker", "--poll-interval", "30") for _ in range(4)]
    _rows(flows_dsn, "select 1 from flowlane.start_flows('rt_shared_b', %s::jsonb[])",
          [Jsonb({"value": n}) for n in range(RUNS)])

    def all_done() -> bool:
        for w in workers:
            assert w.proc.poll() is None, w.text()
        return _rows(flows_dsn, "select count(*) from flowlane.runs where flow_slug = 'rt_shared_b' "
                                "and status = 'completed'") == [(RUNS,)]

    wait_until(all_done, timeout=120, interval=0.2, message="every run to complete")
    starts = [r[0] for r in _rows(
        flows_dsn, "select extract(epoch from started_at)::float8 from flowlane.step_tasks "
                   "where queue_name = 'rt_jobs' and attempts_count = 1 order by started_at")]
    assert len(starts) == RUNS
    # the token bucket: any n consecutive starts span at least (n - LIMIT) / rate seconds, so
    # in any window of t seconds at most LIMIT + t * LIMIT / PER start (1 s: at most 10)
    rate = LIMIT / PER
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            allowed = LIMIT + (starts[j] - starts[i]) * rate + 1e-6
            assert j - i + 1 <= allowed, f"starts {i}..{j} within {starts[j] - starts[i]:.3f} s"
    per_second: dict[int, int] = {}
    for t in starts:
        per_second[int(t)] = per_second.get(int(t), 0) + 1
    assert max(per_second.values()) <= 2 * LIMIT
    # the throttle was the rate limit (the workers were refused and slept), not their slots
    assert sum(w.text().count("poller_rate_limited") for w in workers) > 0
    assert starts[-1] - starts[0] >= (RUNS - LIMIT) / rate - 1e-6


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
