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
from pathlib import Path
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


def files(directory: Path | None = None) -> list[SourceFile]:
    """The engine's source files (the package's, or a copy in ``directory``), in the order
    they are applied (their numeric prefix)."""
    found = []
    entries = directory.iterdir() if directory else resources.files("flowlane.core.engine").iterdir()
    for entry in entries:
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


def build(conn: psycopg.Connection[Any], directory: Path | None = None) -> None:
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
            for source in files(directory):
                _apply(conn, source)


def functions(directory: Path | None = None) -> dict[str, str]:
    """Each function's ``create function`` statement in the source, by function name."""
    found: dict[str, str] = {}
    for source in files(directory):
        for statement in statements(source.sql):
            match = _CREATE_FUNCTION.match(_without_comments(statement))
            if not match:
                continue
            name = match["name"].lower()
            if name in found:
                raise errors.MigrationError(f"function flowlane.{name} is defined twice in the engine source",
                                            hint="define each function once, where it is used")
            found[name] = _with_own_comment(statement)
    return found


def _with_own_comment(statement: str) -> str:
    """The statement with the comment block right above it, not a file's or section's heading
    (separated from it by a blank line)."""
    lines = statement.strip("\n").splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("--"))
    blanks = [i for i in range(head) if not lines[i].strip()]
    return "\n".join(lines[blanks[-1] + 1 if blanks else 0:]).strip("\n")


_CREATE_FUNCTION = re.compile(r"create\s+(?:or\s+replace\s+)?function\s+flowlane\.(?P<name>[a-z_0-9]+)\s*\(",
                              re.IGNORECASE)
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


def statements(text: str) -> list[str]:
    """``text`` split after each top-level semicolon, each statement with its comment lines above
    it (quotes, dollar quotes and comments respected)."""
    found, start, i = [], 0, 0
    while i < len(text):
        i = _skip_literal(text, i)
        if i < len(text) and text[i] == ";":
            found.append(text[start : i + 1].strip("\n"))
            start = i + 1
        i += 1
    if text[start:].strip():
        found.append(text[start:].strip("\n"))
    return found


def _skip_literal(text: str, i: int) -> int:
    """The index of the last character of the comment or quoted text starting at ``i`` (or ``i``)."""
    if text.startswith("--", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text.startswith("/*", i):
        return text.index("*/", i) + 1
    if text[i] in "'\"":
        end = i + 1
        while True:
            end = text.index(text[i], end)
            if not text.startswith(text[i] * 2, end):
                return end
            end += 2
    tag = _DOLLAR_TAG.match(text, i)
    if tag and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        return text.index(tag[0], tag.end()) + len(tag[0]) - 1
    return i


def _without_comments(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--")).strip()


def _apply(conn: psycopg.Connection[Any], source: SourceFile) -> None:
    try:
        conn.execute(source.sql)  # package data, vouched for
    except psycopg.Error as exc:
        raise errors.MigrationError(
            f"engine source {source.name} failed: {exc.diag.message_primary or exc}",
            detail=exc.diag.message_detail, hint=exc.diag.message_hint, sqlstate=exc.sqlstate,
        ) from exc
