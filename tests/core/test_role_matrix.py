"""The roles by responsibility against a real server: docs/security.md's table of every public
SQL function against every role is the grants of flowlane/core/sql/roles.sql, each role signs
in and calls every function (allowed where the table says so, `permission denied` elsewhere),
and a forged completion is refused to every role, the operator's recorded override excepted,
whose overridden worker is told its result was rejected."""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowlane.core import migrator
from flowlane.core.queries import named_blocks, query
from flowlane.runtime.results import ResultSender
from flowlane.runtime.store import TaskOutcome
from flowlane.runtime.tasks import ClaimedTask, TaskResult
from flowlane.runtime.ticker import Ticker
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

SECURITY_MD = Path(__file__).resolve().parents[2] / "docs" / "security.md"
ALLOWED = "✓"


def documented_grants() -> dict[str, set[str]]:
    """docs/security.md's function table: function name -> the roles it marks."""
    lines = SECURITY_MD.read_text(encoding="utf-8").splitlines()
    start = lines.index("<!-- function-roles: begin -->")
    end = lines.index("<!-- function-roles: end -->")
    header, _rule, *rows = lines[start + 1:end]
    roles = [f"flowlane_{cell.strip()}" for cell in header.strip("|").split("|")[1:]]
    table: dict[str, set[str]] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0])
        assert name, row
        table[name.group(1)] = {role for role, cell in zip(roles, cells[1:], strict=True)
                                if cell == ALLOWED}
    return table


@pytest.fixture
def logins(conn: psycopg.Connection[Any]) -> Iterator[dict[str, str]]:
    """A migrated database with the roles applied, a flow, and one login per role."""
    Engine(conn).define("forge", [("slow", [], {}), ("after", ["slow"], {})])
    conn.execute("select pgmq.create('foreign_queue')")
    migrator.migrate(conn, roles=True)
    made, dsns = [], {}
    for role in migrator.ROLES:
        name, password = f"fl_{role.removeprefix('flowlane_')}_{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
        conn.execute(sql.SQL("create role {} login password {} in role {}").format(
            sql.Identifier(name), sql.Literal(password), sql.Identifier(role)))
        made.append(name)
        dsns[role] = make_conninfo(conn.info.dsn, user=name, password=password, passfile="")
    yield dsns
    for name in made:
        conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def public_functions(conn: psycopg.Connection[Any]) -> list[tuple[str, str, list[str]]]:
    """(name, signature, argument types) of every public flowlane function."""
    rows = conn.execute(
        "select p.proname, p.oid::regprocedure::text,"
        " array(select format_type(t, null) from unnest(p.proargtypes) t)"
        " from pg_proc p where p.pronamespace = 'flowlane'::regnamespace and p.prokind = 'f'"
        " and p.proname !~ '^_' and p.prorettype <> 'trigger'::regtype order by 2").fetchall()
    return [(str(r[0]), str(r[1]), list(r[2])) for r in rows]


def call_refused(conn: psycopg.Connection[Any], name: str, arg_types: list[str]) -> bool:
    """Call ``name`` with null arguments in a transaction rolled back; True when the server
    answers `permission denied` (42501), False for any other outcome, an error included."""
    call = sql.SQL("select flowlane.{}({})").format(
        sql.Identifier(name),
        sql.SQL(", ").join(sql.SQL("null::{}").format(sql.SQL(t)) for t in arg_types))
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(call)
    except pg_errors.InsufficientPrivilege:
        return True
    except psycopg.Error:
        return False
    return False


def test_the_docs_table_is_the_grants(conn: psycopg.Connection[Any],
                                      logins: dict[str, str]) -> None:
    documented = documented_grants()
    functions = public_functions(conn)
    assert sorted(documented) == sorted({name for name, _sig, _args in functions})
    for name, signature, _args in functions:
        granted = {role for role in migrator.ROLES if conn.execute(
            "select has_function_privilege(%s, %s::regprocedure, 'EXECUTE')", (role, signature)
        ).fetchone() == (True,)}
        assert granted == documented[name], signature


@pytest.mark.parametrize("role", migrator.ROLES)
def test_each_role_signed_in_may_call_exactly_its_functions(
    conn: psycopg.Connection[Any], logins: dict[str, str], role: str
) -> None:
    documented = documented_grants()
    with psycopg.connect(logins[role], autocommit=True) as signed_in:
        assert signed_in.execute("select current_user").fetchone() != (role,)  # a login, a member
        outcomes = {name: not call_refused(signed_in, name, args)
                    for name, _sig, args in public_functions(conn)}
    expected = {name: role in roles for name, roles in documented.items()}
    assert outcomes == expected


def test_the_console_reads_what_the_console_and_queue_list_show(
    conn: psycopg.Connection[Any], logins: dict[str, str]
) -> None:
    with psycopg.connect(logins["flowlane_console"], autocommit=True) as console:
        assert console.execute("select count(*) from flowlane.schema_migrations").fetchone() != (0,)
        assert console.execute(
            "select queue_length from pgmq.metrics('forge')").fetchone() == (0,)
        assert console.execute("select queue_name from flowlane.pgmq_metrics() order by 1").fetchall() == [
            ("foreign_queue",), ("forge",)]  # the console lists queues flowlane does not own
        with pytest.raises(pg_errors.InsufficientPrivilege):
            console.execute("select * from pgmq.q_foreign_queue")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            console.execute("select flowlane.maintenance_tick()")
        with pytest.raises(pg_errors.InsufficientPrivilege):
            console.execute("select * from pgmq.read('forge', 30, 1)")


def test_a_console_that_may_not_tick_says_so_once_and_stops_ticking(
    logins: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    stopping = threading.Event()
    ticker = Ticker(logins["flowlane_console"], stopping, who="ui", interval=0.01)
    ticker.start()
    ticker.join(timeout=60)
    assert not ticker.is_alive() and not stopping.is_set()  # it ended by itself
    err = capsys.readouterr().err
    assert err.count("the maintenance tick is left to the workers") == 1
    assert "permission denied for function maintenance_tick" in err


class SignedInResults:
    """The two result calls of a worker (the runtime's SQL), on a signed-in connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def complete_tasks(self, completions: list[dict[str, Any]]) -> list[TaskOutcome]:
        return await self._outcomes("worker_complete_tasks", completions)

    async def fail_tasks(self, failures: list[dict[str, Any]]) -> list[TaskOutcome]:
        return await self._outcomes("worker_fail_tasks", failures)

    async def _outcomes(self, name: str, results: list[dict[str, Any]]) -> list[TaskOutcome]:
        cur = await self.conn.cursor(row_factory=dict_row).execute(query(name), {"results": Jsonb(results)})
        return [TaskOutcome.from_row(r) for r in await cur.fetchall()]


async def send_as_worker(dsn: str, worker_id: uuid.UUID, result: TaskResult) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        tally = await ResultSender(SignedInResults(aconn), str(worker_id)).send([result])
    return tally.rejected if tally.completed == 0 else -1


def test_a_forged_completion_is_refused_and_the_override_is_recorded_and_rejects_the_worker(
    conn: psycopg.Connection[Any], logins: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(conn)
    run_id = engine.start("forge", {})
    [task] = engine.claim("forge")  # a live worker holds the task
    forged = "select * from flowlane.complete_task(%s, 'slow', 0, '{\"sum\": 999999}')"
    for role, dsn in logins.items():
        with psycopg.connect(dsn, autocommit=True) as signed_in:
            error = pg_errors.InvalidParameterValue if role == "flowlane_worker" else \
                pg_errors.InsufficientPrivilege
            with pytest.raises(error):
                signed_in.execute(forged, (run_id,))
            with pytest.raises(error):
                signed_in.execute("select * from flowlane.complete_tasks(%s)", (Jsonb(
                    [{"run_id": str(run_id), "step_slug": "slow", "task_index": 0, "output": 1}]),))
            with pytest.raises(error):
                signed_in.execute("select * from flowlane.fail_task(%s, 'slow', 0, 'forged')", (run_id,))
    with psycopg.connect(logins["flowlane_worker"], autocommit=True) as worker:  # another worker's id
        worker.execute("select * from flowlane.complete_task(%s, 'slow', 0, '1', %s, %s)",
                       (run_id, uuid.uuid4(), task["attempt"]))
    assert engine.task(run_id, "slow")["status"] == "started"

    with psycopg.connect(logins["flowlane_operator"], autocommit=True) as operator:
        operator_login = operator.info.user
        [row] = operator.execute(
            "select status, output from flowlane.override_task(%s, 'slow', 0, '{\"sum\": 6}', %s)",
            (run_id, "the handler hangs on a lock")).fetchall()
    assert row == ("completed", {"sum": 6})
    history = engine.rows("select outcome, worker_id, error_type, error_message from flowlane.task_attempts"
                          " where run_id = %s", (run_id,))
    assert history == [{
        "outcome": "overridden", "worker_id": engine.worker_id, "error_type": "Override",
        "error_message": f"completed by hand by {operator_login}: the handler hangs on a lock"}]

    claimed = ClaimedTask("forge", "slow", "forge", str(run_id), 0, {}, {}, task["attempt"], 0)
    rejected = asyncio.run(send_as_worker(logins["flowlane_worker"], engine.worker_id,
                                          TaskResult(claimed, ok=True, output={"sum": 999999})))
    assert rejected == 1
    assert "result_rejected" in caplog.text
    assert "an operator completed the task by hand (override_task)" in caplog.text
    assert engine.task(run_id, "slow")["output"] == {"sum": 6}


def test_an_override_needs_a_reason_and_a_started_task(
    conn: psycopg.Connection[Any], logins: dict[str, str]
) -> None:
    run_id = Engine(conn).start("forge", {})
    with psycopg.connect(logins["flowlane_operator"], autocommit=True) as operator:
        with pytest.raises(pg_errors.InvalidParameterValue, match="a reason is required"):
            operator.execute("select flowlane.override_task(%s, 'slow', 0, '1', ' ')", (run_id,))
        with pytest.raises(pg_errors.ObjectNotInPrerequisiteState, match="is queued"):
            operator.execute("select flowlane.override_task(%s, 'slow', 0, '1', 'why')", (run_id,))


def read_queries() -> list[tuple[str, str]]:
    """The console's, `queue list`'s, `worker list`'s and the metrics' queries (name, text)."""
    sql_dir = Path(__file__).resolve().parents[2] / "flowlane" / "core" / "sql"
    return [block for name in ("console.sql", "fleet.sql", "observability.sql")
            for block in named_blocks((sql_dir / name).read_text(encoding="utf-8"))]


@pytest.mark.parametrize("role", ["flowlane_console", "flowlane_operator", "flowlane_deployer"])
def test_the_readers_reach_every_table_and_queue_what_they_show(
    conn: psycopg.Connection[Any], logins: dict[str, str], role: str
) -> None:
    """Each query runs (null parameters), or is refused a function the role is not granted:
    never a table, a view, a sequence or a schema."""
    documented = documented_grants()
    answered = set()
    with psycopg.connect(logins[role], autocommit=True) as signed_in:
        for name, text in read_queries():
            params = dict.fromkeys(re.findall(r"%\((\w+)\)s", text))
            try:
                with signed_in.transaction(force_rollback=True):
                    signed_in.execute(text.encode(), params)
                answered.add(name)
            except pg_errors.InsufficientPrivilege as exc:
                refused = re.fullmatch(r"permission denied for function (\w+)", str(exc).splitlines()[0])
                assert refused and role not in documented[refused.group(1)], (name, str(exc))
            except psycopg.Error:
                pass  # a null where a value is needed: past the privilege checks
    assert {"console_queues", "console_runs", "console_run_attempts", "console_workers", "fleet_queues",
            "fleet_live_workers", "observability_queue_metrics"} <= answered
