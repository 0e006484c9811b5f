"""Concurrent claimers and completers on one queue: no task lost or completed twice, no deadlock."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow


def worker_loop(
    dsn: str,
    queue: str,
    done: Counter[tuple[Any, str, int]],
    lock: threading.Lock,
    errors: list[BaseException],
) -> None:
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            engine = Engine(conn)
            idle = 0
            while idle < 3:
                tasks = engine.claim(queue, qty=3)
                if not tasks:
                    idle += 1
                    if conn.execute(
                        "select count(*) from flowlane.runs where status = 'started'"
                    ).fetchone() == (0,):
                        return
                    continue
                idle = 0
                for task in tasks:
                    row = engine.complete(task, task["input"] if task["step_slug"] == "m" else 1)
                    assert row is not None and row["status"] == "completed"
                    with lock:
                        done[(task["run_id"], task["step_slug"], task["task_index"])] += 1
    except Exception as exc:
        errors.append(exc)


def test_many_claimers_complete_every_task_exactly_once(engine: Engine, dsn: str) -> None:
    engine.define("f", [("m", [], {"step_type": "map"}), ("s", ["m"], {}), ("t", ["m"], {})])
    runs = [engine.start("f", list(range(8))) for _ in range(6)]
    done: Counter[tuple[Any, str, int]] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []
    for _ in range(5):  # several rounds: later steps appear as earlier ones complete
        threads = [
            threading.Thread(target=worker_loop, args=(dsn, "f", done, lock, errors))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        if all(engine.run(r)["status"] == "completed" for r in runs):
            break
    assert all(engine.run(r)["output"] == {"s": 1, "t": 1} for r in runs)
    assert len(done) == 6 * (8 + 2) and set(done.values()) == {1}
    assert (
        engine.scalar("select count(*) from flowlane.step_tasks where status <> 'completed'") == 0
    )
    assert engine.scalar("select count(*) from flowlane.step_tasks where attempts_count <> 1") == 0
    assert_invariants(engine)


def test_duplicate_delivery_claims_once(engine: Engine, dsn: str) -> None:
    engine.define("f", [("m", [], {"step_type": "map"})])
    run_id = engine.start("f", list(range(20)))
    ids = engine.read("f")
    results: list[list[dict[str, Any]]] = []
    barrier = threading.Barrier(3)

    def claim() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            other = Engine(conn)
            barrier.wait()
            results.append(other.start_tasks("f", ids, uuid.uuid4()))

    threads = [threading.Thread(target=claim) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    claimed = [t["task_index"] for batch in results for t in batch]
    assert sorted(claimed) == list(range(20))
    assert engine.scalar(
        "select array_agg(distinct attempts_count) from flowlane.step_tasks where run_id = %s",
        (run_id,),
    ) == [1]
