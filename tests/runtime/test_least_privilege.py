"""Least privilege end to end: flows applied by a login in flowlane_deployer, a run started and
waited for by a login in flowlane_application, served by a real worker process that logs in as
a member of flowlane_worker (docs/security.md)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowlane.core import migrator
from tests.runtime import rt_support
from tests.runtime.rt_support import WorkerProcess, start_run

pytestmark = pytest.mark.slow


@pytest.fixture
def logins(dsn: str) -> Iterator[dict[str, str]]:
    """DSNs of new login roles, members of flowlane_deployer, flowlane_application and
    flowlane_worker."""
    made: list[str] = []
    dsns: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrator.migrate(conn, roles=True)
        for kind in ("deployer", "application", "worker"):
            name, password = f"fl_{kind}_{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
            conn.execute(sql.SQL("create role {} login password {} in role {}").format(
                sql.Identifier(name), sql.Literal(password), sql.Identifier(f"flowlane_{kind}")))
            made.append(name)
            dsns[kind] = make_conninfo(dsn, user=name, password=password)
    yield dsns
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in made:
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def test_a_worker_logged_in_as_the_worker_role_serves_its_flows(
    dsn: str, logins: dict[str, str], tmp_path: Path
) -> None:
    from flowlane.runtime.client import Client

    rt_support.apply_flows(logins["deployer"])  # the reviewed SQL, applied by a deploy login
    run_id = start_run(logins["application"], "rt_diamond", {"numbers": [1, 2, 3, 4]})
    worker = WorkerProcess(logins["worker"], tmp_path, "--flow", "rt_diamond").wait_ready()
    try:
        with Client(logins["application"]) as client:  # what `start --wait` does
            state = client.wait(run_id)
        assert state.run.status == "completed"
        assert state.run.output["total"] == {"sum_of_squares": 30, "count": 4}
    finally:
        assert worker.stop() == 0
    with (psycopg.connect(logins["worker"], autocommit=True) as conn,
          pytest.raises(psycopg.errors.InsufficientPrivilege)):
        conn.execute("select flowlane.delete_flow_and_data('rt_diamond')")
    assert rt_support.run_state(dsn, run_id)["run"]["status"] == "completed"
