"""Migration 0003_aliases: set_alias, alias history, resolve_flow, one slug namespace."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


def one(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


@pytest.fixture
def flows(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    for slug in ("orders_v1", "orders_v2", "orders_v3"):
        conn.execute("select flowlane.create_flow(%s)", (slug,))
    return conn


def history(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "select alias, flow_slug, draining from flowlane.alias_history order by id").fetchall()


def test_set_alias_is_idempotent_with_history_only_on_change(
        flows: psycopg.Connection[Any]) -> None:
    conn = flows
    conn.execute("select flowlane.set_alias('orders', 'orders_v1')")
    conn.execute("select flowlane.set_alias('orders', 'orders_v1')")
    conn.execute("select flowlane.set_alias(alias => 'orders', flow_slug => 'orders_v1', "
                 "draining => '{}')")
    assert history(conn) == [("orders", "orders_v1", [])]
    conn.execute("select flowlane.set_alias('orders', 'orders_v2', array['orders_v1'])")
    conn.execute("select flowlane.set_alias('orders', 'orders_v2', array['orders_v1'])")
    assert history(conn) == [("orders", "orders_v1", []),
                             ("orders", "orders_v2", ["orders_v1"])]
    row = conn.execute("select flow_slug, draining from flowlane.aliases").fetchall()
    assert row == [("orders_v2", ["orders_v1"])]


def test_resolve_flow_prefers_the_alias_and_falls_back_to_the_flow(
        flows: psycopg.Connection[Any]) -> None:
    conn = flows
    conn.execute("select flowlane.set_alias('orders', 'orders_v2')")
    assert one(conn, "select flowlane.resolve_flow('orders')") == "orders_v2"
    assert one(conn, "select flowlane.resolve_flow('orders_v1')") == "orders_v1"
    with pytest.raises(psycopg.Error, match='unknown flow "nothing"'):
        conn.execute("select flowlane.resolve_flow('nothing')")


def test_start_flow_on_an_alias_records_the_concrete_slug(
        flows: psycopg.Connection[Any]) -> None:
    conn = flows
    conn.execute("select flowlane.add_step('orders_v2', 'only')")
    conn.execute("select flowlane.set_alias('orders', 'orders_v2')")
    run = one(conn, "select (flowlane.start_flow('orders', '{}'::jsonb)).flow_slug")
    assert run == "orders_v2"


@pytest.mark.parametrize(("call", "message"), [
    ("select flowlane.set_alias('ORDERS_V1', 'orders_v2')", "conflicts with flow"),
    ("select flowlane.set_alias('orders', 'missing')", 'flow "missing" does not exist'),
    ("select flowlane.set_alias('orders', 'orders_v1', array['missing'])", "does not exist"),
    ("select flowlane.set_alias('orders', 'orders_v1', array['orders_v1'])", "listed twice"),
    ("select flowlane.set_alias('orders', 'orders_v1', array['orders_v2', 'orders_v2'])",
     "listed twice"),
    ("select flowlane.set_alias('bad__alias', 'orders_v1')", "invalid alias slug"),
])
def test_set_alias_rejects_bad_aliases_without_changes(
        flows: psycopg.Connection[Any], call: str, message: str) -> None:
    with pytest.raises(psycopg.Error, match=message):
        flows.execute(call)
    assert one(flows, "select count(*) from flowlane.aliases") == 0
    assert history(flows) == []


def test_alias_names_are_unique_case_insensitively_both_ways(
        flows: psycopg.Connection[Any]) -> None:
    conn = flows
    conn.execute("select flowlane.set_alias('orders', 'orders_v1')")
    with pytest.raises(psycopg.Error, match="conflicts with alias"):
        conn.execute("select flowlane.set_alias('Orders', 'orders_v1')")
    with pytest.raises(psycopg.Error, match='conflicts with alias "orders"'):
        conn.execute("select flowlane.create_flow('ORDERS')")
