"""Database harness shared by every test that needs PostgreSQL.

One server per session: the embedded PostgreSQL wheel, or the server named by
``FLOWLANE_TEST_DSN`` (a DSN whose user may CREATE DATABASE). Template
databases are built once per session (``pgmq`` only, migrated to each
migration version) and every test gets its own clone with
``CREATE DATABASE ... TEMPLATE``. A database that cannot be started or
reached fails the tests loudly; nothing is ever skipped for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowlane.core import db, migrator

for _name in ("FLOWLANE_DSN", "DATABASE_URL"):
    # the suite must never touch a developer's configured database
    os.environ.pop(_name, None)


class Cluster:
    """A PostgreSQL server the tests own: templates plus per-test clones."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.prefix = f"fltest_{uuid.uuid4().hex[:8]}"
        self._templates: dict[str, str] = {}
        self._created: list[str] = []

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.admin_dsn, dbname=dbname)

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_dsn, autocommit=True)

    def create_database(self, name: str, template: str | None = None) -> str:
        stmt = sql.SQL("create database {}").format(sql.Identifier(name))
        if template:
            stmt = sql.SQL("{} template {}").format(stmt, sql.Identifier(template))
        with self._admin() as conn:
            conn.execute(stmt)
        self._created.append(name)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))

    def template(self, version: str | None) -> str:
        """A template database with PGMQ and migrations up to ``version`` ('none' = PGMQ only)."""
        key = version or "head"
        if key not in self._templates:
            name = f"{self.prefix}_tpl_{key}"
            dsn = self.create_database(name)
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrator.ensure_pgmq(conn)
                if key != "none":
                    migrator.migrate(conn, to=version)
            self._templates[key] = name
        return self._templates[key]

    def prepared_template(self, key: str, prepare: Callable[[str], None]) -> str:
        """A template database: a clone of the head template that ``prepare(dsn)`` filled once
        (e.g. with the test project's flows), for tests that would each do the same set-up."""
        if key not in self._templates:
            name = f"{self.prefix}_tpl_{key}"
            prepare(self.create_database(name, template=self.template(None)))
            self._templates[key] = name
        return self._templates[key]

    def clone(self, version: str | None = None, *, template: str | None = None) -> str:
        """A new database: a copy of ``template`` (a name from ``prepared_template``) or of the
        template migrated to ``version``."""
        name = f"{self.prefix}_{uuid.uuid4().hex[:12]}"
        return self.create_database(name, template=template or self.template(version))

    def close(self) -> None:
        for name in reversed(self._created):
            self.drop_database(name)


# a fresh database per test, or a project's own embedded server
DATABASE_FIXTURES = frozenset({"cluster", "db_factory", "dsn", "conn", "reachable_tmp_path"})


def needs_a_database(item: pytest.Item) -> bool:
    return bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The speed class is written in the test file (tests/README.md): a test that uses a
    database fixture (directly or through another fixture) and is not marked `slow` fails
    before any database is made, since the fast loop, `pytest -m "not slow"`, runs it."""
    if needs_a_database(item) and item.get_closest_marker("slow") is None:
        pytest.fail(
            "this test uses a database fixture but is not marked slow: write "
            "`pytestmark = pytest.mark.slow` under the module's imports, or `@pytest.mark.slow` "
            "on each test of the module that needs a database",
            pytrace=False,
        )


def _no_durability(conn: psycopg.Connection[Any]) -> None:
    """The tests' own throwaway server never needs to survive a power loss: without fsync,
    creating a database per test costs a fraction (the suite's speed, not its meaning)."""
    for setting in ("fsync", "synchronous_commit", "full_page_writes"):
        conn.execute(sql.SQL("alter system set {} = off").format(sql.Identifier(setting)))
    conn.execute("select pg_reload_conf()")


MEMORY_DIR = Path("/dev/shm")
MEMORY_DIR_ROOM = 4 << 30  # bytes free that the servers' data directories may take


def _servers_tmp_root() -> Path | None:
    """Where the tests' PostgreSQL servers keep their data: in memory (``/dev/shm``) when it
    has room, else the system's temporary directory. On a disk, creating a database per test
    waits for the disk's writes, even with fsync off (CONTRIBUTING has the figures); the
    suite's speed, not its meaning."""
    usable = MEMORY_DIR.is_dir() and os.access(MEMORY_DIR, os.W_OK)
    return MEMORY_DIR if usable and shutil.disk_usage(MEMORY_DIR).free >= MEMORY_DIR_ROOM else None


def reachable_tmp_dir(prefix: str) -> Path:
    """A new private directory (0711) that the embedded server's account can walk into.

    Run as root, the embedded PostgreSQL runs as another account and flowlane never
    opens up directories it does not own; pytest's ``tmp_path`` is under a 0700 basetemp.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=_servers_tmp_root()))
    path.chmod(0o711)
    return path


@pytest.fixture
def reachable_tmp_path() -> Iterator[Path]:
    """Like ``tmp_path``, but reachable by the embedded server (for projects using `.flowlane/`)."""
    path = reachable_tmp_dir("flowlane-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    external = os.environ.get("FLOWLANE_TEST_DSN")
    # a private directory: pytest prunes old basetemp dirs, which would pull the
    # data directory from under a server still used by a concurrent session
    workdir = reachable_tmp_dir("flowlane-test-pg-")
    pgdata = workdir / "data"
    if external:
        admin_dsn = external
    else:
        try:
            admin_dsn = db.EmbeddedDatabase.start_at(pgdata)
        except Exception as exc:
            pytest.fail(f"cannot start the embedded PostgreSQL for the tests: {exc}", pytrace=False)
    try:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("select 1")
            if not external:
                _no_durability(conn)
    except psycopg.Error as exc:
        pytest.fail(f"cannot reach the test database {db.redact(admin_dsn)}: {exc}", pytrace=False)
    cluster = Cluster(admin_dsn)
    yield cluster
    cluster.close()
    if not external:
        db.EmbeddedDatabase.stop_at(pgdata)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def db_factory(cluster: Cluster) -> Iterator[Callable[..., str]]:
    """Make fresh databases.

    ``db_factory()`` is fully migrated, ``db_factory('0001')`` stops after that
    migration, ``db_factory('none')`` has PGMQ and nothing else;
    ``db_factory(template=cluster.prepared_template(...))`` copies a prepared template.
    """
    made: list[str] = []

    def make(version: str | None = None, *, template: str | None = None) -> str:
        dsn = cluster.clone(version, template=template)
        made.append(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])  # type: ignore[arg-type]
        return dsn

    yield make
    for name in made:
        cluster.drop_database(name)


@pytest.fixture
def dsn(db_factory: Callable[..., str]) -> str:
    """A fresh, fully migrated database."""
    return db_factory()


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to a fresh, fully migrated database."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        yield connection


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
