"""Triggers through compile, plan and apply on a real database: a new trigger, a changed one,
one removed by the triggers file, and the compiler's checks of a trigger document."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from flowlane.compiler import api
from tests.compiler.test_cli import commit_all, git, run, run_joined

FLOW = """\
kind: flow
slug: orders_v1
input_schema:
  type: object
  required: [order_id]
  properties:
    order_id: {type: integer}
steps:
  charge:
    handler: shop:charge
---
kind: alias
slug: orders
active: orders_v1
"""
PAID = """\
---
kind: trigger
name: order_paid
table: public.orders
events: [update]
when: {new: {status: paid}}
unless: {old: {status: paid}}
flow: orders
input: {order_id: /new/id}
key: /new/id
"""
PLACED = """\
---
kind: trigger
name: order_placed
table: public.orders
events: [insert]
flow: orders
input: {order_id: /new/id}
"""



def _triggers(conn: psycopg.Connection[tuple[str]]) -> list[str]:
    return [r[0] for r in conn.execute("select tgname from pg_trigger "
                                       "where tgrelid = 'public.orders'::regclass order by 1").fetchall()]


@pytest.mark.slow
def test_plan_and_apply_add_change_and_remove_triggers(dsn: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create table public.orders (id int primary key, status text)")
    (tmp_path / "flows").mkdir()
    flows = tmp_path / "flows" / "orders.yaml"
    flows.write_text(FLOW + PAID + PLACED)
    monkeypatch.chdir(tmp_path)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert code == 0 and "NEW_TRIGGER           trigger order_paid" in out, out
    assert "starts orders on update of public.orders" in out
    code, out = run_joined(capsys, "apply", "--dsn", dsn)
    assert code == 0 and "sql/triggers.sql" in out
    assert "NO_CHANGE             trigger order_placed" in run_joined(capsys, "plan", "--dsn", dsn)[1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _triggers(conn) == ["flowlane_order_paid_update", "flowlane_order_placed_insert"]
        conn.execute("insert into public.orders values (1, 'new')")
        conn.execute("update public.orders set status = 'paid'")
        assert conn.execute("select count(*) from flowlane.runs").fetchone() == (2,)
        paid = conn.execute("select run_id from flowlane.runs "
                            "where origin ->> 'trigger' = 'order_paid'").fetchone()
    assert paid is not None
    code, out = run_joined(capsys, "run", str(paid[0]), "--dsn", dsn)
    assert code == 0 and 'trigger order_paid (update of row {"id": 1})' in out, out
    code, out = run_joined(capsys, "triggers", "--dsn", dsn)
    assert code == 0
    assert out.splitlines()[1].split() == ["order_paid", "update", "public.orders", "orders", "1", "1", "0",
                                           "-"]

    # one trigger changed, the other's document removed
    flows.write_text(FLOW + PAID.replace("events: [update]", "events: [insert, update]"))
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "plan", "--dsn", dsn)
    assert "TRIGGER_CHANGE        trigger order_paid" in out
    assert "events: ['update'] in the database, ['insert', 'update'] in the YAML" in out
    assert "TRIGGER_REMOVED       trigger order_placed" in out
    assert "dropped from public.orders by apply" in out
    assert run_joined(capsys, "apply", "--dsn", dsn)[0] == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _triggers(conn) == ["flowlane_order_paid_insert", "flowlane_order_paid_update"]
        assert conn.execute("select trigger_name from flowlane.triggers").fetchall() == [("order_paid",)]


@pytest.mark.slow
def test_apply_of_a_trigger_on_a_missing_table_changes_nothing(dsn: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "orders.yaml").write_text(FLOW + PAID)
    monkeypatch.chdir(tmp_path)
    assert run_joined(capsys, "compile")[0] == 0
    code, out = run_joined(capsys, "apply", "--dsn", dsn)
    assert code != 0 and "no table 'public.orders'" in out
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select count(*) from flowlane.flows").fetchone() == (0,)


def _codes(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "f.yaml").write_text(text)
    return [d.code for d in api.validate([tmp_path / "f.yaml"])]


@pytest.mark.parametrize(("written", "instead", "code"), [
    ("flow: orders\n", "flow: orderz\n", "FL110"),  # no such flow or alias
    ("input: {order_id: /new/id}", "input: {order_id: /old/id}", "FL112"),  # an insert has no old row
    ("input: {order_id: /new/id}", "input: {id: /new/id}", "FL113"),  # the contract requires order_id
    ("table: public.orders", "table: orders", "FL013"),  # the schema is part of the name
])
def test_the_compiler_checks_a_trigger(tmp_path: Path, written: str, instead: str, code: str) -> None:
    assert _codes(tmp_path, FLOW + PLACED) == []
    assert code in _codes(tmp_path, FLOW + PLACED.replace(written, instead))


def test_check_classifies_triggers_added_changed_and_removed_since_the_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "flows").mkdir()
    monkeypatch.chdir(tmp_path)
    git(tmp_path, "init", "-q")
    flows = tmp_path / "flows" / "orders.yaml"
    flows.write_text(FLOW + PAID)
    assert run(capsys, "compile")[0] == 0
    commit_all(tmp_path)
    flows.write_text(FLOW + PAID.replace("key: /new/id\n", "") + PLACED)
    assert run(capsys, "compile")[0] == 0
    code, out, _ = run(capsys, "check")
    assert code == 0, out
    assert out.splitlines()[:-1] == [
        "NEW_TRIGGER trigger order_placed: declared in the YAML, not at HEAD",
        "TRIGGER_CHANGE trigger order_paid: key_pointer: /new/id at HEAD, none in the YAML",
    ]
    flows.write_text(FLOW + PLACED)
    assert run(capsys, "compile")[0] == 0
    assert "TRIGGER_REMOVED trigger order_paid: at HEAD, not in the YAML (dropped by apply)" in run(
        capsys, "check")[1]
