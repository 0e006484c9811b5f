"""Least privilege: `flowlane db migrate --roles` (flowlane/core/sql/roles.sql).

The roles are cluster-wide and created once (idempotent); every test sets them up in its own
database and checks privileges with SET ROLE, so nothing outlives the test but the two roles.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from flowlane import errors
from flowlane.core import migrator
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

WORKER_ONLY_DENIED = [
    "select flowlane.create_flow('evil')",
    "select flowlane.add_step('roles_flow', 'extra')",
    "select flowlane.set_alias('roles_alias', 'roles_flow')",
    "select flowlane.delete_flow_and_data('roles_flow')",
    "select flowlane.start_flow('roles_flow', '{}'::jsonb)",
    "select flowlane.cancel_run(gen_random_uuid())",
    "select flowlane.adopt_queue('foreign_queue')",
    "update flowlane.steps set opt_max_attempts = 99",
    "delete from flowlane.flows",
    "insert into flowlane.aliases (alias, flow_slug) values ('x', 'roles_flow')",
    "select * from flowlane.runs",
    "select * from flowlane.step_tasks",
    "select * from public.secrets",
    "select * from pgmq.q_foreign_queue",
    "select * from pgmq.read('foreign_queue', 30, 1)",
    "select * from pgmq.a_roles_flow",
]


@pytest.fixture
def roles_conn(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """A migrated database with the roles applied, a flow, a foreign queue and a foreign table."""
    engine = Engine(conn)
    engine.define("roles_flow", [("one", [], {}), ("two", ["one"], {})])
    conn.execute("select pgmq.create('foreign_queue')")
    conn.execute("create table public.secrets (value text); insert into public.secrets values ('x')")
    migrator.migrate(conn, roles=True)
    yield conn
    conn.execute("reset role")


def denied(conn: psycopg.Connection[Any], statement: str, role: str) -> bool:
    """True when ``role`` gets 'permission denied' (42501) for ``statement``."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(role)))
            conn.execute(statement.encode())
    except pg_errors.InsufficientPrivilege:
        return True
    return False


def public_functions(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    rows = conn.execute(
        "select p.oid::regprocedure::text, p.proname from pg_proc p"
        " where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f'"
        " and p.proname !~ '^_' and p.prorettype <> 'trigger'::regtype order by 1"
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


@pytest.mark.parametrize("statement", WORKER_ONLY_DENIED)
def test_the_worker_role_cannot_change_definitions_delete_flows_or_read_other_data(
    roles_conn: psycopg.Connection[Any], statement: str
) -> None:
    assert denied(roles_conn, statement, "flowlane_worker")


def test_the_worker_role_can_do_a_workers_job(roles_conn: psycopg.Connection[Any]) -> None:
    run_id = Engine(roles_conn).start("roles_flow", {})
    worker = uuid.uuid4()
    with roles_conn.transaction():
        roles_conn.execute("set local role flowlane_worker")
        msg_ids = [r[0] for r in roles_conn.execute(
            "select msg_id from pgmq.read('roles_flow', 30, 10)")]
        claimed = roles_conn.execute(
            "select run_id, step_slug, task_index, attempt from flowlane.start_tasks("
            "'roles_flow', %s, %s, '[[\"roles_flow\", \"one\"], [\"roles_flow\", \"two\"]]')",
            (msg_ids, worker)).fetchall()
        assert [(r[1], r[3]) for r in claimed] == [("one", 1)]
        done = roles_conn.execute(
            "select status from flowlane.complete_task(%s, 'one', 0, '1'::jsonb, %s, 1)",
            (run_id, worker)).fetchone()
        assert done is not None and done[0] == "completed"
        assert roles_conn.execute("select flowlane.requeue_stalled_tasks()").fetchone() == (0,)
        assert roles_conn.execute(
            "select flowlane.get_run_with_states(%s) -> 'run' ->> 'status'", (run_id,)
        ).fetchone() == ("started",)


def test_public_has_no_access_to_schema_flowlane(roles_conn: psycopg.Connection[Any]) -> None:
    nobody = f"fl_nobody_{uuid.uuid4().hex[:8]}"
    roles_conn.execute(sql.SQL("create role {}").format(sql.Identifier(nobody)))
    try:
        assert roles_conn.execute(
            "select has_schema_privilege(%s, 'flowlane', 'USAGE')", (nobody,)).fetchone() == (False,)
        for statement in ("select flowlane.json_limits()", "select * from flowlane.flows",
                          "select flowlane.requeue_stalled_tasks()"):
            assert denied(roles_conn, statement, nobody), statement
        executable = roles_conn.execute(
            "select count(*) from pg_proc p where p.pronamespace = 'flowlane'::regnamespace"
            " and has_function_privilege('public', p.oid, 'EXECUTE')").fetchone()
        assert executable == (0,)
    finally:
        roles_conn.execute(sql.SQL("drop role {}").format(sql.Identifier(nobody)))


RESULTS = {"complete_task", "complete_tasks", "fail_task", "fail_tasks", "fail_task_detailed"}


def callers(conn: psycopg.Connection[Any], signature: str) -> set[str]:
    return {role for role in migrator.ROLES if conn.execute(
        "select has_function_privilege(%s, %s::regprocedure, 'EXECUTE')", (role, signature)
    ).fetchone() == (True,)}


def test_every_public_function_has_a_role_and_results_only_the_worker(
    roles_conn: psycopg.Connection[Any],
) -> None:
    granted = {name: callers(roles_conn, signature) for signature, name in public_functions(roles_conn)}
    assert [name for name, roles in granted.items() if not roles] == []
    assert {name for name, roles in granted.items() if "flowlane_worker" in roles} >= {
        "start_tasks", "complete_tasks", "fail_task_detailed", "extend_leases",
        "requeue_stalled_tasks", "coverage", "verify_flow"}
    assert {name: roles for name, roles in granted.items() if name in RESULTS} == {
        name: {"flowlane_worker"} for name in RESULTS}
    assert not {name for name, roles in granted.items() if "flowlane_worker" in roles} & {
        "create_flow", "add_step", "set_alias", "ensure_flow_shape", "delete_flow_and_data",
        "adopt_queue", "begin_rollout", "start_flow", "retry_run", "cancel_run", "override_task"}
    # the admin role is every responsibility but a worker's claims and results
    assert {name for name, roles in granted.items() if "flowlane_admin" not in roles} == {
        name for name, roles in granted.items() if roles == {"flowlane_worker"}}


def test_a_new_function_without_a_class_is_refused(roles_conn: psycopg.Connection[Any]) -> None:
    roles_conn.execute(
        "create function flowlane.sneaky() returns int language sql set search_path = ''"
        " as 'select 1'")
    with pytest.raises(errors.FlowlaneError, match="without a privilege class: sneaky"):
        migrator.migrate(roles_conn)


def test_every_security_definer_function_pins_search_path(
    roles_conn: psycopg.Connection[Any],
) -> None:
    rows = roles_conn.execute(
        "select p.oid::regprocedure::text, p.proconfig from pg_proc p"
        " join pg_namespace n on n.oid = p.pronamespace"
        " where p.prosecdef and n.nspname not in ('pg_catalog', 'information_schema')"
    ).fetchall()
    assert len(rows) >= len(public_functions(roles_conn))
    assert [r[0] for r in rows if 'search_path=""' not in (r[1] or [])] == []


def test_a_later_create_or_replace_gets_its_privileges_back_on_migrate(
    roles_conn: psycopg.Connection[Any],
) -> None:
    # what a later migration does: the replaced function loses SECURITY DEFINER
    definition = roles_conn.execute(
        "select pg_get_functiondef('flowlane.heartbeat(uuid)'::regprocedure)").fetchone()
    assert definition is not None
    roles_conn.execute(str(definition[0]).replace("SECURITY DEFINER", "").encode())
    assert roles_conn.execute(
        "select prosecdef from pg_proc where oid = 'flowlane.heartbeat(uuid)'::regprocedure"
    ).fetchone() == (False,)
    migrator.migrate(roles_conn)  # nothing pending: the roles are re-applied all the same
    assert roles_conn.execute(
        "select prosecdef from pg_proc where oid = 'flowlane.heartbeat(uuid)'::regprocedure"
    ).fetchone() == (True,)


def test_a_queue_registered_later_is_granted_to_the_worker(
    roles_conn: psycopg.Connection[Any],
) -> None:
    with roles_conn.transaction():
        roles_conn.execute("set local role flowlane_admin")
        Engine(roles_conn).define("later_flow", [("only", [], {})])
    assert not denied(roles_conn, "select * from pgmq.read('later_flow', 30, 1)",
                      "flowlane_worker")
    queue_read = roles_conn.execute(
        "select prosrc from pg_proc where oid = 'flowlane._queue_read'::regproc").fetchone()
    assert queue_read is not None and "p_queue = 'later_flow'" in queue_read[0]


def test_roles_are_idempotent(roles_conn: psycopg.Connection[Any]) -> None:
    before = roles_conn.execute(
        "select count(*) from pg_roles where rolname like 'flowlane\\_%'").fetchone()
    migrator.migrate(roles_conn, roles=True)
    migrator.migrate(roles_conn, roles=True)
    assert roles_conn.execute(
        "select count(*) from pg_roles where rolname like 'flowlane\\_%'").fetchone() == before
    assert migrator.roles_applied(roles_conn)
