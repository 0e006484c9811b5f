"""flowlane through Debian's pgbouncer (1.18) in transaction mode, the DSN marked with
``pooler=transaction``: a real workload through `flowlane serve`, an application Client
reused for many starts, `start --wait`, the console and `/metrics`; `db migrate` refused."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowlane.core import db, migrator
from flowlane.runtime.client import AsyncClient, Client
from tests.conftest import Cluster
from tests.core.engine import Engine
from tests.runtime import pgbouncer_support
from tests.runtime.pgbouncer_support import PgBouncer
from tests.runtime.rt_support import applied_project, env, flowlane, wait_until
from tests.ui.ui_support import ui_server

pytestmark = pytest.mark.slow

RUNS = 200

FLOWS = """\
kind: flow
slug: pb_two
defaults: {base_delay: 0, timeout: 30}
steps:
  first:
    handler: pb_handlers:first
  second:
    needs: [first]
    handler: pb_handlers:second
"""

HANDLERS = """\
import os


def _executed(ctx):
    # one short line per execution, appended (atomic for a regular file): counted by the test
    with open(os.environ["PB_EXECUTIONS"], "a") as log:
        log.write(f"{ctx.run_id} {ctx.step_slug}\\n")


def first(input, ctx):
    _executed(ctx)
    return {"n": input["n"]}


def second(input, ctx):
    _executed(ctx)
    return {"n": input["first"]["n"] * 2}
"""


@pytest.fixture
def pgbouncer(cluster: Cluster) -> Iterator[Callable[..., PgBouncer]]:
    """``pgbouncer(pool_size=20)``: Debian's pgbouncer in transaction mode in front of the
    suite's server, stopped after the test."""
    started: list[PgBouncer] = []

    def start(pool_size: int = 20) -> PgBouncer:
        started.append(PgBouncer(cluster.admin_dsn, pool_size=pool_size))
        return started[-1]

    yield start
    for bouncer in started:
        bouncer.stop()


@pytest.fixture
def project(tmp_path: Path, dsn: str, pgbouncer: Callable[..., PgBouncer]) -> tuple[Path, str]:
    """The project, compiled and applied through the pooler; (its root, the pooled DSN)."""
    pooled = pgbouncer().dsn(dsn)
    return applied_project(tmp_path / "proj", pooled, FLOWS, {"pb_handlers": HANDLERS}), pooled


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def metric(body: str, name: str) -> float | None:
    values = [float(line.split()[-1]) for line in body.splitlines() if line.split(" ")[0] == name]
    return values[0] if values else None


def completed_runs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select count(*) from flowlane.runs where status = 'completed'").fetchone()
    assert row is not None
    return int(row[0])


def advisory_locks(dsn: str) -> int:
    """Advisory locks held in the server by any session (a pooled one included)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select count(*) from pg_locks where locktype = 'advisory'").fetchone()
    assert row is not None
    return int(row[0])


def test_the_pgbouncer_is_debians_1_18() -> None:
    assert pgbouncer_support.version() == "PgBouncer 1.18.0"


def test_a_workload_through_pgbouncer_in_transaction_mode(
        project: tuple[Path, str], dsn: str, tmp_path: Path) -> None:
    root, pooled = project
    executions = tmp_path / "executions.log"
    port = pgbouncer_support.free_port()
    out = tmp_path / "serve.out"
    with out.open("w") as sink:
        serve = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "serve", "--dsn", pooled, "--shutdown-timeout", "5",
             "--metrics-port", str(port)],
            cwd=root, env={**env(), "PB_EXECUTIONS": str(executions)}, stdout=sink,
            stderr=subprocess.STDOUT)
    try:
        with Client(pooled) as client:  # one application connection for every start
            started = {client.start("pb_two", {"n": n}).run_id: n for n in range(RUNS)}
        assert len(started) == RUNS
        wait_until(lambda: completed_runs(dsn) == RUNS, timeout=120, interval=0.2,
                   message=f"{RUNS} runs completed")
        with psycopg.connect(dsn, autocommit=True) as conn:
            outputs = dict(conn.execute(
                "select run_id::text, (output->'second'->>'n')::int from flowlane.runs").fetchall())
        assert outputs == {run_id: n * 2 for run_id, n in started.items()}
        counted = collections.Counter(executions.read_text().splitlines())
        assert len(counted) == 2 * RUNS and set(counted.values()) == {1}  # no task twice

        metrics_url = f"http://127.0.0.1:{port}"
        status, body = get(f"{metrics_url}/metrics")
        assert status == 200, body
        assert metric(body, "flowlane_database_up") == 1
        assert metric(body, "flowlane_run_durations_listening") == 0  # no LISTEN through a pooler
        assert get(f"{metrics_url}/readyz") == (200, "ready\n")
        assert advisory_locks(dsn) == 0  # no session lock left in a pooled server session
    finally:
        serve.terminate()
        assert serve.wait(timeout=60) == 0
    served = out.read_text()
    assert "the DSN goes through a transaction-mode pooler (pooler=transaction)" in served
    assert "run durations are not observed through a transaction-mode pooler" in served
    worker_log = (root / ".flowlane" / "logs" / "pb_two.log").read_text()
    assert worker_log.count("notifications_off") == 1, worker_log
    assert served.count("pb_two  running") == 1 and "restart" not in served.lower()  # never crashed
    assert "prepared statement" not in worker_log
    assert "definition notifications lost" not in served  # the definitions' poll worked


MORE = """\
kind: flow
slug: pb_more
defaults: {base_delay: 0, timeout: 30}
steps:
  only:
    handler: pb_handlers:first
"""


def test_serve_through_pgbouncer_follows_an_apply_without_notifications(
        project: tuple[Path, str], tmp_path: Path) -> None:
    root, pooled = project
    out = tmp_path / "serve.out"
    env_ = {**env(), "PB_EXECUTIONS": str(tmp_path / "executions.log")}
    with out.open("w") as sink:
        serve = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "serve", "--dsn", pooled, "--shutdown-timeout", "5"],
            cwd=root, env=env_, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "pb_two" in out.read_text() and "running" in out.read_text(),
                   timeout=60, message="serve's first worker")
        (root / "flows" / "more.yaml").write_text(MORE)
        for command in (("compile",), ("apply", "--dsn", pooled)):
            done = flowlane(*command, cwd=root)
            assert done.returncode == 0, done.stdout + done.stderr
        # only a worker that serve started for the new flow, once it saw the change, runs it
        waited = flowlane("start", "pb_more", "--input", '{"n": 5}', "--wait", "--timeout", "60",
                          "--dsn", pooled, cwd=root)
        assert waited.returncode == 0, waited.stdout + waited.stderr + out.read_text()
        assert json.loads(waited.stdout)["only"] == {"n": 5}
    finally:
        serve.terminate()
        assert serve.wait(timeout=60) == 0
    assert "definition notifications lost" not in out.read_text()


def test_the_definitions_fingerprint_moves_with_every_definition_change_and_only_then(
        conn: psycopg.Connection[Any]) -> None:
    engine = Engine(conn)
    engine.define("pb_fp", [("one", [], {})])
    migrator.migrate(conn, roles=True)

    def fingerprint() -> str:  # as serve reads it under the worker role
        with conn.transaction():
            conn.execute("set local role flowlane_worker")
            return str(conn.execute("select flowlane.definitions_fingerprint()").fetchone()[0])

    def register() -> None:
        conn.execute("select flowlane.register_worker(%s, 'pb_fp', 'w', 'pb_fp', %s)",
                     (uuid.uuid4(), '[["pb_fp", "one"]]'))

    register()  # the deployment's first worker adds it
    seen = [fingerprint()]
    run_id = engine.start("pb_fp", {})
    assert engine.drive("pb_fp", lambda task: {"ok": True}) == 1
    assert engine.run(run_id)["status"] == "completed"
    register()
    assert fingerprint() == seen[-1]  # runs, tasks and a later worker change no definition
    for change in ("select flowlane.set_deployment_enabled('pb_fp', false, 'maintenance')",
                   "select flowlane.set_deployment_enabled('pb_fp', true)",
                   "select flowlane.set_alias('pb_fp_alias', 'pb_fp')",
                   "select flowlane.create_flow('pb_fp_v2')",
                   "select flowlane.add_step('pb_fp_v2', 'one')",
                   "select flowlane.delete_flow_and_data('pb_fp_v2')"):
        conn.execute(change)
        seen.append(fingerprint())
        assert seen[-1] != seen[-2], change
    conn.execute("reset role")


def test_start_wait_clients_and_the_console_through_pgbouncer(
        project: tuple[Path, str], dsn: str, tmp_path: Path) -> None:
    root, pooled = project
    executions = tmp_path / "executions.log"
    worker = subprocess.Popen(
        [sys.executable, "-m", "flowlane", "worker", "--flow", "pb_two", "--dsn", pooled],
        cwd=root, env={**env(), "PB_EXECUTIONS": str(executions)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        waited = flowlane("start", "pb_two", "--input", '{"n": 21}', "--wait", "--timeout", "60",
                          "--dsn", pooled, cwd=root)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert json.loads(waited.stdout)["second"] == {"n": 42}

        with Client(pooled) as client:
            run_ids = [client.start("pb_two", {"n": n}).run_id for n in range(20)]
            states = [client.wait(run_id, timeout=60) for run_id in run_ids]
        assert [s.run.status for s in states] == ["completed"] * 20

        async def wait_async() -> list[str]:  # the AsyncClient: its own connection, no LISTEN
            async with AsyncClient(pooled) as client:
                ids = [(await client.start("pb_two", {"n": n})).run_id for n in range(10)]
                return [(await client.wait(run_id, timeout=60)).run.status for run_id in ids]

        assert asyncio.run(wait_async()) == ["completed"] * 10
        assert advisory_locks(dsn) == 0  # wait never took the listeners' session lock

        with ui_server(pooled) as ui:
            page = get(f"{ui.url}/runs/{run_ids[0]}")
            assert page[0] == 200 and run_ids[0] in page[1]
            assert get(f"{ui.url}/queues")[0] == 200
            status, body = get(f"{ui.url}/metrics")
            assert status == 200 and metric(body, "flowlane_database_up") == 1
            assert metric(body, "flowlane_run_durations_listening") == 0
            ui.process.terminate()
            _, said = ui.process.communicate(timeout=30)
        assert "run durations are not observed through a transaction-mode pooler" in said
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def test_prepared_statements_collide_through_pgbouncer_unless_the_dsn_says_pooler(
        dsn: str, pgbouncer: Callable[..., PgBouncer]) -> None:
    bouncer = pgbouncer(pool_size=1)  # one server session: every client's transactions share it

    def run_twice_over(target: str) -> None:
        first, second = db.connect(target, autocommit=True), db.connect(target, autocommit=True)
        with first, second:
            for conn in (first, second):  # each prepares "_pg3_0" once it has run the query 5 times
                for _ in range(6):
                    conn.execute("select 1")

    with pytest.raises(psycopg.errors.DuplicatePreparedStatement, match='"_pg3_0" already exists'):
        run_twice_over(bouncer.dsn(dsn, marked=False))
    run_twice_over(bouncer.dsn(dsn))  # pooler=transaction: nothing prepared on the server


def test_db_migrate_refuses_a_transaction_mode_pooler(
        db_factory: Callable[..., str], pgbouncer: Callable[..., PgBouncer], tmp_path: Path) -> None:
    direct = db_factory("0001")
    refused = flowlane("db", "migrate", "--dsn", pgbouncer().dsn(direct), cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "flowlane db migrate needs a direct connection to PostgreSQL, not a transaction-mode " \
        "pooler" in refused.stderr
    assert "give it the server's own host and port (not pgbouncer's)" in refused.stderr
    with psycopg.connect(direct, autocommit=True) as conn:
        versions = conn.execute("select version from flowlane.schema_migrations").fetchall()
    assert versions == [("0001",)]  # nothing ran
