"""Draft the next migration from the difference between the engine source and the migrations.

    python -m flowlane.core.draft_migration NAME      # writes migrations/NNNN_NAME.sql
    python -m flowlane.core.draft_migration --check   # exit 1 while source and migrations differ

Two scratch databases are built, one by the migrations and one from the engine source
(``flowlane/core/engine``), and compared. Functions are drafted: a changed or new one as
its source text (``create or replace function``), a removed one as ``drop function``, one
whose arguments (types, names or defaults) or result changed as a drop and a create. A
dropped signature that other functions of the migrated schema call is flagged with their
names: a call in flight when the migration commits runs their old bodies, which call it.
Every other difference (tables, columns, constraints, indexes, views, types, triggers,
comments) is flagged in the draft as a comment with the two ``pg_dump`` texts, for a
person to write: the tool never writes ``alter table``. Review the draft, run ``--check``
(it passes once the draft brings the migrations to the source) and commit both.

Without ``--dsn`` a throwaway embedded server is started in a temporary directory; with
it, scratch databases are created (and dropped) on that server.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from flowlane import errors
from flowlane.core import db, engine_source, migrator, schema_dump
from flowlane.core.queries import query

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_NAME = re.compile(r"^[a-z0-9_]+$")
_OBJECT_TITLE = re.compile(r"^-- (?P<title>[A-Z][A-Z ]* \S.*)$", re.MULTILINE)
FLAG = "-- TO WRITE BY HAND:"


@dataclass(frozen=True)
class Function:
    identity: str  # flowlane.name(argument types)
    name: str
    arguments: str  # with their names and defaults, which create or replace cannot change
    result: str
    definition: str  # pg_get_functiondef


@dataclass
class Difference:
    """What the migrations must gain to equal the source."""

    created: list[str] = field(default_factory=list)  # function names, new or changed
    dropped: list[str] = field(default_factory=list)  # identities
    # dropped identity -> the functions of the migrated schema whose bodies call it by name
    called_by: dict[str, list[str]] = field(default_factory=dict)
    flagged: dict[str, tuple[str, str]] = field(default_factory=dict)  # object title -> (migrated, source)

    @property
    def empty(self) -> bool:
        return not (self.created or self.dropped or self.flagged)

    def summary(self) -> list[str]:
        return ([f"create or replace {name}" for name in self.created]
                + [f"drop {identity}" for identity in self.dropped]
                + [f"by hand: {title}" for title in self.flagged])


def compare(dsn: str | None = None, source_dir: Path | None = None) -> Difference:
    """Build a database from the migrations and one from the source; what differs."""
    with schema_dump.server(dsn) as admin_dsn, \
            schema_dump.scratch_database(admin_dsn) as migrated, \
            schema_dump.scratch_database(admin_dsn) as built:
        with db.connect(migrated, autocommit=True) as conn:
            migrator.migrate(conn)
        with db.connect(built, autocommit=True) as conn:
            engine_source.build(conn, source_dir)
        return difference(migrated, built)


def difference(migrated_dsn: str, source_dsn: str) -> Difference:
    """How the database at ``migrated_dsn`` differs from the one at ``source_dsn``."""
    old, new = _functions(migrated_dsn), _functions(source_dsn)
    result = Difference()
    for identity, function in old.items():
        replaced = new.get(identity)
        if replaced is None or (replaced.arguments, replaced.result) != (function.arguments, function.result):
            result.dropped.append(identity)
    result.called_by = {identity: callers for identity in result.dropped
                        if (callers := _callers(old, identity))}
    for identity, function in new.items():
        before = old.get(identity)
        if before is None or before.definition != function.definition or identity in result.dropped:
            result.created.append(function.name)
    result.flagged = _other_differences(schema_dump.dump(migrated_dsn), schema_dump.dump(source_dsn))
    return result


def draft(difference: Difference, name: str, version: str, source_dir: Path | None = None) -> str:
    """The text of migration ``version``_``name`` that applies ``difference``."""
    sources = engine_source.functions(source_dir)
    order = list(sources)
    parts = [(f"-- flowlane SQL Core {version}: {name.replace('_', ' ')}.\n"
              "-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; "
              "reviewed by a person.\n-- (Say here what changes and why.)")]
    for identity in difference.dropped:
        if identity in difference.called_by:
            parts.append(f"{FLAG} {identity} is called by {', '.join(difference.called_by[identity])}: a call"
                         " in flight when this migration commits runs their old bodies to the end and"
                         " fails without it; keep the signature (CONTRIBUTING, rules for migrations)")
        parts.append(f"drop function {identity};")
    for function in sorted((f for f in difference.created if f in sources), key=order.index):
        parts.append(_create_or_replace(sources[function]))
    for function in sorted(f for f in difference.created if f not in sources):
        parts.append(f"{FLAG} function {function} is written by the source at run time, not defined in it;"
                     " call the function that writes it")
    for title, (migrated, source) in difference.flagged.items():
        parts.append(_flag(title, migrated, source))
    return "\n\n".join(parts) + "\n"


def next_version() -> str:
    return f"{int(migrator.discover()[-1].version) + 1:04d}"


def _callers(functions: dict[str, Function], identity: str) -> list[str]:
    """The other functions whose bodies call the one ``identity`` names (by name: any signature)."""
    name = functions[identity].name
    call = re.compile(rf"\bflowlane\.{re.escape(name)}\s*\(")
    return sorted(caller for caller, function in functions.items()
                  if function.name != name and call.search(function.definition))


def _functions(dsn: str) -> dict[str, Function]:
    with db.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute(query("engine_functions")).fetchall()
    return {row["identity"]: Function(**row) for row in rows}


def _other_differences(migrated: str, source: str) -> dict[str, tuple[str, str]]:
    old, new = _objects(migrated), _objects(source)
    flagged = {}
    for title in [*old, *(t for t in new if t not in old)]:
        if title.startswith("FUNCTION "):
            continue
        before, after = old.get(title, ""), new.get(title, "")
        if before != after:
            flagged[title] = (before, after)
    return flagged


def _objects(dump: str) -> dict[str, str]:
    """A normalized dump's objects by their ``-- TYPE name`` title."""
    titles = list(_OBJECT_TITLE.finditer(dump))
    objects = {}
    for title, following in zip(titles, [*titles[1:], None], strict=True):
        end = following.start() if following else len(dump)
        objects[title["title"]] = dump[title.end():end].strip()
    return objects


def _create_or_replace(statement: str) -> str:
    return re.sub(r"^create\s+function", "create or replace function", statement, count=1,
                  flags=re.IGNORECASE | re.MULTILINE)


def _flag(title: str, migrated: str, source: str) -> str:
    change = "new" if not migrated else "removed" if not source else "changed"
    lines = [f"{FLAG} {title} ({change}); the migrations give the first text, the source the second"]
    lines += ["--   " + line for line in difflib.unified_diff(
        migrated.splitlines(), source.splitlines(), "migrations", "source", lineterm="", n=1)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowlane.core.draft_migration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", nargs="?", help="the migration's name, lower_snake_case")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 while the source and the migrations differ")
    parser.add_argument("--dsn", help="a server whose user may CREATE DATABASE (default: a throwaway "
                        "embedded server)")
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)  # a copy of the source (tests)
    args = parser.parse_args(argv)
    if args.check == bool(args.name):
        parser.error("give a migration NAME to draft, or --check")
    if args.name and not _NAME.match(args.name):
        parser.error(f"bad migration name {args.name!r}: use lower_snake_case")
    try:
        found = compare(args.dsn, args.source)
        return _report(found) if args.check else _write(found, args.name, args.source)
    except errors.FlowlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code


def _write(found: Difference, name: str, source_dir: Path | None) -> int:
    if found.empty:
        print("the engine source and the migrations agree: nothing to draft")
        return 0
    version = next_version()
    target = MIGRATIONS_DIR / f"{version}_{name}.sql"
    if target.exists():
        raise errors.UsageError(f"{target} exists", hint="choose another name or remove the draft")
    target.write_text(draft(found, name, version, source_dir), encoding="utf-8")
    for line in found.summary():
        print(f"  {line}")
    print(f"wrote {target}: review it, write what is marked '{FLAG}', then run --check")
    return 0


def _report(found: Difference) -> int:
    if found.empty:
        print("the engine source and the migrations agree")
        return 0
    print("the engine source and the migrations differ:", file=sys.stderr)
    for line in found.summary():
        print(f"  {line}", file=sys.stderr)
    print("draft a migration: python -m flowlane.core.draft_migration NAME", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
