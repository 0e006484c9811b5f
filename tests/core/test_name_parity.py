"""The SQL Core's name rules (``is_valid_slug``, ``is_valid_queue_name`` with the ``__``
reservation of explicit queues, ``is_valid_deployment_name``) agree with names.py and the
JSON Schema for generated names: unicode look-alikes, case variants, boundary lengths,
digits first, underscores, empty, the reserved word."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowlane.compiler import names
from tests.compiler.strategies import FIXED, NAMES
from tests.compiler.test_names import schema_accepts

pytestmark = pytest.mark.slow

RULES = """
select flowlane.is_valid_slug(v),
       flowlane.is_valid_queue_name(v) and position('__' in v) = 0,
       flowlane.is_valid_deployment_name(v)
from unnest(%s::text[]) with ordinality as given(v, n)
order by n
"""


def assert_agreement(conn: psycopg.Connection[Any], values: list[str]) -> None:
    rows = conn.execute(RULES, (values,)).fetchall()
    for value, (slug, queue, deployment) in zip(values, rows, strict=True):
        python = (names.slug_problem(value) is None, names.queue_problem(value) is None,
                  schema_accepts("deployment", value))
        schema = (schema_accepts("slug", value), schema_accepts("queue", value),
                  schema_accepts("deployment", value))
        assert (slug, queue, deployment) == python == schema, repr(value)


def test_fixed_near_misses_agree_in_sql(conn: psycopg.Connection[Any]) -> None:
    assert_agreement(conn, list(FIXED))
    rows = conn.execute(RULES, (["run", "a" * 47, "a" * 48, "a__b", "1.x-y"],)).fetchall()
    assert rows == [(False, True, True), (True, True, True), (True, False, True),
                    (False, False, True), (False, False, True)]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(NAMES, min_size=1, max_size=40))
def test_sql_python_and_schema_accept_the_same_names(conn: psycopg.Connection[Any],
                                                     values: list[str]) -> None:
    assert_agreement(conn, values)


ADOPTION = ["hello", "Hello", "hello_v2", "other"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(ADOPTION), st.sampled_from(ADOPTION),
       st.lists(st.sampled_from(ADOPTION), max_size=3))
def test_sql_and_python_let_an_alias_take_the_same_flow_names(
        conn: psycopg.Connection[Any], alias: str, flow: str, versions: list[str]) -> None:
    sql = conn.execute("select flowlane._alias_may_take_flow_name(%s, %s, %s::text[])",
                       (alias, flow, versions)).fetchone()
    assert sql == (names.alias_may_take_flow_name(alias, flow, versions),)
