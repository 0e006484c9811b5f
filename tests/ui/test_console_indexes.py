"""The console's queries on indexes: the throughput chart's BRIN index on a database upgraded
with tasks in it, and the runs list's keyset queries on the runs indexes."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from flowlane.core import migrator
from flowlane.core.queries import query
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

NO_FILTER = {"status": None, "since": None, "until": None,
             "after_started_at": None, "after_run_id": None, "limit": 51}


def _plan(conn: psycopg.Connection[Any], name: str, **params: Any) -> str:
    conn.execute("set enable_seqscan = off")  # a few rows: make the planner show what it can do
    rows = conn.execute("explain " + query(name), {**NO_FILTER, **params}).fetchall()
    return "\n".join(r[0] for r in rows)


def test_upgrade_keeps_the_tasks_and_the_chart_reads_only_recent_ones(
        db_factory: Callable[..., str]) -> None:
    dsn = db_factory("0002")
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("ping", [("ping", [], {})])
        runs = [engine.start("ping", {"n": n}) for n in range(3)]
        engine.drive("ping", lambda task: {"pong": True})
        assert [m.version for m in migrator.migrate(conn)] == [m.version for m in migrator.discover()][2:]
        assert migrator.migrate(conn) == []  # twice changes nothing
        done = conn.execute("select count(*) from flowlane.step_tasks where status = 'completed' "
                            "and run_id = any(%s)", (runs,)).fetchone()
        assert done == (3,)
        conn.execute("set enable_indexscan = off")  # BRIN serves bitmap scans only
        plan = _plan(conn, "console_queue_throughput", minutes=15)
        assert "Bitmap Index Scan on step_tasks_completed_brin" in plan, plan
        assert "Index Cond: ((completed_at IS NOT NULL) AND (completed_at > " in plan, plan


def test_runs_list_pages_on_indexes(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # with sequential scans disabled a plan still shows one where no index can serve it
        for name, params in (("console_runs", {}), ("console_runs", {"status": "failed"}),
                             ("client_list_runs", {"flows": None, "parent": None, "before": None,
                                                    "limit": 20})):
            plan = _plan(conn, name, **params)
            assert "Index" in plan and "Seq Scan" not in plan, plan
        # what a page of runs waits for: by run id, parent run id and worker id, never a scan
        plan = _plan(conn, "run_waits", run_ids=[str(uuid.uuid4()) for _ in range(50)])
        assert "Seq Scan on runs" not in plan and "Seq Scan on step_tasks" not in plan, plan
        assert "runs_parent_idx" in plan, plan
        # several flows (an alias): one bounded index range per flow, so only (flows x page size)
        # rows are ever sorted, however many runs the flows have
        plan = _plan(conn, "console_runs_of_flows", flows=["ping", "orders_v1", "orders_v2"])
        per_flow = plan[plan.index("Nested Loop"):]
        assert "Limit" in per_flow and "Index Cond: (flow_slug = f.flow_slug)" in per_flow, plan
