"""Migration 0008_console_indexes: an upgrade with runs in the database, and the runs list's
keyset queries served in index order (no sort of the whole table)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import ui_support

from flowlane.core import migrator
from flowlane.core.queries import query
from tests.core.engine import Engine

NO_FILTER = {"status": None, "since": None, "until": None,
             "after_started_at": None, "after_run_id": None, "limit": 51}


def _plan(conn: psycopg.Connection[Any], name: str, **params: Any) -> str:
    conn.execute("set enable_seqscan = off")  # a few rows: make the planner show what it can do
    rows = conn.execute("explain " + query(name), {**NO_FILTER, **params}).fetchall()
    return "\n".join(r[0] for r in rows)


def test_upgrade_keeps_the_runs_and_serves_every_runs_filter_in_index_order(
        db_factory: Callable[..., str]) -> None:
    dsn = db_factory("0005")
    ui_support.apply_flows(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        runs = {engine.start("ping", {"n": n}) for n in range(5)}
        migrator.migrate(conn)
        assert {r[0] for r in conn.execute("select run_id from flowlane.runs")} == runs
        indexes = {r[0] for r in conn.execute(
            "select indexname from pg_indexes where schemaname = 'flowlane' and tablename = 'runs'")}
        assert {"runs_keyset_idx", "runs_flow_keyset_idx", "runs_status_keyset_idx"} <= indexes
        assert not {"runs_flow_idx", "runs_status_idx", "runs_started_idx"} & indexes

        for name, params, index in (("console_runs", {}, "runs_keyset_idx"),
                                    ("console_runs", {"status": "started"}, "runs_status_keyset_idx")):
            plan = _plan(conn, name, **params)
            assert f"Index Scan Backward using {index}" in plan, plan
            assert "Sort" not in plan, plan
        # `flowlane runs` pages in the same order, through the same index
        plan = _plan(conn, "client_list_runs", flows=None, before=None, limit=20)
        assert "Index Scan Backward using runs_keyset_idx" in plan and "Sort" not in plan, plan
        # several flows (an alias): one index range per flow, each stopped at the page size,
        # so only (flows x page size) rows are ever sorted
        plan = _plan(conn, "console_runs_of_flows", flows=["ping", "orders_v1", "orders_v2"])
        per_flow = plan[plan.index("Nested Loop"):]
        assert "Limit" in per_flow and "Index Scan Backward using runs_flow_keyset_idx" in per_flow, plan


@pytest.mark.parametrize("version", ["0005"])
def test_migrating_twice_changes_nothing(db_factory: Callable[..., str], version: str) -> None:
    dsn = db_factory(version)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert [m.version for m in migrator.migrate(conn)][-1] == "0008"
        assert migrator.migrate(conn) == []
