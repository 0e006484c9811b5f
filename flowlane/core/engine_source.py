"""The SQL Core's source: ``flowlane/core/engine/NN_topic.sql``, applied in file-name order.

Each function is defined once, in the topic file where it is used, so that the engine reads
top to bottom (names, tables, queues, definitions, runs, claim, complete, fail, recovery,
fleet, console). The migrations are the history that brings an existing database to the
same place; a test proves that a database built from this source and one built from the
migrations are identical (``schema_dump.normalize``), and ``flowlane.core.draft_migration``
drafts the next migration from the difference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

from flowlane import errors
from flowlane.core import db, migrator
from flowlane.core.queries import query

_FILENAME = re.compile(r"^[0-9]{2}_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class SourceFile:
    name: str
    sql: str


def files() -> list[SourceFile]:
    """The engine's source files, in the order they are applied (their numeric prefix)."""
    found = []
    for entry in resources.files("flowlane.core.engine").iterdir():
        if _FILENAME.match(entry.name):
            found.append(SourceFile(entry.name, entry.read_text("utf-8")))
        elif entry.name.endswith(".sql"):
            raise errors.MigrationError(f"badly named engine source file {entry.name}",
                                        hint="name engine source files NN_topic.sql")
    found.sort(key=lambda f: f.name)
    prefixes = [f.name[:2] for f in found]
    if len(set(prefixes)) != len(prefixes):
        raise errors.MigrationError(f"two engine source files share a number: {prefixes}")
    return found


def build(conn: psycopg.Connection[Any]) -> None:
    """Build schema ``flowlane`` from the source in an empty database (PGMQ first, as the
    migrator does), in one transaction.

    Nothing is recorded in ``flowlane.schema_migrations``: such a database is for comparing
    with the migrations (the parity test, the drafting tool); ``flowlane db migrate`` is
    what builds and upgrades a database that is used.
    """
    if not conn.autocommit:
        raise errors.UsageError("building from the engine source needs an autocommit connection")
    with db.wrap_errors("building from the engine source"):
        migrator.ensure_pgmq(conn)
        conn.execute(query("bootstrap_migrations_table"))
        with conn.transaction():
            # bodies may name functions defined in a later file, as pg_dump's output does
            conn.execute("set local check_function_bodies = off")
            for source in files():
                _apply(conn, source)


def _apply(conn: psycopg.Connection[Any], source: SourceFile) -> None:
    try:
        conn.execute(source.sql)  # package data, vouched for
    except psycopg.Error as exc:
        raise errors.MigrationError(
            f"engine source {source.name} failed: {exc.diag.message_primary or exc}",
            detail=exc.diag.message_detail, hint=exc.diag.message_hint, sqlstate=exc.sqlstate,
        ) from exc
