"""`flowlane db ...` as a user runs it: subprocesses in an empty directory."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_support import REPO, run_flowlane

pytestmark = pytest.mark.slow  # the tests start embedded PostgreSQL servers


def flowlane(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_flowlane(*args, cwd=cwd, env=env)


@pytest.fixture
def project(reachable_tmp_path: Path) -> Iterator[Path]:
    yield reachable_tmp_path
    flowlane(reachable_tmp_path, "db", "down")


def test_db_lifecycle_from_an_empty_directory(project: Path) -> None:
    up = flowlane(project, "db", "up")
    assert up.returncode == 0, up.stderr
    assert "started" in up.stdout
    assert "pending; next: `flowlane db migrate`" in up.stdout
    assert (project / ".flowlane" / ".gitignore").read_text() == "*\n"
    assert "already running" in flowlane(project, "db", "up").stdout

    first = flowlane(project, "db", "migrate")
    assert first.returncode == 0, first.stderr
    assert "applied 0001_core.sql" in first.stdout
    second = flowlane(project, "db", "migrate")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "database is up to date"
    migrated = flowlane(project, "db", "up").stdout
    assert "db migrate" not in migrated and "core migrations are up to date" in migrated

    past = flowlane(project, "db", "migrate", "--to", "0001")
    assert past.returncode == 0, past.stderr
    assert past.stdout.strip().startswith("database is already at 00")
    assert "past 0001: migrations are never rolled back" in past.stdout

    status = flowlane(project, "db", "status")
    assert status.returncode == 0, status.stderr
    assert "pending" not in status.stdout.replace("0 pending", "")
    assert "up to date" in status.stdout

    url = flowlane(project, "db", "url")
    assert url.stdout.startswith("postgresql://") and str(project) in url.stdout

    down = flowlane(project, "db", "down")
    assert down.stdout.strip() == "embedded PostgreSQL stopped"
    stopped = flowlane(project, "db", "url")
    assert stopped.returncode == 1
    assert stopped.stderr.splitlines()[0].startswith("error: the embedded database")
    assert "flowlane db up" in stopped.stderr


def test_a_development_builds_database_is_refused_and_reset_only_when_confirmed(
        project: Path, dsn: str) -> None:
    import psycopg

    from flowlane.core import migrator

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("insert into flowlane.schema_migrations (version, name, checksum) "
                     "values ('0999', 'tried_once', repeat('a', 64))")
    result = flowlane(project, "db", "migrate", "--dsn", dsn)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: this database was built by a development build of flowlane: "
                                    "it applied 0999_tried_once, which no release")
    assert "hint: a development database: `flowlane db reset --yes`" in result.stderr
    status = flowlane(project, "db", "status", "--dsn", dsn)
    assert status.returncode == 1
    assert "0999_tried_once" in status.stdout and "applied by a development build" in status.stdout
    assert status.stderr.startswith("error: this database was built by a development build")
    unconfirmed = flowlane(project, "db", "reset", "--dsn", dsn)
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        recorded = conn.execute("select count(*) from flowlane.schema_migrations").fetchone()
        assert recorded == (len(migrator.discover()) + 1,)  # nothing dropped
    reset = flowlane(project, "db", "reset", "--dsn", dsn, "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "next: `flowlane apply`" in reset.stdout
    assert flowlane(project, "db", "status", "--dsn", dsn).stdout.rstrip().endswith("up to date")


@pytest.mark.parametrize("how", ["--dsn", "FLOWLANE_DSN", "DATABASE_URL"])
def test_unreachable_database_is_one_clear_error(tmp_path: Path, how: str) -> None:
    bad = "postgresql://nobody:secret@127.0.0.1:1/nowhere?connect_timeout=2"
    args = ["db", "status", "--dsn", bad] if how == "--dsn" else ["db", "status"]
    result = flowlane(tmp_path, *args, env={} if how == "--dsn" else {how: bad})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: cannot connect to postgresql://nobody:***@127.0.0.1:1/nowhere")
    assert f"(from {how})" in first
    assert "secret" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("hint: ")
    assert not (tmp_path / ".flowlane").exists()


@pytest.mark.parametrize("command", [["db", "status"], ["db", "migrate"],
                                     ["plan", str(REPO / "flows")], ["verify", str(REPO / "flows")]])
def test_malformed_dsn_is_a_usage_error_not_a_traceback(tmp_path: Path, command: list[str]) -> None:
    result = flowlane(tmp_path, *command, "--dsn", "not a dsn")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: invalid connection string not a dsn (from --dsn)")


def test_malformed_dsn_never_shows_its_password(tmp_path: Path) -> None:
    result = flowlane(tmp_path, "db", "status", env={"FLOWLANE_DSN": "host=h password='s3 cr3t' x"})
    assert result.returncode == 2, result.stderr
    assert "s3" not in result.stderr and "cr3t" not in result.stderr
    assert "(from FLOWLANE_DSN)" in result.stderr


def test_migrate_roles_sets_up_least_privilege_and_keeps_it(tmp_path: Path, dsn: str) -> None:
    import psycopg

    first = flowlane(tmp_path, "db", "migrate", "--roles", "--dsn", dsn)
    assert first.returncode == 0, first.stderr
    assert ("roles flowlane_worker, flowlane_deployer, flowlane_operator, flowlane_application, "
            "flowlane_console, flowlane_admin are up to date") in first.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("alter function flowlane.heartbeat(uuid) security invoker")  # what a
        # later migration's `create or replace function` does
    again = flowlane(tmp_path, "db", "migrate", "--dsn", dsn)  # no --roles: kept all the same
    assert again.returncode == 0, again.stderr
    assert "flowlane_console, flowlane_admin are up to date" in again.stdout
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "select prosecdef from pg_proc where oid = 'flowlane.heartbeat(uuid)'::regprocedure"
        ).fetchone() == (True,)
