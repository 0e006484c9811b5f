"""Autovacuum settings of the queue and engine tables (benchmarks/bloat.py measures them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.core import migrator
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

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


def test_queues_of_the_original_core_are_tuned_by_the_upgrade(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        Engine(conn).define("older", [("one", [], {})])
        assert reloptions(conn, "pgmq.q_older") == set()
        migrator.migrate(conn)
        assert QUEUE_OPTIONS <= reloptions(conn, "pgmq.q_older")


def _xact_updates(engine: Engine, table: str) -> dict[str, int]:
    return engine.row(
        "select pg_stat_get_xact_tuples_updated(%(t)s::regclass) as updated, "
        "pg_stat_get_xact_tuples_hot_updated(%(t)s::regclass) as hot", {"t": table})


def test_a_claim_and_a_completion_enter_and_leave_the_index_of_started_tasks(engine: Engine) -> None:
    # the started tasks are what step_tasks_started_idx holds (status in its predicate): a
    # claim and a completion write index entries, never HOT, and stalled recovery and the
    # concurrency limits read that index, not the table's history
    engine.define("started", [("one", [], {})])
    runs = {engine.start("started", {"n": n}) for n in range(40)}
    with engine.conn.transaction():
        claimed = engine.claim("started")
        counts = _xact_updates(engine, "flowlane.step_tasks")
    assert {t["run_id"] for t in claimed} == runs
    assert counts == {"updated": 40, "hot": 0}
    assert {r["run_id"] for r in _started_by_index(engine)} == runs
    for task in claimed:
        engine.complete(task, {})
    assert _started_by_index(engine) == []


def _started_by_index(engine: Engine) -> list[dict[str, Any]]:
    with engine.conn.transaction():
        engine.conn.execute("set local enable_seqscan = off")
        engine.conn.execute("set local enable_bitmapscan = off")
        query = "select run_id from flowlane.step_tasks where status = 'started'"
        assert "step_tasks_started_idx" in str(engine.scalar(f"explain (format json) {query}"))
        return engine.rows(query)


def test_a_completion_updates_its_step_in_place(engine: Engine) -> None:
    # no index predicate reads step_states.status: a completion writes no new index entries
    # into step_states, unless a page ran out of room; the task leaves the index of started
    # tasks (a new index entry: not HOT)
    # (a map step of one task: a root single step keeps its state in its task instead)
    engine.define("hot_done", [("one", [], {"step_type": "map"})])
    runs = {engine.start("hot_done", [n]) for n in range(40)}
    claimed = engine.claim("hot_done")
    items = [{"run_id": str(t["run_id"]), "step_slug": t["step_slug"], "task_index": t["task_index"],
              "output": {"n": 1}, "worker_id": str(engine.worker_id), "attempt": t["attempt"]}
             for t in claimed]
    engine.scalar("select pg_stat_force_next_flush()")  # the claim's counts leave the pending ones
    with engine.conn.transaction():
        done = engine.rows("select status from flowlane.complete_tasks(%s)", (Jsonb(items),))
        tasks = _xact_updates(engine, "flowlane.step_tasks")
        steps = _xact_updates(engine, "flowlane.step_states")
    assert [r["status"] for r in done] == ["completed"] * 40
    assert tasks == {"updated": 40, "hot": 0}
    assert steps["updated"] == 40 and steps["hot"] >= 30, steps
    assert {r["run_id"] for r in engine.rows(
        "select run_id from flowlane.runs where status = 'completed'")} == runs
    assert _started_by_index(engine) == []


def test_a_root_step_of_one_task_keeps_its_state_in_its_task(engine: Engine) -> None:
    # a run started alone: its root step of one task writes no step_states row, from its start
    # to its completion; all_step_states reads the state the task holds
    engine.define("in_task", [("one", [], {}), ("two", ["one"], {})])
    run_id = engine.start("in_task", {"n": 1})
    assert engine.statuses(run_id) == {"one": "started", "two": "created"}
    engine.scalar("select pg_stat_force_next_flush()")
    with engine.conn.transaction():
        (task,) = engine.claim("in_task")
        engine.complete(task, {"m": 2})
        inserted = engine.scalar(
            "select pg_stat_get_xact_tuples_inserted('flowlane.step_states'::regclass)")
        steps = _xact_updates(engine, "flowlane.step_states")
    assert inserted == 0 and steps["updated"] == 1  # the dependent's row only
    assert engine.scalar("select count(*) from flowlane.step_states where step_slug = 'one'") == 0
    state = engine.states(run_id)["one"]
    assert (state["status"], state["output"], state["remaining_tasks"]) == ("completed", {"m": 2}, 0)
    assert engine.statuses(run_id) == {"one": "completed", "two": "started"}


def test_the_states_of_a_run_read_by_its_id_through_both_indexes(engine: Engine) -> None:
    # all_step_states' second part (the states tasks hold) is a subquery: a run's id given (or
    # a lateral reference, as coverage's) reaches it as a condition, never a join key
    engine.define("by_id", [("one", [], {}), ("two", ["one"], {})])
    run_id = engine.start("by_id", {})
    queries = [
        ("select * from flowlane.all_step_states where run_id = %s", (run_id,)),
        (("select ss.step_slug from flowlane.runs r cross join lateral (select v.step_slug "
          "from flowlane.all_step_states v where v.run_id = r.run_id offset 0) ss "
          "where r.status = 'started'"), ()),
    ]
    with engine.conn.transaction():
        engine.conn.execute("set local enable_seqscan = off")
        for query, params in queries:
            plan = str(engine.scalar(f"explain (format json) {query}", params))
            assert "step_states_pkey" in plan and "step_tasks_pkey" in plan, plan
            assert "Seq Scan" not in plan, plan
    assert sorted(r["step_slug"] for r in engine.rows(queries[0][0], queries[0][1])) == ["one", "two"]
