"""Schema ``flowlane`` as ``pg_dump --schema-only`` prints it, normalized, for comparing databases.

Every table, index, type and function, without the server version, owners, privileges
or session settings, so that the same schema always gives the same bytes: a database
built from the engine source (``flowlane/core/engine``) and one built from the
migrations compare equal (``tests/integration/test_engine_source.py``,
``python -m flowlane.core.draft_migration --check``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowlane import errors
from flowlane.core import db, embedded

HEADER = "-- schema flowlane as pg_dump prints it, normalized by flowlane.core.schema_dump\n"
# what varies between servers and runs without being part of the schema
_NOISE = re.compile(
    r"^(?:\\restrict .*|\\unrestrict .*|SET .*;|SELECT pg_catalog\.set_config\(.*\);"
    r"|-- Dumped (?:from|by) .*|-- PostgreSQL database dump(?: complete)?)$"
)


_TITLE = re.compile(r"^-- Name: (?P<name>.*); Type: (?P<type>.*); Schema: .*; Owner: .*$")


def normalize(dump: str) -> str:
    """``pg_dump`` output without its noise, each object under a ``-- TYPE name`` line."""
    lines = []
    for line in dump.splitlines():
        if _NOISE.match(line) or line == "--":
            continue
        title = _TITLE.match(line)
        lines.append(f"-- {title['type']} {title['name']}" if title else line.rstrip())
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
    return HEADER + "\n" + text + "\n"


def dump(dsn: str) -> str:
    """The normalized schema ``flowlane`` of the database at ``dsn``."""
    command = [embedded.program("pg_dump"), "--schema-only", "--schema=flowlane", "--no-owner",
               "--no-privileges", "--no-tablespaces", f"--dbname={dsn}"]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise errors.DatabaseError(f"pg_dump failed: {result.stderr.strip()}")
    return normalize(result.stdout)


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """``dsn``, or a throwaway embedded server in a temporary directory."""
    if dsn:
        yield dsn
        return
    workdir = Path(tempfile.mkdtemp(prefix="flowlane-schema-"))
    pgdata = workdir / "data"
    try:
        yield db.EmbeddedDatabase.start_at(pgdata)
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """A new empty database on the server at ``admin_dsn``, dropped afterwards."""
    name = f"flowlane_schema_{uuid.uuid4().hex[:12]}"
    with db.connect(admin_dsn, autocommit=True) as conn, db.wrap_errors("creating a scratch database"):
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
