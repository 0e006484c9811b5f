"""A flow option left out of a definition gets the same value from the compiler (``flowlane.defaults``)
and from the SQL Core (``_flow_option_default``: create_flow and the column defaults
of ``flowlane.flows``)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from flowlane import defaults

pytestmark = pytest.mark.slow

PYTHON_DEFAULTS = dict(defaults.FLOW)


def test_sql_holds_the_compilers_flow_option_defaults(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute("select o, flowlane._flow_option_default(o) from unnest(%s::text[]) o",
                        (list(PYTHON_DEFAULTS),)).fetchall()
    assert dict(rows) == PYTHON_DEFAULTS


def test_create_flow_and_the_column_defaults_take_the_same_defaults(conn: psycopg.Connection[Any]) -> None:
    created = conn.execute(
        "select opt_max_attempts, opt_base_delay, opt_timeout from flowlane.create_flow('defaults')"
    ).fetchone()
    with conn.transaction(force_rollback=True):
        inserted = conn.execute(
            "insert into flowlane.flows (flow_slug) values ('by_column') "
            "returning opt_max_attempts, opt_base_delay, opt_timeout"
        ).fetchone()
    assert created == inserted == tuple(PYTHON_DEFAULTS.values())



def test_sql_holds_the_compilers_retention_default(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("select flowlane._flow_option_default('retention'), "
                       "(flowlane.create_flow('kept')).opt_retention").fetchone()
    with conn.transaction(force_rollback=True):
        inserted = conn.execute("insert into flowlane.flows (flow_slug) values ('by_column') "
                                "returning opt_retention").fetchone()
    assert row == (defaults.RETENTION, defaults.RETENTION)
    assert inserted == (defaults.RETENTION,)
