"""Apply the SQL Core migrations in order, each in its own transaction.

Migrations are ``flowlane/core/migrations/NNNN_name.sql``; ``released.json`` beside them
records the checksum of every migration a release shipped, by release (a released migration
never changes). Each release adds one migration; the one that no release lists yet is
pending: it is drafted again from the engine source until its release.

Applied migrations are recorded with their sha256 in ``flowlane.schema_migrations``. A
database that recorded a migration this flowlane does not ship as it was applied was built
by a development build: it is refused before anything runs. A session advisory lock
serialises concurrent ``migrate`` calls.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any, NoReturn

import psycopg

from flowlane import errors
from flowlane.core import db
from flowlane.core.queries import query

_FILENAME = re.compile(r"^(?P<version>[0-9]{4})_(?P<name>[a-z0-9_]+)\.sql$")
RELEASED = "released.json"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    sql: str
    release: str | None = None  # the release that shipped it; None while it is pending

    @property
    def filename(self) -> str:
        return f"{self.version}_{self.name}.sql"

    @property
    def checksum(self) -> str:
        return _sha256(self.sql)

    def applied_as(self, name: str, checksum: str) -> bool:
        """Whether a database that recorded ``name`` and ``checksum`` applied this file."""
        return name == self.name and checksum == self.checksum


@dataclass(frozen=True)
class MigrationState:
    migration: Migration | None
    version: str
    name: str
    applied_at: datetime | None
    recorded_checksum: str | None

    @property
    def applied(self) -> bool:
        return self.applied_at is not None

    @property
    def foreign(self) -> bool:
        """Applied, but not as this flowlane ships it: a development build applied it."""
        return self.applied and (self.migration is None or not self.migration.applied_as(
            self.name, self.recorded_checksum or ""))


def discover() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    release_of = {filename: release for release, files in released().items() for filename in files}
    found = []
    for entry in resources.files("flowlane.core.migrations").iterdir():
        match = _FILENAME.match(entry.name)
        if match:
            found.append(Migration(match["version"], match["name"], entry.read_text("utf-8"),
                                   release_of.get(entry.name)))
        elif entry.name.endswith(".sql"):
            raise errors.MigrationError(f"badly named migration file {entry.name}",
                                        hint="name migrations NNNN_lower_snake_name.sql")
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise errors.MigrationError(f"duplicate migration versions in {versions}")
    return found


def released() -> dict[str, dict[str, str]]:
    """The released migrations' checksums (``released.json``): release -> file name -> sha256."""
    text = resources.files("flowlane.core.migrations").joinpath(RELEASED).read_text("utf-8")
    manifest: dict[str, dict[str, str]] = json.loads(text)
    return manifest


def pending() -> Migration | None:
    """The migration no release has shipped yet, if there is one."""
    return next((m for m in discover() if m.release is None), None)


def ensure_pgmq(conn: psycopg.Connection[Any]) -> str | None:
    """Make sure schema ``pgmq`` exists; return how it was installed, or None if it was there."""
    if _scalar(conn, "pgmq_schema_exists"):
        if not _scalar(conn, "pgmq_installed"):  # checked before any migration runs
            raise errors.MigrationError(
                "schema pgmq exists but PGMQ is not installed in it",
                hint="drop the schema (`drop schema pgmq`) so that `flowlane db migrate` "
                "installs PGMQ, or install PGMQ into it (`create extension pgmq`)")
        return None
    if _scalar(conn, "pgmq_extension_available"):
        with conn.transaction():
            conn.execute(query("create_pgmq_extension"))
        return "extension"
    from pgmq.install import get_embedded_install_sql

    with conn.transaction():
        conn.execute(get_embedded_install_sql())
    return "bundled SQL"


def status(conn: psycopg.Connection[Any]) -> list[MigrationState]:
    """Applied and pending migrations, including recorded ones missing from the package."""
    with db.wrap_errors("reading migration status"):
        return _states(discover(), _recorded(conn))


def _states(available: Sequence[Migration], recorded: dict[str, Any]) -> list[MigrationState]:
    recorded = dict(recorded)
    states = []
    for migration in available:
        row = recorded.pop(migration.version, None)
        states.append(MigrationState(migration, migration.version, row["name"] if row else migration.name,
                                     row["applied_at"] if row else None,
                                     row["checksum"] if row else None))
    for version, row in sorted(recorded.items()):
        states.append(MigrationState(None, version, row["name"], row["applied_at"], row["checksum"]))
    return sorted(states, key=lambda s: s.version)


def migrate(conn: psycopg.Connection[Any], *, to: str | None = None,
            roles: bool = False) -> list[Migration]:
    """Install PGMQ if absent and apply pending migrations up to ``to``; return the applied ones.

    ``roles`` sets up the least-privilege roles (``flowlane/core/sql/roles.sql``); a database
    that has them gets them re-applied after every migrate, because a migration's
    ``create or replace function`` drops SECURITY DEFINER and a new function has no grant.
    """
    if not conn.autocommit:
        raise errors.UsageError("migrate needs an autocommit connection")
    available = discover()
    if to is not None and to not in {m.version for m in available}:
        raise errors.UsageError(f"unknown migration version {to!r}",
                                hint="versions: " + ", ".join(m.version for m in available))
    with db.wrap_errors("migrating"):
        conn.execute(query("migrate_lock"))
        try:
            ensure_pgmq(conn)
            conn.execute(query("bootstrap_migrations_table"))
            applied = _apply_pending(conn, available, to)
            if roles or roles_applied(conn):
                apply_roles(conn, required=roles)
            return applied
        finally:
            conn.execute(query("migrate_unlock"))


ROLES = ("flowlane_worker", "flowlane_deployer", "flowlane_operator", "flowlane_application",
         "flowlane_console", "flowlane_admin")


def apply_roles(conn: psycopg.Connection[Any], *, required: bool = True) -> None:
    """Create (where the migrating role may) and grant the roles of :data:`ROLES`
    (docs/security.md). ``required``: a missing role that cannot be created is an error;
    otherwise the roles that exist are granted and :func:`missing_roles` names the others."""
    with db.wrap_errors("setting up roles"), conn.transaction():
        conn.execute("select set_config('flowlane.roles_required', %s, true)",
                     ("on" if required else "off",))
        conn.execute(query("apply_roles_queue_grants"))
        conn.execute(query("apply_roles"))


def missing_roles(conn: psycopg.Connection[Any]) -> list[str]:
    row = conn.execute(query("missing_roles"), {"roles": list(ROLES)}).fetchone()
    return list(row[0]) if row else []


def role_statements() -> str:
    """What a superuser or role administrator runs once per cluster when the owner of the
    flowlane schema may not create roles (each statement leaves an existing role as it is)."""
    return "".join(f"do $$ begin create role {role} nologin; "
                   "exception when duplicate_object then null; end $$;\n" for role in ROLES)


def roles_applied(conn: psycopg.Connection[Any]) -> bool:
    return bool(_scalar(conn, "roles_applied"))


def _apply_pending(conn: psycopg.Connection[Any], available: Sequence[Migration],
                   to: str | None) -> list[Migration]:
    recorded = _recorded(conn)
    if foreign := [f"{s.version}_{s.name}" for s in _states(available, recorded) if s.foreign]:
        raise development_build(foreign)
    applied = []
    for migration in available:
        if to is not None and migration.version > to:
            break
        if migration.version in recorded:
            continue
        _apply_one(conn, migration)
        applied.append(migration)
    return applied


# A migration that changes tables takes their strongest lock; workers that keep running
# through an upgrade lock the same tables in their own order, so PostgreSQL may end the
# migration's transaction as a deadlock's victim (or a lock wait as too long). Nothing of it
# was applied then: it is run again, a bounded number of times.
RETRIED_SQLSTATES = frozenset({"40P01", "55P03"})  # deadlock_detected, lock_not_available
ATTEMPTS = 5


def _apply_one(conn: psycopg.Connection[Any], migration: Migration) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _run_in_transaction(conn, migration)
            return
        except psycopg.Error as exc:
            if exc.sqlstate in RETRIED_SQLSTATES and attempt < ATTEMPTS:
                continue
            _raise_failed(migration, exc)


def _run_in_transaction(conn: psycopg.Connection[Any], migration: Migration) -> None:
    with conn.transaction():
        conn.execute(migration.sql)  # package data, vouched for
        conn.execute(query("record_migration"), {
            "version": migration.version, "name": migration.name,
            "checksum": migration.checksum,
        })


def _raise_failed(migration: Migration, exc: psycopg.Error) -> NoReturn:
    raise errors.MigrationError(
        f"migration {migration.filename} failed and was rolled back: "
        f"{exc.diag.message_primary or exc}",
        detail=exc.diag.message_detail,
        hint=exc.diag.message_hint,
        sqlstate=exc.sqlstate,
    ) from exc


def development_build(foreign: Sequence[str]) -> errors.MigrationError:
    """The refusal of a database that applied ``foreign``, migrations no release ships as applied."""
    applied = (f"{', '.join(foreign)}, which no release of flowlane ships as applied" if len(foreign) <= 3
               else f"{len(foreign)} migrations that no release of flowlane ships as applied "
               f"({foreign[0]} … {foreign[-1]})")
    return errors.MigrationError(
        f"this database was built by a development build of flowlane: it applied {applied}, so no "
        "migration can bring it up to date",
        hint="a development database: `flowlane db reset --yes` drops its flows, runs and "
        "queues and migrates it again (then `flowlane apply`); a database whose runs you need: "
        "restore the backup taken before that build, or migrate a new database and start "
        "the runs there")


def reset(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Drop schemas ``flowlane`` and ``pgmq`` with everything in them, then migrate again;
    the roles are set up again where they were."""
    if not conn.autocommit:
        raise errors.UsageError("reset needs an autocommit connection")
    roles = roles_applied(conn)
    with db.wrap_errors("resetting the database"):
        conn.execute(query("migrate_lock"))
        try:
            with conn.transaction():
                conn.execute(query("drop_flowlane_and_pgmq"))
        finally:
            conn.execute(query("migrate_unlock"))
    return migrate(conn, roles=roles)


def _recorded(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    if not _scalar(conn, "migrations_table_exists"):
        return {}
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(query("applied_migrations")).fetchall()
    return {row["version"]: row for row in rows}


def _scalar(conn: psycopg.Connection[Any], name: str) -> Any:
    row = conn.execute(query(name)).fetchone()
    return row[0] if row else None
