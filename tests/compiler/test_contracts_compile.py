"""Contracts in the compiler: `$ref` files (located findings inside them), annotations out of
the shape, and compiling with contracts stays deterministic and byte-stable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowlane.compiler import api, compiled, contracts, diagnostics, shape

FLOW = """kind: flow
slug: orders
input_schema: {$ref: ../schemas/order.yaml}
steps:
  a:
    handler: m.h:a
    output_schema: {$ref: ../schemas/total.json}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "schemas").mkdir()
    (tmp_path / "flows" / "orders.yaml").write_text(FLOW)
    (tmp_path / "schemas" / "total.json").write_text(json.dumps({"type": "object", "required": ["total"]}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_referenced_file_is_compiled_in(project: Path) -> None:
    (project / "schemas" / "order.yaml").write_text(
        "title: An order\ntype: object\nproperties:\n  id: {type: string, description: the id}\n")
    flow = api.load_project(["flows"]).flows[0]
    assert flow.input_schema == {"type": "object", "properties": {"id": {"type": "string"}}}
    assert flow.steps[0].output_schema == {"type": "object", "required": ["total"]}
    text = compiled.render_flow(flow)
    assert "step_slug => null,\n  schema => '{\"properties\":{\"id\":{\"type\":\"string\"}}," in text


def test_a_problem_in_a_referenced_file_is_reported_where_it_is(project: Path) -> None:
    (project / "schemas" / "order.yaml").write_text(
        "type: object\nproperties:\n  id:\n    type: string\n    format: uuid\n")
    found = api.validate(["flows"])
    assert diagnostics.format_text(found).startswith(
        "schemas/order.yaml:5:5: error[FL100]: schema keyword `format` is outside the supported subset\n"
        "  |\n5 |     format: uuid\n  |     ^\n")


def test_annotations_are_not_part_of_the_shape() -> None:
    plain = api.project_from_text(FLOW_INLINE.format(annotations="")).flows[0]
    noted = api.project_from_text(FLOW_INLINE.format(
        annotations="title: T\n    description: D\n    examples: [{id: x}]\n    $comment: c\n    ")).flows[0]
    assert shape.flow_shape(plain) == shape.flow_shape(noted)
    # annotations leave no trace in the SQL: the same bytes
    assert compiled.render_flow(plain) == compiled.render_flow(noted)


FLOW_INLINE = """kind: flow
slug: noted
input_schema:
    {annotations}type: object
    properties: {{title: {{type: string}}}}
steps:
  a: {{handler: m.h:a}}
"""

_KEYWORD_VALUES: dict[str, Any] = {
    "type": st.sampled_from(["string", "integer", "object", "array"]),
    "minimum": st.integers(-5, 5), "maxLength": st.integers(0, 9),
    "enum": st.lists(st.sampled_from(["a", "b", 1, True, None]), min_size=1, max_size=3),
    "required": st.lists(st.sampled_from(["x", "y"]), max_size=2, unique=True),
    "title": st.text(alphabet="abcé 𐀀", max_size=5),
}


@settings(max_examples=30, deadline=None)
@given(st.fixed_dictionaries({}, optional=_KEYWORD_VALUES))
def test_compiling_with_contracts_is_deterministic(schema: dict[str, Any]) -> None:
    written = json.dumps(schema, ensure_ascii=False)
    text = (f"kind: flow\nslug: prop\ninput_schema: {written}\n"
            f"steps:\n  a:\n    handler: m.h:a\n    output_schema: {written}\n")
    first = compiled.render_flow(api.project_from_text(text).flows[0])
    again = compiled.render_flow(api.project_from_text(text).flows[0])
    assert first == again
    without_titles = contracts.shape_form(schema)
    assert "title" not in without_titles
    assert json.dumps(without_titles, sort_keys=True, separators=(",", ":")) in first


COUNTED = """kind: flow
slug: counted
input_schema:
  type: object
  properties:
    name: {{type: string, minLength: {count}, maxLength: 9}}
    tags: {{type: array, minItems: {count}, maxItems: 9.0}}
steps:
  a: {{handler: m.h:a}}
"""


def test_a_count_written_as_a_whole_float_is_that_count() -> None:
    written = api.project_from_text(COUNTED.format(count="2.0")).flows[0]
    whole = api.project_from_text(COUNTED.format(count="2")).flows[0]
    properties = written.input_schema["properties"]  # type: ignore[index]
    assert properties["name"] == {"type": "string", "minLength": 2, "maxLength": 9}
    assert properties["tags"] == {"type": "array", "minItems": 2, "maxItems": 9}
    assert type(properties["tags"]["maxItems"]) is int
    # the same shape and the same SQL as the integers: 2.0 and 2 are one contract
    assert shape.flow_shape(written) == shape.flow_shape(whole)
    assert compiled.render_flow(written) == compiled.render_flow(whole)
    # the Python verdict reads and names it as 2 too
    assert [str(v) for v in contracts.violations({"type": "string", "minLength": 2.0}, "f")] == [
        '/: "f" is shorter than 2 characters']


@pytest.mark.parametrize("count", ["2.5", "-1.0", "1e10", "true", '"2"'])
def test_a_count_that_is_no_whole_number_from_0_is_fl101(count: str) -> None:
    shown = json.dumps(json.loads(count))
    found = api.validate_text(COUNTED.format(count=count))
    assert [(d.code, d.line, d.message) for d in found] == [
        ("FL101", 6, f"`minLength` must be a whole number from 0, got {shown}"),
        ("FL101", 7, f"`minItems` must be a whole number from 0, got {shown}")]


@pytest.mark.parametrize(("schema", "at", "what"), [
    ('{type: string, const: "a\\0b"}', '"a', "`const` holds a NUL character"),
    ('{enum: [x, {k: "a\\0b"}]}', "{k", "`enum` holds a NUL character"),
    ('{const: {"k\\0": 1}}', '{"k', "`const` holds a NUL character"),
    ('{type: string, pattern: "a\\0"}', '"a', "`pattern` holds a NUL character"),
    ('{properties: {"a\\0": {}}}', '"a', 'property name "a\\u0000" holds a NUL character'),
    ("{enum: [1, 1e400]}", "1e400", "`enum` holds the number `1e400`"),
])
def test_a_value_jsonb_cannot_hold_is_fl106(schema: str, at: str, what: str) -> None:
    line = f"input_schema: {schema}"
    [found] = api.validate_text(f"kind: flow\nslug: nul\n{line}\nsteps:\n  a: {{handler: m.h:a}}\n")
    assert (found.code, found.line, found.col) == ("FL106", 3, line.index(at) + 1)
    assert found.message.startswith(what) and found.message.endswith(": the contract cannot be stored")
