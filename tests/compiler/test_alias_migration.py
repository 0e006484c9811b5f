"""Aliases: set_alias, alias history, resolve_flow, one slug namespace."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.slow


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


def test_deleting_an_alias_version(flows: psycopg.Connection[Any]) -> None:
    # 0004: the active version is refused naming the alias (was a bare FK violation);
    # a draining version leaves the draining list with a history row (was left dangling)
    conn = flows
    conn.execute("select flowlane.set_alias('orders', 'orders_v3', array['orders_v1', 'orders_v2'])")
    with pytest.raises(psycopg.errors.ForeignKeyViolation,
                       match='flow "orders_v3" is the active version of alias orders') as raised:
        conn.execute("select flowlane.delete_flow_and_data('orders_v3')")
    assert "set_alias" in (raised.value.diag.message_hint or "")
    assert one(conn, "select count(*) from flowlane.flows") == 3
    conn.execute("select flowlane.delete_flow_and_data('orders_v1')")
    assert conn.execute("select flow_slug, draining from flowlane.aliases").fetchall() == [
        ("orders_v3", ["orders_v2"])]
    assert history(conn)[-1] == ("orders", "orders_v3", ["orders_v2"])
    assert one(conn, "select flowlane.resolve_flow('orders')") == "orders_v3"


def test_an_alias_adopts_the_name_of_a_flow_it_lists(flows: psycopg.Connection[Any]) -> None:
    # 0016: a project that started with the bare slug `orders_v1` puts its next version
    # behind an alias of that name; the name then means the alias
    conn = flows
    run = one(conn, "select (flowlane.start_flow('orders_v1', '{}'::jsonb)).flow_slug")
    assert run == "orders_v1"
    conn.execute("select flowlane.set_alias('orders_v1', 'orders_v2', array['orders_v1'])")
    assert one(conn, "select flowlane.resolve_flow('orders_v1')") == "orders_v2"
    assert one(conn, "select (flowlane.start_flow('orders_v1', '{}'::jsonb)).flow_slug") == "orders_v2"
    # the adopted flow's compiled SQL applies again (create_flow's upsert), options and all
    conn.execute("select flowlane.create_flow('orders_v1', max_attempts => 5)")
    assert one(conn, "select opt_max_attempts from flowlane.flows where flow_slug = 'orders_v1'") == 5
    # it may drain and be active again, but the alias may not let go of the name's flow
    conn.execute("select flowlane.set_alias('orders_v1', 'orders_v1', array['orders_v2'])")
    with pytest.raises(psycopg.errors.UniqueViolation, match="conflicts with flow") as raised:
        conn.execute("select flowlane.set_alias('orders_v1', 'orders_v3')")
    assert "draining => array['orders_v1']" in (raised.value.diag.message_hint or "")
    assert history(conn) == [("orders_v1", "orders_v2", ["orders_v1"]),
                             ("orders_v1", "orders_v1", ["orders_v2"])]


def test_only_the_flow_an_alias_lists_spelled_the_same_may_share_its_name(
        flows: psycopg.Connection[Any]) -> None:
    conn = flows
    for call in ("select flowlane.set_alias('orders_v1', 'orders_v2')",  # does not list it
                 "select flowlane.set_alias('ORDERS_V1', 'orders_v2', array['orders_v1'])"):
        with pytest.raises(psycopg.Error, match="conflicts with flow"):
            conn.execute(call)
    conn.execute("select flowlane.set_alias('orders_v1', 'orders_v2', array['orders_v1'])")
    with pytest.raises(psycopg.Error, match='conflicts with existing flow "orders_v1"'):
        conn.execute("select flowlane.create_flow('Orders_V1')")
    # deleting the adopted flow leaves the alias with the name to itself
    conn.execute("select flowlane.delete_flow_and_data('orders_v1')")
    assert conn.execute("select flow_slug, draining from flowlane.aliases").fetchall() == [
        ("orders_v2", [])]
    with pytest.raises(psycopg.Error, match='conflicts with alias "orders_v1"'):
        conn.execute("select flowlane.create_flow('orders_v1')")
