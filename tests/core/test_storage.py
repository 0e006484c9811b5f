"""0010: autovacuum settings of the queue and engine tables (benchmarks/bloat.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from flowlane.core import migrator
from tests.core.engine import Engine

QUEUE_OPTIONS = {"autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000",
                 "autovacuum_vacuum_cost_delay=0"}


def reloptions(conn: psycopg.Connection[Any], table: str) -> set[str]:
    row = conn.execute("select reloptions from pg_class where oid = %s::regclass",
                       (table,)).fetchone()
    assert row is not None
    return set(row[0] or [])


def test_a_new_queue_table_is_tuned_when_its_step_is_added(engine: Engine) -> None:
    engine.define("tuned", [("one", [], {})])
    assert QUEUE_OPTIONS <= reloptions(engine.conn, "pgmq.q_tuned")
    for table in ("flowlane.step_tasks", "flowlane.step_states", "flowlane.runs"):
        assert "autovacuum_vacuum_scale_factor=0.02" in reloptions(engine.conn, table)


def test_queues_from_before_0010_are_tuned_by_the_upgrade(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("0007"), autocommit=True) as conn:
        Engine(conn).define("older", [("one", [], {})])
        assert reloptions(conn, "pgmq.q_older") == set()
        migrator.migrate(conn)
        assert QUEUE_OPTIONS <= reloptions(conn, "pgmq.q_older")



def test_a_claim_updates_step_tasks_in_place_and_leases_the_tasks(engine: Engine) -> None:
    # 0011: no index covers what a claim changes, and fillfactor 50 leaves each row about
    # its own size free on its page: a claim is a HOT update (no new index entries) unless
    # the page ran out of room (a claimed row is 24 bytes longer: started_at, worker id)
    assert "fillfactor=50" in reloptions(engine.conn, "flowlane.step_tasks")
    engine.define("hot", [("one", [], {})])
    runs = {engine.start("hot", {"n": n}) for n in range(40)}
    with engine.conn.transaction():
        claimed = engine.claim("hot")
        counts = engine.row(
            "select pg_stat_get_xact_tuples_updated(%(t)s::regclass) as updated, "
            "pg_stat_get_xact_tuples_hot_updated(%(t)s::regclass) as hot", {"t": "flowlane.step_tasks"})
    assert {t["run_id"] for t in claimed} == runs
    assert counts["updated"] == 40 and counts["hot"] >= 30, counts  # before 0011: 0
    leased = engine.rows("select run_id from flowlane.task_leases")
    assert {r["run_id"] for r in leased} == runs
    for task in claimed:
        engine.complete(task, {})
    assert engine.scalar("select count(*) from flowlane.task_leases") == 0
