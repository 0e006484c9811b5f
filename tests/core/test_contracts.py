"""Data contracts in the SQL Core: set_contract, the shape, and the input check at every start;
and the parity of the SQL validator with the Python one (``jsonschema``)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from flowlane.compiler import api, compiled, contracts, shape

pytestmark = pytest.mark.slow

ORDER_SCHEMA = {
    "type": "object", "required": ["customer", "lines"], "additionalProperties": False,
    "properties": {
        "customer": {"type": "string", "minLength": 1},
        "lines": {"type": "array", "items": {
            "type": "object", "required": ["sku", "price"],
            "properties": {"sku": {"type": "string"}, "price": {"type": "number", "minimum": 0}}}},
    },
}
FLOW = f"""
kind: flow
slug: orders
input_schema: {json.dumps(ORDER_SCHEMA)}
steps:
  total:
    handler: shop.orders:total
    output_schema: {{type: object, required: [amount]}}
"""
GOOD = {"customer": "ada", "lines": [{"sku": "x", "price": 2}]}
BAD = {"customer": "ada", "lines": [{"sku": "x", "price": 2}, {"sku": "y", "price": -5}]}


def _apply(conn: psycopg.Connection[Any], text: str = FLOW) -> None:
    for flow in api.project_from_text(text).flows:
        with conn.transaction():
            conn.execute(compiled.statements(compiled.render_flow(flow)))


def _counts(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    runs = conn.execute("select count(*) from flowlane.runs").fetchone()
    messages = conn.execute("select count(*) from pgmq.q_orders").fetchone()
    assert runs is not None and messages is not None
    return runs[0], messages[0]


def test_compiled_contracts_are_stored_and_part_of_the_shape(conn: psycopg.Connection[Any]) -> None:
    _apply(conn)
    _apply(conn)  # applying twice changes nothing
    flow = api.project_from_text(FLOW).flows[0]
    stored = conn.execute("select flowlane.get_flow_shape('orders')").fetchone()
    assert stored is not None and shape.same_json(stored[0], shape.flow_shape(flow))
    assert stored[0]["input_schema"] == ORDER_SCHEMA
    assert stored[0]["steps"][0]["output_schema"] == {"type": "object", "required": ["amount"]}


@pytest.mark.parametrize("start", [
    "select flowlane.start_flow('orders', %s)",
    "select flowlane.start_flow('orders', %s, gen_random_uuid())",
    ("select * from flowlane.start_flows('orders',"
     " array[%s, '{\"customer\": \"b\", \"lines\": []}']::jsonb[])"),
])
def test_every_start_refuses_a_bad_input_naming_the_path_and_creates_nothing(
        conn: psycopg.Connection[Any], start: str) -> None:
    _apply(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute(start, (Jsonb(BAD),))
    conn.rollback()
    assert "/lines/1/price: -5 is less than the minimum 0" in str(refused.value)
    assert "input_schema/properties/lines/items/properties/price/minimum" in (
        refused.value.diag.message_detail or "")
    assert _counts(conn) == (0, 0)
    conn.execute("select flowlane.start_flow('orders', %s)", (Jsonb(GOOD),))
    assert _counts(conn) == (1, 1)


def test_start_flows_names_the_refused_input_and_starts_none(conn: psycopg.Connection[Any]) -> None:
    _apply(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=r"run input 2 .*/: \[1, 2\] is not of type object"):
        conn.execute("select * from flowlane.start_flows('orders', %s::jsonb[])",
                     ([Jsonb(GOOD), Jsonb(GOOD), Jsonb([1, 2])],))
    conn.rollback()
    assert _counts(conn) == (0, 0)


def test_a_large_batch_is_checked_by_the_expression_and_names_the_same_input(
        conn: psycopg.Connection[Any]) -> None:
    _apply(conn)  # from 16 inputs on, the check runs as one planned expression, not a function
    inputs = [Jsonb(GOOD)] * 40
    inputs[33] = Jsonb(BAD)
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=r"run input 33 does not match .*/lines/1/price: -5 is less than"):
        conn.execute("select * from flowlane.start_flows('orders', %s::jsonb[])", (inputs,))
    conn.rollback()
    assert _counts(conn) == (0, 0)
    started = conn.execute("select count(*) from flowlane.start_flows('orders', %s::jsonb[])",
                           ([Jsonb(GOOD)] * 40,)).fetchone()
    assert started == (40,)


def test_a_contract_never_changes_once_the_flow_is_sealed(conn: psycopg.Connection[Any]) -> None:
    _apply(conn)
    with pytest.raises(psycopg.errors.CheckViolation,
                       match=r"FLOWLANE_SHAPE_MISMATCH.*a different input_schema"):
        conn.execute("select flowlane.set_contract('orders', null, '{\"type\": \"object\"}')")
    conn.rollback()
    with pytest.raises(psycopg.errors.CheckViolation, match="FLOWLANE_SHAPE_MISMATCH"):
        _apply(conn, FLOW.replace("minLength: 1", "minLength: 2").replace('"minLength": 1', '"minLength": 2'))
    conn.rollback()
    unchanged = conn.execute("select schema from flowlane.contracts where step_slug is null").fetchone()
    assert unchanged is not None and unchanged[0] == ORDER_SCHEMA


def test_set_contract_refuses_keywords_outside_the_subset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("select flowlane.create_flow('loose')")
    conn.execute("select flowlane.add_step('loose', 'a')")
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match="/properties/a/oneOf: keyword oneOf is outside"):
        conn.execute("select flowlane.set_contract('loose', null,"
                     " '{\"properties\": {\"a\": {\"oneOf\": []}}}')")
    conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="has no step"):
        conn.execute("""select flowlane.set_contract('loose', 'zz', '{}')""")


@pytest.mark.parametrize(("schema", "instance", "message"), [
    ({"minLength": 2.0}, "f", '"f" is shorter than 2 characters'),
    ({"maxLength": 1.0}, "ff", '"ff" is longer than 1 characters'),
    ({"minItems": 2.0}, [1], "has fewer than 2 items"),
    ({"maxItems": 0.0}, [1], "has more than 0 items"),
])
def test_a_count_written_as_a_whole_float_is_that_count(
        conn: psycopg.Connection[Any], schema: dict[str, float], instance: Any, message: str) -> None:
    found = conn.execute("select flowlane.contract_violation(%(s)s, %(i)s),"
                         " flowlane._contract_fast_accepts(%(s)s, %(i)s)",
                         {"s": Jsonb(schema), "i": Jsonb(instance)}).fetchone()
    assert found is not None and found[0]["message"] == message and found[1] is False
    assert [str(v) for v in contracts.violations(schema, instance)] == [f"/: {message}"]


def test_set_contract_takes_whole_float_counts_and_checks_them_as_whole_numbers(
        conn: psycopg.Connection[Any]) -> None:
    written = {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 2.0, "maxLength": 3.0},
        "tags": {"type": "array", "minItems": 1.0, "maxItems": 2.0}}}
    whole = json.loads(json.dumps(written).replace(".0", ""))
    for flow, schema in (("floats", written), ("whole", whole)):
        conn.execute("select flowlane.create_flow(%s)", (flow,))
        conn.execute("select flowlane.add_step(%s, 'a')", (flow,))
        conn.execute("select flowlane.set_contract(%s, null, %s)", (flow, Jsonb(schema)))
    checks = conn.execute("select flow_slug, check_sql from flowlane.contracts order by flow_slug").fetchall()
    assert checks[0][1] == checks[1][1]  # one compiled check for 2.0 and 2
    conn.execute("select flowlane.start_flow('floats', %s)", (Jsonb({"name": "ab", "tags": ["x"]}),))
    for refused, why in (({"name": "a"}, '/name: "a" is shorter than 2 characters'),
                         ({"name": "abcd"}, '/name: "abcd" is longer than 3 characters'),
                         ({"tags": []}, "/tags: has fewer than 1 items"),
                         ({"tags": [1, 2, 3]}, "/tags: has more than 2 items")):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"input_schema: {why}\n"):
            conn.execute("select flowlane.start_flow('floats', %s)", (Jsonb(refused),))
    assert conn.execute("select count(*) from flowlane.runs").fetchone() == (1,)


@pytest.mark.parametrize("key", ["minLength", "maxLength", "minItems", "maxItems"])
def test_set_contract_refuses_a_count_that_is_not_whole(conn: psycopg.Connection[Any], key: str) -> None:
    conn.execute("select flowlane.create_flow('halves')")
    conn.execute("select flowlane.add_step('halves', 'a')")
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=f"is not a contract: /properties/x/{key}: {key} must be a whole number "
                             r"from 0, got 2\.5\n"):
        conn.execute("select flowlane.set_contract('halves', null, %s)",
                     (Jsonb({"properties": {"x": {key: 2.5}}}),))
    conn.rollback()
    assert conn.execute("select count(*) from flowlane.contracts").fetchone() == (0,)


def test_a_flow_without_contracts_starts_any_input(conn: psycopg.Connection[Any]) -> None:
    _apply(conn, FLOW.replace("input_schema", "description: none\nx_input").split("x_input")[0]
           + "steps:\n  total:\n    handler: shop.orders:total\n")
    conn.execute("select flowlane.start_flow('orders', '[1, 2]')")
    assert _counts(conn) == (1, 1)


# ---- parity: the SQL verdict equals the Python (jsonschema) verdict ----

_NAMES = st.sampled_from(["a", "b", "c/d", "e~f"])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5),
                     st.sampled_from([0.5, -1.5, 2.0, 1e20]),
                     st.sampled_from(["", "a", "ab", "abc", "b1", "é\n"]))
_PATTERNS = st.sampled_from(["^a", "b$", "^[a-z]+$", "[0-9]", "^.{2}$", "x*"])
_TYPES = st.sampled_from(["null", "boolean", "object", "array", "number", "integer", "string"])


def _counts_up_to(most: int) -> st.SearchStrategy[int | float]:
    """A count as JSON Schema allows it: a whole number, also written with a fraction (2.0)."""
    return st.integers(0, most) | st.integers(0, most).map(float)


def _schemas() -> st.SearchStrategy[Any]:
    leaf = st.fixed_dictionaries({}, optional={
        "type": st.one_of(_TYPES, st.lists(_TYPES, min_size=1, max_size=3, unique=True)),
        "enum": st.lists(_SCALARS, min_size=1, max_size=3),
        "const": _SCALARS,
        "minimum": st.integers(-3, 3), "maximum": st.sampled_from([-1, 0, 2.5, 4]),
        "exclusiveMinimum": st.sampled_from([-2, 0, 1.5]), "exclusiveMaximum": st.integers(0, 4),
        "minLength": _counts_up_to(3), "maxLength": _counts_up_to(3), "pattern": _PATTERNS,
        "minItems": _counts_up_to(2), "maxItems": _counts_up_to(3),
    })
    # a `false` subschema only as additionalProperties: elsewhere jsonschema reports its
    # error at the parent's path (the SQL Core names the value itself)
    return st.recursive(leaf | st.just(True), lambda inner: st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["object", "array"]),
        "properties": st.dictionaries(_NAMES, inner, max_size=3),
        "required": st.lists(_NAMES, max_size=2, unique=True),
        "additionalProperties": inner | st.just(False),
        "items": inner,
        "minItems": _counts_up_to(2),
    }), max_leaves=6)


_INSTANCES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(_NAMES, inner, max_size=3), max_leaves=8)
_counter = itertools.count()


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=_schemas(), instances=st.lists(_INSTANCES, min_size=1, max_size=4))
def test_sql_and_python_verdicts_agree(conn: psycopg.Connection[Any], schema: Any,
                                       instances: list[Any]) -> None:
    for instance in instances:
        python = contracts.violations(schema, instance)
        row = conn.execute(
            "select flowlane.contract_violation(%(s)s, %(i)s),"
            " flowlane._contract_fast_accepts(%(s)s, %(i)s)",
            {"s": Jsonb(schema), "i": Jsonb(instance)}).fetchone()
        assert row is not None
        sql, fast = row
        assert (sql is None) == (not python), (schema, instance, sql, python)
        assert fast == (not python), ("the compiled check and the walk disagree", schema,
                                      instance, fast, python)
        if sql is not None:
            assert sql["path"] in {v.path for v in python}, (sql, python)
            assert sql["schema_path"] in {v.schema_path for v in python}, (sql, python)
