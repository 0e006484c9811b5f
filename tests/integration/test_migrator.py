"""The migrator against a real database: order, idempotency, checksums, locking."""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import flowlane
from flowlane import cli, errors
from flowlane.core import db, migrator
from tests.conftest import Cluster
from tests.core.engine import Engine
from tests.runtime.rt_support import wait_until

REPO = Path(__file__).resolve().parents[2]
DEVELOPMENT_COMMIT = "47dda94"  # the last commit before the first release, with 45 migrations


def _versions(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("select version from flowlane.schema_migrations order by 1")]


def test_migrations_are_shipped_in_order() -> None:
    found = migrator.discover()
    assert found, "the package ships no migration"
    assert [m.version for m in found] == sorted(m.version for m in found)
    assert found[0].filename == "0001_core.sql"
    assert all(len(m.checksum) == 64 for m in found)


@pytest.mark.slow
def test_migrate_applies_everything_then_is_a_noop(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("none"), autocommit=True) as conn:
        applied = migrator.migrate(conn)
        assert [m.version for m in applied] == [m.version for m in migrator.discover()]
        assert migrator.migrate(conn) == []
        assert _versions(conn) == [m.version for m in migrator.discover()]
        states = migrator.status(conn)
        assert all(s.applied and not s.foreign for s in states)


@pytest.mark.slow
def test_migrate_to_stops_after_that_version(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("none"), autocommit=True) as conn:
        applied = migrator.migrate(conn, to="0001")
        assert [m.version for m in applied] == ["0001"]
        assert _versions(conn) == ["0001"]
        pending = [s.version for s in migrator.status(conn) if not s.applied]
        assert pending == [m.version for m in migrator.discover()][1:]
        migrator.migrate(conn)
        assert all(s.applied for s in migrator.status(conn))


@pytest.mark.slow
def test_unknown_target_version_is_a_usage_error(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(errors.UsageError, match="unknown migration version '9999'"):
        migrator.migrate(conn, to="9999")


def test_every_released_migration_is_shipped_unchanged() -> None:
    shipped = {m.filename: m for m in migrator.discover()}
    for release, files in migrator.released().items():
        for filename, checksum in files.items():
            assert filename in shipped, f"{filename} of release {release} is not shipped"
            assert shipped[filename].checksum == checksum, (
                f"{filename} was released in {release} and has changed since: a released migration "
                "never changes; put the change into the pending migration")


def test_a_released_version_ships_no_pending_migration() -> None:
    # between releases the version is the next one's development version (0.2.0.dev0)
    if flowlane.__version__ in migrator.released():
        assert migrator.pending() is None
    else:
        assert ".dev" in flowlane.__version__, f"{flowlane.__version__}: neither released nor in development"


def test_only_the_newest_migration_may_be_pending() -> None:
    unreleased = [m.filename for m in migrator.discover() if m.release is None]
    assert unreleased in ([], [migrator.discover()[-1].filename])


def _development_build(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn``'s database (at 0002) what a development commit's ``db migrate`` left:
    a migration of its own, 0003_aliases, which no release ships."""
    text = subprocess.run(["git", "show", f"{DEVELOPMENT_COMMIT}:flowlane/core/migrations/0003_aliases.sql"],
                          cwd=REPO, capture_output=True, check=True).stdout.decode()
    with conn.transaction():
        conn.execute(text)  # the repository's own history
        conn.execute("insert into flowlane.schema_migrations (version, name, checksum) "
                     "values ('0003', 'aliases', %s)", (hashlib.sha256(text.encode()).hexdigest(),))


@pytest.mark.slow
def test_a_database_of_a_development_build_is_refused_and_left_as_it_was(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        _development_build(conn)
        tables = conn.execute("select count(*) from pg_tables where schemaname = 'flowlane'").fetchone()
        with pytest.raises(errors.MigrationError) as caught:
            migrator.migrate(conn)
        assert str(caught.value).startswith("this database was built by a development build of flowlane: "
                                            "it applied 0003_aliases, which no release")
        assert "`flowlane db reset --yes`" in (caught.value.hint or "")
        assert "restore the backup" in (caught.value.hint or "")
        assert _versions(conn) == ["0001", "0002", "0003"]
        after = conn.execute("select count(*) from pg_tables where schemaname = 'flowlane'").fetchone()
        assert after == tables
        assert [s.version for s in migrator.status(conn) if s.foreign] == ["0003"]


@pytest.mark.slow
def test_a_released_migration_applied_with_another_text_is_refused(conn: psycopg.Connection[Any]) -> None:
    conn.execute("update flowlane.schema_migrations set checksum = repeat('0', 64) where version = '0001'")
    with pytest.raises(errors.MigrationError, match="it applied 0001_core, which no release"):
        migrator.migrate(conn)
    assert [s.version for s in migrator.status(conn) if s.foreign] == ["0001"]


@pytest.mark.slow
def test_reset_rebuilds_a_development_database_and_keeps_its_roles(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory(), autocommit=True) as conn:
        Engine(conn).define("old", [("a", [], {})])
        migrator.apply_roles(conn)
        conn.execute("insert into flowlane.schema_migrations (version, name, checksum) "
                     "values ('0999', 'tried_once', repeat('a', 64))")
        applied = migrator.reset(conn)
        assert [m.version for m in applied] == [m.version for m in migrator.discover()]
        assert not any(s.foreign or not s.applied for s in migrator.status(conn))
        assert conn.execute("select count(*) from flowlane.flows").fetchone() == (0,)
        assert conn.execute("select to_regclass('pgmq.q_old')").fetchone() == (None,)
        assert migrator.roles_applied(conn)


@pytest.mark.slow
def test_a_migration_ended_as_a_deadlocks_victim_is_run_again(
    db_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction (a worker's, in an upgrade) locks the migration's tables in the other
    order: PostgreSQL ends the migration, which waited first and so checks for the deadlock
    first; the migrator runs it again once the other transaction is done."""
    dsn = db_factory()
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("create table public.first_t (x int); create table public.second_t (x int)")
    two_locks = migrator.Migration("9000", "two_locks", "lock table public.first_t;\n"
                                   "lock table public.second_t;\ncreate table flowlane.after_locks (x int);")
    real = migrator.discover
    monkeypatch.setattr(migrator, "discover", lambda: [*real(), two_locks])
    outcome: list[object] = []

    def migrate() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            try:
                outcome.append(migrator.migrate(conn))
            except errors.MigrationError as exc:
                outcome.append(exc)

    with psycopg.connect(dsn) as other:
        other.execute("set deadlock_timeout = '60s'")  # the migration is the one that checks
        other.execute("lock table public.second_t")
        thread = threading.Thread(target=migrate)
        thread.start()
        wait_until(lambda: other.execute("select 1 from pg_locks where not granted and relation = "
                                         "'public.second_t'::regclass").fetchone(),
                   message="the migration waiting for the second table")
        other.execute("lock table public.first_t")  # granted once the migration is ended
        assert thread.is_alive() and not outcome
        other.commit()
        thread.join(timeout=60)
    assert [[m.version for m in applied] for applied in outcome if isinstance(applied, list)] == [["9000"]]
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = conn.execute("select to_regclass('flowlane.after_locks')::text").fetchone()
    assert made == ("flowlane.after_locks",)


@pytest.mark.slow
def test_failed_migration_rolls_back_and_is_not_recorded(
    db_factory: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = migrator.Migration("9000", "broken", "create table flowlane.half_done(x int);\nselect 1/0;")
    real = migrator.discover
    monkeypatch.setattr(migrator, "discover", lambda: [*real(), broken])
    with psycopg.connect(db_factory(), autocommit=True) as conn:
        with pytest.raises(errors.MigrationError, match=r"9000_broken\.sql failed and was rolled back"):
            migrator.migrate(conn)
        assert conn.execute("select to_regclass('flowlane.half_done')").fetchone() == (None,)
        assert "9000" not in _versions(conn)


@pytest.mark.slow
def test_concurrent_migrate_calls_apply_each_migration_once(db_factory: Callable[..., str]) -> None:
    dsn = db_factory("none")
    barrier = threading.Barrier(3)
    results: list[list[str]] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                results.append([m.version for m in migrator.migrate(conn)])
        except BaseException as exc:  # collected and asserted below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    all_versions = [m.version for m in migrator.discover()]
    assert sorted(results, key=len) == [[], [], all_versions]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _versions(conn) == all_versions
        assert conn.execute("select count(*) from pg_namespace where nspname = 'pgmq'").fetchone() == (1,)


@pytest.mark.slow
def test_pgmq_is_installed_once(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("none"), autocommit=True) as conn:
        assert migrator.ensure_pgmq(conn) is None  # the template already has it
        conn.execute("drop schema pgmq cascade")
        assert migrator.ensure_pgmq(conn) == "bundled SQL"
        assert migrator.ensure_pgmq(conn) is None
        conn.execute("select pgmq.create('after_reinstall')")


@pytest.mark.slow
def test_an_empty_pgmq_schema_is_refused_before_any_migration(cluster: Any) -> None:
    # migrate skipped installing PGMQ, applied 0001, then failed in 0002 on a missing
    # pgmq function: now it says what is wrong and applies nothing
    dsn = cluster.create_database(f"{cluster.prefix}_emptypgmq")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create schema pgmq")
        with pytest.raises(errors.MigrationError, match="schema pgmq exists but PGMQ is not "
                                                        "installed") as raised:
            migrator.migrate(conn)
        assert "drop schema pgmq" in (raised.value.hint or "")
        assert migrator.status(conn)[0].applied_at is None


@pytest.mark.slow
def test_a_database_owner_without_superuser_migrates_where_pgmq_is_no_extension(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A managed provider: flowlane's login role owns its database, is no superuser, may not
    create roles (a role administrator ran what `flowlane db roles` prints) and the server
    has no PGMQ extension; `flowlane db migrate --roles` installs PGMQ's SQL and every migration."""
    owner, password = f"fl_owner_{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    dbname = f"{cluster.prefix}_owned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(cluster.admin_dsn, autocommit=True) as admin:
        assert admin.execute(
            "select count(*) from pg_available_extensions where name = 'pgmq'").fetchone() == (0,)
        admin.execute(sql.SQL("create role {} login password {} nosuperuser nocreaterole "
                              "nocreatedb").format(sql.Identifier(owner), sql.Literal(password)))
        assert cli.main(["db", "roles"]) == 0  # what a role administrator runs once
        admin.execute(capsys.readouterr().out.encode())
        admin.execute(sql.SQL("create database {} owner {} template template0").format(
            sql.Identifier(dbname), sql.Identifier(owner)))
    owner_dsn = make_conninfo(cluster.dsn_for(dbname), user=owner, password=password, passfile="")
    try:
        assert cli.main(["db", "migrate", "--roles", "--dsn", owner_dsn]) == 0
        out = capsys.readouterr().out
        assert f"{len(migrator.discover())} migration(s) applied" in out
        assert f"roles {', '.join(migrator.ROLES)} are up to date" in out
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            assert conn.execute("select rolsuper from pg_roles where rolname = current_user"
                                ).fetchone() == (False,)
            assert conn.execute("select count(*) from pg_extension where extname = 'pgmq'"
                                ).fetchone() == (0,)
            assert _versions(conn) == [m.version for m in migrator.discover()]
            owners = conn.execute(
                "select distinct pg_get_userbyid(nspowner) from pg_namespace "
                "where nspname in ('pgmq', 'flowlane')").fetchall()
            assert owners == [(owner,)]
            # the engine works for its owner: a flow, a run, a claim
            engine = Engine(conn)
            engine.define("owned", [("only", [], {})])
            run_id = engine.start("owned", {"n": 1})
            [task] = engine.claim("owned")
            engine.complete(task, {"ok": True})
            assert engine.scalar("select status from flowlane.runs where run_id = %s",
                                 [run_id]) == "completed"
    finally:
        cluster.drop_database(dbname)
        with psycopg.connect(cluster.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("drop role {}").format(sql.Identifier(owner)))


@pytest.mark.slow
def test_an_owner_that_may_not_create_roles_has_them_created_by_a_role_administrator(
    reachable_tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The set-up of docs/security.md on a server of its own (roles are cluster-wide, so none
    of them exists there yet): `migrate --roles` stops and says who creates them; the role
    administrator runs what `flowlane db roles` prints; `migrate --roles` grants them; a role
    dropped later is named by every `migrate`, which grants the others."""
    pgdata = reachable_tmp_path / "data"
    admin_dsn = db.EmbeddedDatabase.start_at(pgdata)
    try:
        owner, password = "fl_owner", secrets.token_hex(12)
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("create role {} login password {} nocreaterole").format(
                sql.Identifier(owner), sql.Literal(password)))
            admin.execute("create database app owner fl_owner")
        owner_dsn = make_conninfo(admin_dsn, dbname="app", user=owner, password=password, passfile="")

        assert cli.main(["db", "migrate", "--roles", "--dsn", owner_dsn]) != 0
        err = capsys.readouterr().err
        missing = ", ".join(sorted(migrator.ROLES))
        assert f"roles {missing} do not exist, and fl_owner may not create roles" in err
        assert "`flowlane db roles`" in err

        assert cli.main(["db", "roles"]) == 0
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(capsys.readouterr().out.encode())
        assert cli.main(["db", "migrate", "--roles", "--dsn", owner_dsn]) == 0
        assert f"roles {', '.join(migrator.ROLES)} are up to date" in capsys.readouterr().out

        with psycopg.connect(make_conninfo(admin_dsn, dbname="app"), autocommit=True) as admin:
            admin.execute("drop owned by flowlane_console; drop role flowlane_console")
        assert cli.main(["db", "migrate", "--dsn", owner_dsn]) == 0
        out = capsys.readouterr().out
        assert "roles flowlane_console do not exist: have a role administrator run" in out
        assert "flowlane_application, flowlane_admin are up to date" in out
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)
