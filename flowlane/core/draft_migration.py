"""Draft the pending migration from the difference between the engine source and the migrations.

    python -m flowlane.core.draft_migration           # redrafts the pending migration
    python -m flowlane.core.draft_migration NAME      # starts one: migrations/NNNN_NAME.sql
    python -m flowlane.core.draft_migration --check   # exit 1 while source and migrations differ

Each release ships one migration. Until its release it is pending (``released.json`` does not
list it), and every change to the engine source is drafted into it again; a released
migration never changes. A migration has three parts, in the order they run: tables, types
and data written by hand; the functions, drafted; and, written by hand again, what calls the
functions (checks and defaults that call them, triggers, data). A redraft rewrites only the
drafted part, from the difference between the released migrations and the source.

Two scratch databases are built, one by the migrations and one from the engine source
(``flowlane/core/engine``), and compared. Functions are drafted: a changed or new one as
its source text (``create or replace function``), a removed one as ``drop function``, one
whose arguments (types, names or defaults) or result changed as a drop and a create. A
dropped signature that other functions of the migrated schema call is flagged with their
names: a call in flight when the migration commits runs their old bodies, which call it.
Every other difference (tables, columns, constraints, indexes, views, types, triggers,
comments) is for a person to write in the hand-written parts: a new migration's draft
flags each as a comment with the two ``pg_dump`` texts, a redraft lists what is still
missing. The tool never writes ``alter table``. Review the draft, run ``--check`` (it passes
once the migrations bring a database to the source) and commit both.

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
REVIEW = "-- REVIEW:"  # drafted, but a person decides whether it may run as it is
BEFORE = "-- == Written by hand: tables, types and data that the functions need =="
DRAFTED = ("-- == Drafted from the engine source by `python -m flowlane.core.draft_migration`; "
           "redrafted, never edited ==")
AFTER = "-- == Written by hand: what calls the functions (checks, defaults, triggers, data) =="


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


def compare(dsn: str | None = None, source_dir: Path | None = None, to: str | None = None) -> Difference:
    """Build a database from the migrations (up to ``to``) and one from the source; what differs."""
    with schema_dump.server(dsn) as admin_dsn, \
            schema_dump.scratch_database(admin_dsn) as migrated, \
            schema_dump.scratch_database(admin_dsn) as built:
        with db.connect(migrated, autocommit=True) as conn:
            migrator.migrate(conn, to=to)
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
    """The text of a new migration ``version``_``name`` that applies ``difference``: its
    hand-written parts hold the flags of what is left to write."""
    header = (f"-- flowlane SQL Core {version}: {name.replace('_', ' ')}.\n"
              "-- Drafted by `python -m flowlane.core.draft_migration` from the engine source; "
              "reviewed by a person.\n-- (Say here what changes and why.)")
    flags = [_flag(title, migrated, source) for title, (migrated, source) in difference.flagged.items()]
    functions = drafted_functions(difference, source_dir)
    return "\n\n".join([header, BEFORE, DRAFTED, functions, AFTER, *flags]) + "\n"


def redraft(text: str, difference: Difference, source_dir: Path | None = None) -> str:
    """``text``, a pending migration, with its drafted part rewritten for ``difference``."""
    start, end = text.find(DRAFTED), text.find(AFTER)
    if start < 0 or end < start:
        raise errors.MigrationError("the pending migration has lost its part markers",
                                    hint=f"restore the lines {DRAFTED!r} and {AFTER!r}")
    return (text[:start] + DRAFTED + "\n\n" + drafted_functions(difference, source_dir) + "\n\n"
            + text[end:])


def drafted_functions(difference: Difference, source_dir: Path | None = None) -> str:
    """The functions ``difference`` drops and creates, in the source's order."""
    sources = engine_source.functions(source_dir)
    order = list(sources)
    # a body may call a function drafted after it, as the source's do
    parts = ["set local check_function_bodies = off;"]
    for identity in difference.dropped:
        if identity in difference.called_by:
            callers = ", ".join(difference.called_by[identity])
            parts.append(f"{REVIEW} {identity} is called by {callers}: a call"
                         " in flight when this migration commits runs their old bodies to the end and"
                         " fails without it; keep the signature while the previous release's workers"
                         " may call them (CONTRIBUTING, rules for migrations)")
        parts.append(f"drop function {identity};")
    for function in sorted((f for f in difference.created if f in sources), key=order.index):
        parts.append(_create_or_replace(sources[function]))
    written = sorted(f for f in difference.created if f not in sources)
    if written:
        parts.append(f"-- written at run time by the source, by a function that the part written by hand"
                     f" below calls: {', '.join(written)}")
    return "\n\n".join(parts)


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
    parser.add_argument("name", nargs="?", help="the name of a new pending migration, lower_snake_case")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 while the source and the migrations differ")
    parser.add_argument("--dsn", help="a server whose user may CREATE DATABASE (default: a throwaway "
                        "embedded server)")
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)  # a copy of the source (tests)
    args = parser.parse_args(argv)
    if args.check and args.name:
        parser.error("--check takes no migration NAME")
    if args.name and not _NAME.match(args.name):
        parser.error(f"bad migration name {args.name!r}: use lower_snake_case")
    try:
        if args.check:
            return _report(compare(args.dsn, args.source))
        pending = migrator.pending()
        if pending is None:
            return _start(args.name, args.dsn, args.source)
        if args.name and args.name != pending.name:
            raise errors.UsageError(f"{pending.filename} is pending: this release's changes go into it",
                                    hint="redraft it: python -m flowlane.core.draft_migration")
        return _redraft(pending, args.dsn, args.source)
    except errors.FlowlaneError as exc:
        print(exc.lines(), file=sys.stderr)
        return exc.exit_code


def _start(name: str | None, dsn: str | None, source_dir: Path | None) -> int:
    if not name:
        raise errors.UsageError("no migration is pending: name the next release's migration",
                                hint="python -m flowlane.core.draft_migration NAME")
    found = compare(dsn, source_dir)
    if found.empty:
        print("the engine source and the migrations agree: nothing to draft")
        return 0
    version = next_version()
    target = MIGRATIONS_DIR / f"{version}_{name}.sql"
    target.write_text(draft(found, name, version, source_dir), encoding="utf-8")
    for line in found.summary():
        print(f"  {line}")
    print(f"wrote {target}: review it, write what is marked '{FLAG}', then run --check")
    return 0


def _redraft(pending: migrator.Migration, dsn: str | None, source_dir: Path | None) -> int:
    released = max(m.version for m in migrator.discover() if m.release is not None)
    target = MIGRATIONS_DIR / pending.filename
    target.write_text(redraft(pending.sql, compare(dsn, source_dir, to=released), source_dir),
                      encoding="utf-8")
    print(f"redrafted the functions of {target}")
    left = compare(dsn, source_dir)
    if left.empty:
        print("the engine source and the migrations agree")
        return 0
    print("still to write by hand in its other parts:")
    for line in left.summary():
        print(f"  {line}")
    return 1


def _report(found: Difference) -> int:
    if found.empty:
        print("the engine source and the migrations agree")
        return 0
    print("the engine source and the migrations differ:", file=sys.stderr)
    for line in found.summary():
        print(f"  {line}", file=sys.stderr)
    print("redraft the pending migration: python -m flowlane.core.draft_migration", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
