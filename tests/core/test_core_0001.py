"""Behaviour specific to migration 0001 (one queue per flow, created by create_flow)."""

from __future__ import annotations

import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def test_0001_create_flow_creates_queue_and_delete_drops_it(engine_0001: Engine) -> None:
    engine = engine_0001
    engine.define("orders", [("a", [], {})])
    assert engine.scalar("select count(*) from pgmq.list_queues() where queue_name = 'orders'") == 1
    engine.start("orders", {})
    engine.conn.execute("select flowlane.delete_flow_and_data('orders')")
    assert engine.scalar("select count(*) from pgmq.list_queues()") == 0


def test_0001_end_to_end_with_flow_slug_claims(engine_0001: Engine) -> None:
    engine = engine_0001
    engine.define("f", [("m", [], {"step_type": "map"}), ("s", ["m"], {})])
    run_id = engine.start("f", [1, 2])
    assert engine.drive("f", lambda t: t["input"]) == 3
    assert engine.run(run_id)["output"] == {"s": {"m": [1, 2]}}


def test_0001_message_id_nullable(engine_0001: Engine) -> None:
    nullable = engine_0001.scalar(
        "select is_nullable from information_schema.columns "
        "where table_schema = 'flowlane' and table_name = 'step_tasks' "
        "and column_name = 'message_id'"
    )
    assert nullable == "YES"


def test_0001_create_flow_creates_lowercase_queue_once(engine_0001: Engine) -> None:
    engine = engine_0001
    engine.create_flow("Orders", max_attempts=5)
    engine.create_flow("Orders", max_attempts=2)
    assert engine.scalar("select array_agg(queue_name) from pgmq.list_queues()") == ["orders"]
    assert engine.scalar("select opt_max_attempts from flowlane.flows") == 2
