"""The engine's lock order under load: claims, completions, failures, starts and cancels of
runs with a map step, from many connections at once, never deadlock.

Real connections drive the public SQL functions as workers, producers and operators do;
the test asserts outcomes (every run ended, every task once) and that PostgreSQL's
deadlock counter for the database did not move.
"""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine
from tests.core.test_races import deadlocks, run_threads

pytestmark = pytest.mark.slow

FIRST_RUNS = 100
LATER_RUNS = 40
WORKERS = 4
MAP_WIDTH = 10


def serve(dsn: str, barrier: threading.Barrier, producing: threading.Event) -> None:
    """A worker: claim a batch with claim_tasks, send its results with one complete_tasks and
    one fail_tasks (every seventh map task fails once and is retried), until no run is left."""
    worker_id = uuid.uuid4()
    pairs = Jsonb([["chain", "head"], ["chain", "fan"], ["chain", "tail"]])
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        while True:
            claimed = conn.execute(
                "select run_id, step_slug, task_index, attempt from flowlane.claim_tasks('chain', 10, %s, %s)"
                " where outcome = 'claimed'", (worker_id, pairs)).fetchall()
            if not claimed:
                left = conn.execute(
                    "select count(*) from flowlane.runs where status in ('started', 'waiting')").fetchone()
                if left == (0,) and not producing.is_set():
                    return
                continue
            done: list[dict[str, Any]] = []
            failed: list[dict[str, Any]] = []
            for run_id, step, index, attempt in claimed:
                item = {"run_id": str(run_id), "step_slug": step, "task_index": index,
                        "worker_id": str(worker_id), "attempt": attempt}
                if step == "fan" and index % 7 == 3 and attempt == 1:
                    failed.append({**item, "error_message": "once"})
                else:
                    output = list(range(MAP_WIDTH)) if step == "head" else index
                    done.append({**item, "output": output})
            if done:
                conn.execute("select count(*) from flowlane.complete_tasks(%s)", (Jsonb(done),))
            if failed:
                conn.execute("select count(*) from flowlane.fail_tasks(%s)", (Jsonb(failed),))


def produce(
    dsn: str, barrier: threading.Barrier, producing: threading.Event, started: list[uuid.UUID]
) -> None:
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            for n in range(LATER_RUNS):
                row = conn.execute("select run_id from flowlane.start_flow('chain', %s)",
                                   (Jsonb({"n": n}),)).fetchone()
                assert row is not None
                started.append(row[0])
    finally:
        producing.clear()


def cancel(dsn: str, barrier: threading.Barrier, runs: list[uuid.UUID]) -> None:
    """An operator cancelling runs while their map's tasks are being claimed and completed:
    each run once some of its map's tasks have completed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        pending = list(runs)
        while pending:
            ready = {r[0] for r in conn.execute(
                "select distinct t.run_id from flowlane.step_tasks t where t.run_id = any (%s)"
                " and t.step_slug = 'fan' and t.status = 'completed'", (pending,))}
            if not ready and conn.execute(
                    "select count(*) from flowlane.runs where run_id = any (%s) and status = 'started'",
                    (pending,)).fetchone() == (0,):
                return
            for run_id in sorted(ready, key=pending.index):
                try:
                    conn.execute("select flowlane.cancel_run(%s, 'stress')", (run_id,))
                except psycopg.errors.ObjectNotInPrerequisiteState:
                    pass  # its last task completed first: the run is no longer running
                pending.remove(run_id)


def test_workers_starts_and_cancels_of_maps_never_deadlock(engine: Engine, dsn: str) -> None:
    engine.define("chain", [("head", [], {}), ("fan", ["head"], {"step_type": "map"}),
                            ("tail", ["fan"], {})], max_attempts=3, base_delay=0)
    runs = [engine.start("chain", {"n": n}) for n in range(FIRST_RUNS)]
    doomed = random.Random(7).sample(runs, FIRST_RUNS // 3)
    producing = threading.Event()
    producing.set()
    later: list[uuid.UUID] = []
    before = deadlocks(engine)

    def act(n: int, barrier: threading.Barrier) -> None:
        if n < WORKERS:
            serve(dsn, barrier, producing)
        elif n == WORKERS:
            produce(dsn, barrier, producing, later)
        else:
            cancel(dsn, barrier, doomed)

    failures = run_threads(WORKERS + 2, act)
    assert [(str(f), f.diag.context) for f in failures
            if isinstance(f, psycopg.Error) and f.sqlstate == "40P01"] == []  # deadlock_detected
    assert failures == []
    assert deadlocks(engine) - before == 0
    statuses = engine.rows("select status, count(*) as n from flowlane.runs group by 1")
    assert {r["status"] for r in statuses} <= {"completed", "cancelled"}
    assert sum(r["n"] for r in statuses) == FIRST_RUNS + LATER_RUNS
    assert engine.scalar(
        "select count(*) from flowlane.step_tasks where status in ('queued', 'started')") == 0


@pytest.mark.parametrize("claim", ["claim_tasks", "start_tasks"])
def test_a_claim_hands_back_a_message_whose_task_another_transaction_holds(
    engine: Engine, dsn: str, claim: str
) -> None:
    """The holder here refuses nothing and writes nothing (a result it will reject holds the row
    so): the message is visible again at once, not hidden for the claim's lease."""
    engine.define("held", [("only", [], {})])
    run_id = engine.start("held", {})
    pairs = Jsonb([["held", "only"]])
    with psycopg.connect(dsn) as holder:
        holder.execute("select 1 from flowlane.step_tasks where run_id = %s for update", (run_id,))
        if claim == "claim_tasks":
            claimed = engine.rows("select * from flowlane.claim_tasks('held', 10, %s, %s)",
                                  (engine.worker_id, pairs))
        else:
            claimed = engine.claim("held")
        [message] = engine.queue_messages("held")
        assert claimed == [] and engine.vt_in("held", message["msg_id"]) <= 0
    [task] = engine.claim("held")
    assert task["run_id"] == run_id and task["attempt"] == 1
