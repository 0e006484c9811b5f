"""Races on one queue through the public SQL functions: claim storms, sweeper races, and the
accounting of attempts (only a run handler consumes one; backoff and exhaustion are exact).

Many real connections start together behind a barrier; every assertion is about outcomes
(deliveries, claims, completions, history rows), never about timing or engine internals.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

STORM_ITEMS = 600


def run_threads(count: int, target: Callable[[int, threading.Barrier], None]) -> list[BaseException]:
    """Run ``target(n, barrier)`` in ``count`` threads that pass one barrier together."""
    barrier = threading.Barrier(count)
    failures: list[BaseException] = []

    def guarded(n: int) -> None:
        try:
            target(n, barrier)
        except BaseException as exc:  # reported by the test
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return failures


def deadlocks(engine: Engine) -> int:
    engine.conn.execute("select pg_stat_clear_snapshot()")
    return int(engine.scalar(
        "select deadlocks from pg_stat_database where datname = current_database()"))


@pytest.mark.parametrize("claimers", [16, 64])
def test_claim_storm_hands_each_message_to_one_claimer_within_its_window(
    engine: Engine, dsn: str, claimers: int
) -> None:
    engine.define("storm", [("items", [], {"step_type": "map"})], timeout=30)
    run_id = engine.start("storm", list(range(STORM_ITEMS)))
    deliveries: list[tuple[int, int, datetime, datetime]] = []  # msg, claimer, read at, vt
    claims: list[tuple[int, int, int]] = []  # task index, attempt, claimer
    before = deadlocks(engine)

    def claimer(n: int, barrier: threading.Barrier) -> None:
        worker_id = uuid.uuid4()
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            while True:
                read = conn.execute(
                    "select msg_id, clock_timestamp(), vt from pgmq.read('storm', 30, 5)"
                ).fetchall()
                deliveries.extend((r[0], n, r[1], r[2]) for r in read)  # list.extend is atomic
                if not read:
                    left = conn.execute(
                        "select count(*) from flowlane.step_tasks where run_id = %s"
                        " and status in ('queued', 'started')", (run_id,)).fetchone()
                    if left == (0,):
                        return
                    continue
                claimed = conn.execute(
                    "select run_id, step_slug, task_index, attempt from flowlane.start_tasks("
                    "'storm', %s, %s, %s) where outcome = 'claimed'",
                    ([r[0] for r in read], worker_id, Jsonb([["storm", "items"]]))).fetchall()
                claims.extend((r[2], r[3], n) for r in claimed)
                for run, step, index, attempt in claimed:
                    row = conn.execute(
                        "select status from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                        (run, step, index, Jsonb(index), worker_id, attempt)).fetchone()
                    assert row == ("completed",), row

    assert run_threads(claimers, claimer) == []  # a deadlock (40P01) would be raised here
    by_message: defaultdict[int, list[tuple[datetime, datetime, int]]] = defaultdict(list)
    for msg_id, n, read_at, vt in deliveries:
        by_message[msg_id].append((read_at, vt, n))
    overlapping = [
        (msg_id, first, second)
        for msg_id, handed in by_message.items()
        for first, second in zip(sorted(handed), sorted(handed)[1:], strict=False)
        if second[0] < first[1]  # handed again before the first claimer's window ended
    ]
    assert overlapping == []
    assert len(by_message) == STORM_ITEMS
    assert sorted(index for index, _attempt, _n in claims) == list(range(STORM_ITEMS))
    assert {attempt for _index, attempt, _n in claims} == {1}
    assert len({n for _index, _attempt, n in claims}) > 1  # the claimers really competed
    assert engine.run(run_id)["status"] == "completed"
    assert engine.run(run_id)["output"] == {"items": list(range(STORM_ITEMS))}
    assert deadlocks(engine) - before == 0


def test_concurrent_sweeps_handle_each_stall_exactly_once(engine: Engine, dsn: str) -> None:
    # 120 stalled tasks; 4 sweepers race each other, 2 late completers of the stalled tasks
    # (the old owner's fenced results), 2 claimers of whatever the sweepers requeue, and 1
    # completer of the 80 healthy tasks
    engine.define("sweep", [("items", [], {"step_type": "map"})], timeout=5, max_attempts=3)
    run_id = engine.start("sweep", list(range(200)))
    claimed = engine.claim("sweep", qty=200)
    assert len(claimed) == 200
    stalled, healthy = claimed[:120], claimed[120:]
    engine.conn.execute(
        "update flowlane.step_tasks set started_at = now() - interval '1 hour',"
        " queued_at = now() - interval '1 hour' where run_id = %s and task_index = any(%s)",
        (run_id, [t["task_index"] for t in stalled]))
    swept: list[int] = []
    late_accepted: list[int] = []
    reclaimed: list[int] = []

    def complete(conn: psycopg.Connection[Any], task: dict[str, Any], worker: uuid.UUID,
                 attempt: int) -> tuple[str, int]:
        row = conn.execute(
            "select status, attempts_count from flowlane.complete_task(%s, 'items', %s, %s, %s, %s)",
            (run_id, task["task_index"], Jsonb(task["task_index"]), worker, attempt)).fetchone()
        assert row is not None
        return str(row[0]), int(row[1])

    def actor(n: int, barrier: threading.Barrier) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            if n < 4:
                for _ in range(5):
                    swept.append(int(conn.execute(
                        "select flowlane.requeue_stalled_tasks()").fetchone()[0]))  # type: ignore[index]
            elif n < 6:
                for task in stalled[n - 4::2]:
                    if complete(conn, task, engine.worker_id, 1) == ("completed", 1):
                        late_accepted.append(task["task_index"])
            elif n < 8:
                me = uuid.uuid4()
                for _ in range(20):
                    for task in Engine(conn).claim("sweep", qty=10, worker_id=me):
                        assert task["attempt"] == 2
                        assert complete(conn, task, me, 2) == ("completed", 2)
                        reclaimed.append(task["task_index"])
            else:
                for task in healthy:
                    assert complete(conn, task, engine.worker_id, 1) == ("completed", 1)

    assert run_threads(9, actor) == []
    stalls = Counter(r[0] for r in engine.conn.execute(
        "select task_index from flowlane.task_attempts where run_id = %s and outcome = 'stalled'",
        (run_id,)))
    assert sum(swept) == len(stalls) and set(stalls.values()) <= {1}  # each stall once
    assert set(stalls).isdisjoint(late_accepted)  # a task is either swept or completed late
    assert sum(swept) + len(late_accepted) == len(stalled)
    assert set(reclaimed) <= set(stalls)
    engine.drive("sweep", lambda task: task["task_index"])  # what the sweepers left visible
    assert engine.run(run_id)["status"] == "completed"
    assert engine.scalar("select max(attempts_count) from flowlane.step_tasks where run_id = %s",
                         (run_id,)) <= 2


RELEASES = st.lists(st.sampled_from(["read_not_claimed", "unsupported_batch", "over_read"]),
                    max_size=3)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_attempts=st.integers(1, 4), base_delay=st.integers(0, 40), releases=RELEASES)
def test_only_a_claimed_run_consumes_an_attempt_and_backoff_is_exact(
    engine: Engine, max_attempts: int, base_delay: int, releases: list[str]
) -> None:
    flow = f"acct_{uuid.uuid4().hex[:8]}"
    engine.define(flow, [("only", [], {})], max_attempts=max_attempts, base_delay=base_delay,
                  timeout=5)
    run_id = engine.start(flow, {})
    for attempt in range(1, max_attempts + 1):
        for release in releases:
            release_without_running(engine, flow, release)
            assert engine.task(run_id, "only")["attempts_count"] == attempt - 1, release
        (task,) = engine.claim(flow)
        assert task["attempt"] == attempt
        if "over_read" in releases:  # a second delivery of the started task: no attempt
            engine.make_visible(flow)
            assert engine.claim(flow) == []
            assert engine.task(run_id, "only")["attempts_count"] == attempt
        row = engine.fail(task)
        assert row is not None
        if attempt < max_attempts:
            assert row["status"] == "queued"
            expected = min(math.floor(base_delay * 2 ** attempt), 2_147_483_647)
            assert engine.scalar("select flowlane.calculate_retry_delay(%s, %s)",
                                 (base_delay, attempt)) == expected
            assert abs(engine.vt_in(flow, task["msg_id"]) - expected) < 1.0
            engine.make_visible(flow)
        else:
            assert row["status"] == "failed"
    assert engine.run(run_id)["status"] == "failed"
    assert engine.task(run_id, "only")["attempts_count"] == max_attempts
    assert engine.scalar("select count(*) from flowlane.task_attempts where run_id = %s",
                         (run_id,)) == max_attempts


def release_without_running(engine: Engine, flow: str, how: str) -> None:
    """Hand the queued task's message to a claimer that gives it back without running it."""
    if how == "read_not_claimed":  # the worker stopped between pgmq.read and start_tasks
        assert len(engine.read(flow)) == 1
        engine.make_visible(flow)
    elif how == "unsupported_batch":  # a worker that does not serve the pair
        rows = engine.classify(flow, engine.read(flow), [(flow, "other")])
        assert [r["outcome"] for r in rows] == ["unsupported"]
    # over_read: see the caller (it needs a started task)
