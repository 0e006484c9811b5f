"""Apply the SQL Core migrations in order, each in its own transaction.

Migrations are ``flowlane/core/migrations/NNNN_name.sql``. Applied ones are
recorded with their sha256 in ``flowlane.schema_migrations``; a recorded
migration whose file changed is refused, except for an opening comment reworded after
release (``_REWORDED``). A session advisory lock serialises concurrent ``migrate`` calls.
"""

from __future__ import annotations

import hashlib
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

# Migrations whose opening comment was reworded after databases recorded them: version ->
# (the digest recorded for the earlier text, the digest of the statements both texts share).
# The earlier digest stays valid only while the statements are byte for byte the same.
_REWORDED: dict[str, tuple[str, str]] = {
    "0010": ("f58feec04888aeacdc1c1eeb8e3c82f45f4e9b487ed83a9fb8473aedbd4ea28b",
             "16a6a932c253a93a666eb41e22373edf20cabaae2ab6118c1637cac47a2a3d7d"),
}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def statements_of(sql: str) -> str:
    """A migration's text after its opening comment block: what it runs."""
    lines = sql.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines)
                  if line.strip() and not line.lstrip().startswith("--")), len(lines))
    return "".join(lines[first:])


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    sql: str

    @property
    def filename(self) -> str:
        return f"{self.version}_{self.name}.sql"

    @property
    def checksum(self) -> str:
        return _sha256(self.sql)

    def matches(self, recorded_checksum: str) -> bool:
        """Whether a database that recorded this digest applied this migration's statements."""
        if recorded_checksum == self.checksum:
            return True
        earlier, statements = _REWORDED.get(self.version, (None, None))
        return recorded_checksum == earlier and _sha256(statements_of(self.sql)) == statements


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
    def modified(self) -> bool:
        return (
            self.migration is not None
            and self.recorded_checksum is not None
            and not self.migration.matches(self.recorded_checksum)
        )


def discover() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    found = []
    for entry in resources.files("flowlane.core.migrations").iterdir():
        match = _FILENAME.match(entry.name)
        if match:
            found.append(Migration(match["version"], match["name"], entry.read_text("utf-8")))
        elif entry.name.endswith(".sql"):
            raise errors.MigrationError(f"badly named migration file {entry.name}",
                                        hint="name migrations NNNN_lower_snake_name.sql")
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise errors.MigrationError(f"duplicate migration versions in {versions}")
    return found


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
        recorded = _recorded(conn)
    states = []
    for migration in discover():
        row = recorded.pop(migration.version, None)
        states.append(MigrationState(migration, migration.version, migration.name,
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
                apply_roles(conn)
            return applied
        finally:
            conn.execute(query("migrate_unlock"))


def apply_roles(conn: psycopg.Connection[Any]) -> None:
    """Create or refresh roles ``flowlane_worker`` and ``flowlane_admin`` (docs/security.md)."""
    with db.wrap_errors("setting up roles"), conn.transaction():
        conn.execute(query("apply_roles_queue_grants"))
        conn.execute(query("apply_roles"))


def roles_applied(conn: psycopg.Connection[Any]) -> bool:
    return bool(_scalar(conn, "roles_applied"))


def _apply_pending(conn: psycopg.Connection[Any], available: Sequence[Migration],
                   to: str | None) -> list[Migration]:
    recorded = _recorded(conn)
    _refuse_modified(available, recorded)
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


def _refuse_modified(available: Sequence[Migration], recorded: dict[str, Any]) -> None:
    for migration in available:
        row = recorded.get(migration.version)
        if row and not migration.matches(row["checksum"]):
            raise errors.MigrationError(
                f"migration {migration.filename} was applied with checksum "
                f"{row['checksum'][:12]} but the file now has {migration.checksum[:12]}",
                hint="never edit an applied migration: restore the file and add a new "
                "migration with the change (see CONTRIBUTING.md, 'Migrations')",
            )


def _recorded(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    if not _scalar(conn, "migrations_table_exists"):
        return {}
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(query("applied_migrations")).fetchall()
    return {row["version"]: row for row in rows}


def _scalar(conn: psycopg.Connection[Any], name: str) -> Any:
    row = conn.execute(query(name)).fetchone()
    return row[0] if row else None
