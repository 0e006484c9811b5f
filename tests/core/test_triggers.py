"""Events in, in the SQL Core: a `kind: trigger` starts runs in the transaction of the row
change that caused it, one set per statement, filtered by its patterns, keyed, refusing what
the flow's input contract refuses; it runs as the flowlane owner."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from flowlane.core import migrator
from tests.core.engine import Engine
from tests.release_support import previous_release

pytestmark = pytest.mark.slow

ORDERS = "create table public.orders (id int primary key, status text not null, total int)"


def _flow(engine: Engine, contract: dict[str, Any] | None = None) -> None:
    engine.define("orders_flow", [("handle", [], {})])
    if contract is not None:
        engine.conn.execute("select flowlane.set_contract('orders_flow', null, %s)", (Jsonb(contract),))
    engine.conn.execute(ORDERS)


def _trigger(engine: Engine, name: str = "order_paid", **options: Any) -> dict[str, Any]:
    for field in ("when_pattern", "unless_pattern", "input_map"):
        if field in options:
            options[field] = Jsonb(options[field])
    return engine._call("set_trigger", {"trigger_name": name, "flow_name": "orders_flow",
                                        "table_name": "public.orders", "events": ["insert"], **options})


def _runs(engine: Engine) -> list[dict[str, Any]]:
    return engine.rows("select input, origin, idempotency_key from flowlane.runs order by input ->> 'id', "
                       "input ->> 'order_id'")


def test_a_rolled_back_insert_starts_nothing_and_a_committed_one_starts_one_run(
        engine: Engine) -> None:
    _flow(engine)
    _trigger(engine)
    with engine.conn.transaction(force_rollback=True):
        engine.conn.execute("insert into public.orders values (1, 'new', 10)")
        assert len(_runs(engine)) == 1  # started inside the transaction of the insert
    assert _runs(engine) == []
    engine.conn.execute("insert into public.orders values (2, 'new', 20)")
    runs = _runs(engine)
    assert [r["input"] for r in runs] == [{"id": 2, "status": "new", "total": 20}]
    assert runs[0]["origin"] == {"trigger": "order_paid", "op": "insert", "row": {"id": 2}}


def test_a_statement_of_ten_thousand_rows_starts_ten_thousand_runs(engine: Engine) -> None:
    _flow(engine)
    _trigger(engine, input_map={"order_id": "/new/id"})
    engine.conn.execute("insert into public.orders select i, 'new', i from generate_series(1, 10000) i")
    assert engine.scalar("select count(*) from flowlane.runs where flow_slug = 'orders_flow'") == 10000
    assert engine.scalar("select count(distinct input ->> 'order_id') from flowlane.runs") == 10000
    assert engine.scalar("select count(*) from flowlane.all_step_states where status = 'started'") == 10000


def test_when_and_unless_filter_updates(engine: Engine) -> None:
    _flow(engine)
    _trigger(engine, events=["update"], when_pattern={"new": {"status": "paid"}},
             unless_pattern={"old": {"status": "paid"}},
             input_map={"order_id": "/new/id", "was": "/old/status"})
    engine.conn.execute("insert into public.orders select i, 'new', i from generate_series(1, 4) i")
    assert _runs(engine) == []  # an insert is not an update
    engine.conn.execute("update public.orders set status = 'paid' where id in (1, 2)")
    engine.conn.execute("update public.orders set total = 0")  # 1, 2 stay paid: no change of status
    engine.conn.execute("update public.orders set status = 'shipped' where id = 3")
    assert [r["input"] for r in _runs(engine)] == [{"order_id": 1, "was": "new"},
                                                   {"order_id": 2, "was": "new"}]
    assert {r["origin"]["op"] for r in _runs(engine)} == {"update"}


def test_an_idempotency_key_makes_a_repeated_event_one_run(engine: Engine) -> None:
    _flow(engine)
    engine.conn.execute("create table public.payments (event_id text primary key, order_id int)")
    engine._call("set_trigger", {"trigger_name": "payment", "flow_name": "orders_flow",
                                 "table_name": "public.payments", "events": ["insert", "delete"],
                                 "key_pointer": "/new/order_id"})
    # key 7 twice in one statement, then again in another
    engine.conn.execute("insert into public.payments values ('a', 7), ('b', 7), ('c', 8)")
    engine.conn.execute("insert into public.payments values ('d', 7)")
    runs = engine.rows("select input, idempotency_key, called_as from flowlane.runs order by idempotency_key")
    assert [(r["input"]["event_id"], r["idempotency_key"], r["called_as"]) for r in runs] == [
        ("a", "payment:7", "orders_flow"), ("c", "payment:8", "orders_flow")]
    engine.conn.execute("delete from public.payments where event_id = 'c'")  # a delete has no /new: no key
    assert engine.scalar("select count(*) from flowlane.runs") == 3


def test_an_input_the_contract_refuses_fails_the_statement_with_the_path_and_rule(engine: Engine) -> None:
    _flow(engine, {"type": "object", "required": ["order_id"],
                   "properties": {"order_id": {"type": "integer", "minimum": 1}}})
    _trigger(engine, input_map={"order_id": "/new/id"})
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        engine.conn.execute("insert into public.orders values (5, 'new', 1), (0, 'new', 1)")
    message = str(refused.value)
    assert 'trigger "order_paid" on public.orders' in message
    assert "/order_id" in message and "minimum" in message, message
    assert engine.scalar("select count(*) from public.orders") == 0
    assert _runs(engine) == []


def test_on_refused_record_lets_the_row_commit_and_records_the_refusal(engine: Engine) -> None:
    _flow(engine, {"type": "object", "properties": {"order_id": {"type": "integer", "minimum": 1}}})
    _trigger(engine, input_map={"order_id": "/new/id"}, on_refused="record")
    engine.conn.execute("insert into public.orders values (5, 'new', 1), (0, 'new', 1)")
    assert engine.scalar("select count(*) from public.orders") == 2
    assert [r["input"] for r in _runs(engine)] == [{"order_id": 5}]
    activity = engine.row("select * from flowlane.trigger_activity()")
    assert activity is not None
    assert (activity["runs"], activity["refusals"]) == (1, 1)
    assert "/order_id" in activity["last_error"]


def test_the_application_role_needs_only_the_right_to_write_its_row(engine: Engine, dsn: str) -> None:
    migrator.migrate(engine.conn, roles=True)  # public loses every right on the flowlane schema
    _flow(engine)
    _trigger(engine)
    name, password = f"shop_{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    engine.conn.execute(sql.SQL("create role {} login password {}").format(sql.Identifier(name),
                                                                          sql.Literal(password)))
    engine.conn.execute(sql.SQL("grant insert on public.orders to {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(make_conninfo(dsn, user=name, password=password), autocommit=True) as app:
            app.execute("insert into public.orders values (1, 'new', 1)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute("select flowlane.start_flow('orders_flow', '{}')")
    finally:
        engine.conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(name)))
        engine.conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))
    assert [r["origin"]["row"] for r in _runs(engine)] == [{"id": 1}]


def test_set_trigger_is_idempotent_and_keep_only_triggers_removes_the_rest(engine: Engine) -> None:
    _flow(engine)
    first = _trigger(engine)
    assert _trigger(engine)["updated_at"] == first["updated_at"]
    _trigger(engine, events=["insert", "update"])
    names = "select tgname from pg_trigger where tgrelid = 'public.orders'::regclass order by 1"
    assert [r["tgname"] for r in engine.rows(names)] == ["flowlane_order_paid_insert",
                                                         "flowlane_order_paid_update"]
    assert engine.scalar("select flowlane.keep_only_triggers('{}')") == ["order_paid"]
    assert engine.rows(names) == []
    engine.conn.execute("insert into public.orders values (1, 'new', 1)")
    assert _runs(engine) == []


def test_set_trigger_refuses_an_unknown_flow_or_table(engine: Engine) -> None:
    _flow(engine)
    with pytest.raises(psycopg.errors.NoDataFound, match='unknown flow "missing"'):
        _trigger(engine, flow_name="missing")
    with pytest.raises(psycopg.errors.UndefinedTable):
        _trigger(engine, table_name="public.nothing")
    assert engine.scalar("select count(*) from flowlane.triggers") == 0


def test_a_flow_a_trigger_starts_cannot_be_deleted(engine: Engine) -> None:
    _flow(engine)
    _trigger(engine)
    with pytest.raises(psycopg.errors.DependentObjectsStillExist, match='started by trigger "order_paid"'):
        engine.conn.execute("select flowlane.delete_flow_and_data('orders_flow')")
    engine.conn.execute("select flowlane.keep_only_triggers('{}')")
    engine.conn.execute("select flowlane.delete_flow_and_data('orders_flow')")
    assert engine.scalar("select count(*) from flowlane.flows") == 0



def test_an_upgrade_keeps_earlier_runs_without_an_origin_and_triggers_work_after_it(
        db_factory: Callable[..., str]) -> None:
    dsn = db_factory(previous_release().last_migration)
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        _flow(engine)
        earlier = engine.start("orders_flow", {"id": 0})
        migrator.migrate(conn)
        assert engine.scalar("select origin from flowlane.runs where run_id = %s", (earlier,)) is None
        _trigger(engine)
        conn.execute("insert into public.orders values (1, 'new', 1)")
        started = "select count(*) from flowlane.runs where origin ->> 'trigger' = 'order_paid'"
        assert engine.scalar(started) == 1
