"""The engine's clock: _now() and _clock_timestamp(), inlined where they are called, and moved
only in the pytest plugin's test databases."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from flowlane.core import migrator
from flowlane.testing.harness import install_clock

pytestmark = pytest.mark.slow


def test_the_clock_is_inlined_into_its_callers(conn: psycopg.Connection[Any]) -> None:
    plan = "\n".join(r[0] for r in conn.execute(
        "explain (verbose, costs off) select flowlane._now(), flowlane._clock_timestamp()").fetchall())
    assert "Output: now(), (now() + (clock_timestamp() - now()))" in plan
    assert "_now" not in plan and "_clock_timestamp" not in plan


def test_a_migrated_database_has_no_way_to_move_its_clock(conn: psycopg.Connection[Any]) -> None:
    with conn.transaction():
        assert conn.execute("select flowlane._now() = now()").fetchone() == (True,)
    assert conn.execute("select to_regnamespace('flowlane_testing')").fetchone() == (None,)
    with pytest.raises(pg_errors.InvalidSchemaName):
        conn.execute("select flowlane_testing.advance(3600)")
    migrator.migrate(conn, roles=True)
    for role in ("flowlane_worker", "flowlane_admin"):
        with pytest.raises(pg_errors.InsufficientPrivilege), conn.transaction():
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(role)))
            conn.execute("create or replace function flowlane._now() returns timestamptz"
                         " language sql stable as $$ select now() + interval '1 day' $$")


def test_a_test_database_clock_moves_forward(conn: psycopg.Connection[Any]) -> None:
    install_clock(conn)
    conn.execute("select flowlane_testing.advance(3600)")
    with conn.transaction():
        assert conn.execute("select extract(epoch from flowlane._now() - now())").fetchone() == (3600,)
        ahead = conn.execute("select flowlane._clock_timestamp() >= now() + interval '1 hour'")
        assert ahead.fetchone() == (True,)
    defaults = conn.execute(
        "select pg_get_expr(d.adbin, d.adrelid) from pg_attrdef d join pg_attribute a"
        " on a.attrelid = d.adrelid and a.attnum = d.adnum"
        " where d.adrelid = 'flowlane.runs'::regclass and a.attname = 'started_at'").fetchall()
    assert defaults == [("flowlane._now()",)]  # the time columns follow the test's clock too
    with pytest.raises(pg_errors.InvalidParameterValue, match="moves forward only"):
        conn.execute("select flowlane_testing.advance(-1)")
