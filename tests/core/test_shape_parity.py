"""The flow shape exists in Python (the compiler writes it into every compiled file; ``check
--base`` compares offline) and in SQL (``get_flow_shape``; ``_shape_differences`` behind
``ensure_flow_shape``, ``verify_flow`` and ``plan``). These tests prove the copies agree:
the shape of generated flows, and the exact text of the differences of random pairs."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from flowlane.compiler import api, compiled, shape
from tests.compiler.strategies import STORABLE_CHARACTERS, flow_documents, to_yaml

pytestmark = pytest.mark.slow

DB_EXAMPLES = settings(max_examples=25, deadline=None,
                       suppress_health_check=[HealthCheck.function_scoped_fixture,
                                              HealthCheck.too_slow])
_counter = itertools.count()


@DB_EXAMPLES
@given(flow_documents())
def test_python_shape_equals_get_flow_shape(conn: psycopg.Connection[Any],
                                            document: dict[str, Any]) -> None:
    document["slug"] = f"parity_{next(_counter)}_{document['slug']}"
    flow = api.project_from_text(to_yaml(document)).flows[0]
    with conn.transaction():
        conn.execute(compiled.statements(compiled.render_flow(flow)))
    python = shape.flow_shape(flow)
    row = conn.execute("select flowlane.get_flow_shape(%s) = %s::jsonb, "
                       "flowlane.get_flow_shape(%s)",
                       (flow.slug, Jsonb(python), flow.slug)).fetchone()
    assert row is not None and row[0] is True, (row, python)
    assert shape.same_json(row[1], python)
    assert sorted(row[1]) == sorted(python) == ["queue_mode", "steps"]
    assert [sorted(s) for s in row[1]["steps"]] == [sorted(s) for s in python["steps"]]


# values in small pools, so that two random shapes often share some and differ in others
TEXT = st.text(STORABLE_CHARACTERS, max_size=6)
NUMBER = st.one_of(st.integers(-(2**70), 2**70),
                   st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from([0, 1, 1.0, -0.0, 1e16, 1.5e-7, 5e-324, 1e300, 2.5]))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)
UNKNOWN_KEY = st.from_regex(r"[a-z]{1,6}", fullmatch=True)  # collation-neutral key order
STEP_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "slug": st.sampled_from(["a", "b", "Fetch", "caf\u00e9"]),
    "type": st.sampled_from(["single", "map"]),
    "needs": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
    "if": st.one_of(st.none(), st.just({"x": 1}), JSON),
    "unless": st.one_of(st.none(), st.just({"x": 1.0}), JSON),
    "when_unmet": st.sampled_from(["skip", "skip-cascade", "fail"]),
    "when_exhausted": st.sampled_from(["skip", "fail"]),
    "queue": st.sampled_from(["q", "q2", "f__a"]),
}


@st.composite
def steps(draw: st.DrawFn, extra_keys: bool) -> dict[str, Any]:
    step = {key: draw(values) for key, values in STEP_VALUES.items()
            if draw(st.integers(0, 9)) > 0}  # now and then a key is missing
    if extra_keys:
        step.update(draw(st.dictionaries(UNKNOWN_KEY.filter(lambda k: k not in STEP_VALUES),
                                         JSON, max_size=2)))
    return step


@st.composite
def shapes(draw: st.DrawFn, given_shape: bool) -> dict[str, Any]:
    found: dict[str, Any] = {"steps": draw(st.lists(steps(given_shape), max_size=4))}
    if draw(st.integers(0, 9)) > 0:
        found["queue_mode"] = draw(st.one_of(st.sampled_from(["flow", "per-step", "explicit"]),
                                             JSON))
    if given_shape:
        found.update(draw(st.dictionaries(
            UNKNOWN_KEY.filter(lambda k: k not in ("steps", "queue_mode")), JSON, max_size=2)))
    return found


@st.composite
def nearby(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with a few steps and keys redrawn, dropped or added."""
    changed = {key: value for key, value in base.items() if draw(st.integers(0, 4)) > 0}
    old_steps = list(base.get("steps", []))
    new_steps = [dict(s, **draw(st.dictionaries(st.sampled_from(list(STEP_VALUES)),
                                                 st.sampled_from([None, "map", ["a"], 1]),
                                                 max_size=1)))
                 for s in old_steps if draw(st.integers(0, 5)) > 0]
    new_steps += draw(st.lists(steps(True), max_size=1))
    changed["steps"] = new_steps
    return changed


@st.composite
def pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    old = draw(shapes(False))
    new = draw(st.one_of(shapes(True), nearby(old), st.just(old)))
    return old, new


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pairs())
def test_python_differences_equal_shape_differences_text(
    conn: psycopg.Connection[Any], pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    old, new = pair
    row = conn.execute("select flowlane._shape_differences(%s, %s)",
                       (Jsonb(old), Jsonb(new))).fetchone()
    assert row is not None
    assert shape.differences(old, new) == row[0]


def test_the_words_of_a_grown_flow(conn: psycopg.Connection[Any]) -> None:
    old = {"queue_mode": "flow", "steps": [{"slug": "a", "type": "single",
                                            "if": {"kind": 1e16, "a": [1.5e-7, -0.0]}}]}
    new = {"queue_mode": "flow", "steps": [{"slug": "a", "type": "single", "if": None},
                                           {"slug": "b"}]}
    expected = [
        "step count: 1 in the database, 2 in the given shape",
        ('step 0 (a): if is {"a": [0.00000015, 0.0], "kind": 10000000000000000} in the '
         "database, null in the given shape"),
        "step 1 (b): only in the given shape",
    ]
    assert shape.differences(old, new) == expected
    row = conn.execute("select flowlane._shape_differences(%s, %s)",
                       (Jsonb(old), Jsonb(new))).fetchone()
    assert row is not None and row[0] == expected
