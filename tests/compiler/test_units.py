"""Unit tests: loader positions and scalars, names, SQL literals, schema, shape, order."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowlane import errors
from flowlane.compiler import api, loader, names, schema, shape, sqltext, toposort
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.model import Alias
from flowlane.compiler.names import next_version_slug, suggest_version
from tests.compiler.strategies import STORABLE_CHARACTERS


def test_positions_of_values_and_keys() -> None:
    docs, found = loader.load_text("kind: flow\nsteps:\n  a:\n    needs: [x, y]\n", "f.yaml")
    assert not found
    doc = docs[0]
    assert doc.at(("steps", "a", "needs", 1)) == loader.Position(4, 16)
    assert doc.key_at(("steps", "a")) == loader.Position(3, 3)
    assert doc.at(("steps", "a", "missing")) == loader.Position(4, 5)
    assert doc.line_col(("steps", "a", "needs", 1)) == (4, 16)
    assert doc.line_col(("steps", "a"), key=True) == (3, 3)
    assert doc.line_col(("steps", "a", "missing"), key=True) == (4, 5)  # the nearest value


def test_plain_scalars_resolve_conservatively() -> None:
    cases = {"yes": "yes", "on": "on", "~": None, "": None, "true": True, "False": False,
             "12": 12, "-3": -3, "007": "007", "1.5": 1.5, "1e3": 1000.0,
             "1e999": loader.OutOfRange("1e999"), ".inf": loader.OutOfRange(".inf"),
             "9" * 4301: loader.OutOfRange("9" * 4301), "9" * 4300: int("9" * 4300),
             "0x10": "0x10", "2024-01-01": "2024-01-01", "1_000": "1_000", "NULL": None,
             "+1": 1, ".5": 0.5, "-.inf": loader.OutOfRange("-.inf"),
             ".nan": loader.OutOfRange(".nan"), "nan": "nan", "inf": "inf", "-": "-"}
    for text, expected in cases.items():
        assert loader.resolve_plain(text) == expected, text
        assert type(loader.resolve_plain(text)) is type(expected)


def test_crlf_and_bom_files(tmp_path: Path) -> None:
    file = tmp_path / "f.yaml"
    file.write_bytes(b"\xef\xbb\xbfkind: flow\r\nslug: a\r\n")
    docs, found = loader.load_file(file, "f.yaml")
    assert not found and docs[0].data == {"kind": "flow", "slug": "a"}


def test_discover_skips_hidden_and_non_yaml(tmp_path: Path) -> None:
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x.yaml").write_text("kind: flow\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text("a: 1\n")
    (tmp_path / "a.yaml").write_text("a: 1\n")
    (tmp_path / "notes.txt").write_text("x")
    files, found = loader.discover([tmp_path])
    assert [f.name for f in files] == ["a.yaml", "b.yml"] and not found
    _files, found = loader.discover([tmp_path / "missing"])
    assert found[0].code == "FL008"


def test_names() -> None:
    assert names.slug_problem("fetch") is None
    assert names.slug_problem("Run") is not None
    assert names.slug_problem("a" * 129) is not None
    assert names.queue_problem("classify_threads") is None
    problem = names.queue_problem("Classify Threads!")
    assert problem is not None and "`classify_threads`" in problem.help
    assert names.canonical_queue("9lives") == "q_9lives"


@settings(max_examples=200, deadline=None)
@given(st.text(STORABLE_CHARACTERS))
def test_quote_round_trips(value: str) -> None:
    quoted = sqltext.quote(value)
    assert sqltext.unquote(quoted) == value
    assert quoted.startswith(("'", "E'"))


def test_literals() -> None:
    assert sqltext.literal(None) == "null" and sqltext.literal(True) == "true"
    assert sqltext.literal(7) == "7" and sqltext.literal("a'b") == "'a''b'"
    assert sqltext.literal("a\\b") == "E'a\\\\b'"
    assert sqltext.text_array([]) == "array[]::text[]"
    assert sqltext.text_array(["a", "b'"]) == "array['a', 'b''']::text[]"
    assert sqltext.jsonb({"b": 1, "a": "x"}) == "'{\"a\":\"x\",\"b\":1}'::jsonb"
    assert sqltext.comment("a\nb") == "a?b"


def test_shipped_schema_is_a_valid_draft_2020_12_schema() -> None:
    loaded = json.loads(schema.schema_text())
    jsonschema.Draft202012Validator.check_schema(loaded)
    for name, definition in loaded["$defs"].items():
        if name not in ("mode",):
            assert "description" in definition, name
    for name in ("flow", "alias", "worker"):
        for example in loaded["$defs"][name]["x-flowlane-examples"]:
            assert not list(jsonschema.Draft202012Validator(loaded).iter_errors(example))


def test_stable_order_takes_the_earliest_declared_ready_step() -> None:
    declared = ["d", "c", "b", "a"]
    needs = {"d": ["a"], "c": [], "b": ["c"], "a": []}
    assert toposort.stable_order(declared, needs) == ["c", "b", "a", "d"]


def _cycles(declared: list[str], needs: dict[str, list[str]], limit: int = 20) -> list[list[str]]:
    placed = set(toposort.stable_order(declared, needs))
    return toposort.find_cycles(declared, needs, placed, limit)


def test_every_cycle_is_found_once_from_its_first_declared_step() -> None:
    needs = {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"], "d": ["d"], "e": ["c"]}
    assert _cycles(["a", "b", "c", "d", "e"], needs) == [
        ["a", "b", "a"], ["a", "b", "c", "a"], ["a", "c", "a"], ["a", "c", "b", "a"],
        ["b", "c", "b"], ["d", "d"],
    ]


def test_cycles_stop_at_the_limit_and_a_long_cycle_is_found_whole() -> None:
    every = [f"s{i}" for i in range(12)]  # each needs every other: millions of cycles
    assert len(_cycles(every, {s: [t for t in every if t != s] for s in every}, limit=7)) == 7
    ring = [f"s{i}" for i in range(3000)]
    found = _cycles(ring, {s: [ring[i - 1]] for i, s in enumerate(ring)})
    assert found == [[*ring, "s0"]]


def test_shape_differences_are_readable() -> None:
    old = {"queue_mode": "flow", "steps": [{"slug": "a", "type": "single"}]}
    new = {"queue_mode": "per-step", "steps": [{"slug": "a", "type": "map"}, {"slug": "b"}]}
    assert shape.differences(old, new) == [
        "queue_mode: flow in the database, per-step in the given shape",
        "step count: 1 in the database, 2 in the given shape",
        "step 0 (a): type is single in the database, map in the given shape",
        "step 1 (b): only in the given shape",
    ]


def _steps(*slugs: str, **needs: list[str]) -> dict[str, Any]:
    return {"queue_mode": "flow",
            "steps": [{"slug": s, "type": "single", "needs": needs.get(s, [])} for s in slugs]}


def test_described_differences_name_added_removed_and_moved_steps_by_slug() -> None:
    old = _steps("a", "b", "c", "d", "e")
    new = {**_steps("a", "x", "c", "d", "b", b=["x"]), "queue_mode": "per-step"}
    assert shape.described(old, new, "the base", "the YAML") == [
        "queue_mode: flow in the base, per-step in the YAML",
        "step `x` added in the YAML (position 1)",
        "step `e` removed: in the base (position 4), not in the YAML",
        "step `b` moved: position 1 in the base, 4 in the YAML",
        'step `b`: needs is [] in the base, ["x"] in the YAML',
    ]


def test_described_differences_of_the_same_steps_are_the_positional_ones() -> None:
    old, new = _steps("a", "b"), _steps("a", "b", b=["a"])
    assert shape.same_steps(old, new)
    assert shape.described(old, new) == shape.differences(old, new) == [
        'step 1 (b): needs is [] in the database, ["a"] in the given shape']


def test_alias_advice_moves_the_alias_whose_active_version_changes() -> None:
    orders = Alias("orders", "orders_v2", ("orders_v1",))
    assert names.alias_advice("orders_v2", "orders_v3", [orders]) == (
        "move alias `orders` to it (`active: orders_v3`, `draining: [orders_v2, orders_v1]`)")
    assert "an alias `orders_v2` with `active: orders_v3`" in names.alias_advice(
        "orders_v2", "orders_v3", [Alias("other", "other_v1")])


def test_next_version_slug() -> None:
    assert next_version_slug("foo") == "foo_v2"
    assert next_version_slug("foo_v2") == "foo_v3"
    assert next_version_slug("foo_v2", ["foo_v3"]) == "foo_v4"


def test_version_suggestions_stay_valid_names() -> None:
    # a 47-character slug on default routing used to get a 50-character suggestion,
    # which FL044 then refused (its queue name would be too long)
    long47 = "a" * 44 + "_bc"
    assert next_version_slug(long47, max_length=47) == "a" * 44 + "_v2"
    assert next_version_slug("a" * 125 + "_v9", max_length=128) == "a" * 124 + "_v10"
    assert next_version_slug("ab_" + "c" * 44, max_length=47) == "ab_" + "c" * 41 + "_v2"
    assert next_version_slug("a" * 43 + "_x", max_length=47) == "a" * 43 + "_v2"  # no "__"
    for slug in ("a" * 47, "a" * 45 + "_b", "x" * 128):
        for limit in (47, 128):
            suggestion = next_version_slug(slug, max_length=limit)
            assert len(suggestion) <= limit and names.slug_problem(suggestion) is None
    text = ("kind: flow\nslug: %s\nqueues: %s\nsteps:\n  a:\n    handler: m:f\n")
    flow = api.project_from_text(text % ("q" * 47, "flow")).flows[0]
    assert suggest_version(flow) == "q" * 44 + "_v2"
    flow = api.project_from_text(text % ("q" * 47, "{a: shared}")).flows[0]
    assert suggest_version(flow) == "q" * 47 + "_v2"


def test_every_code_is_documented() -> None:
    from flowlane.compiler import codes
    from tests.docs_support import table

    text = (Path(__file__).resolve().parents[2] / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    documented = {row["code"]: row["meaning"] for row in table(text, "code")}
    for code, meaning in codes.CODES.items():
        assert documented.get(code) == meaning, code


def test_code_reports_a_code_by_its_name_in_codes_py() -> None:
    """A code is written once, in codes.py, with its meaning; code that reports it names it."""
    import flowlane

    package = Path(flowlane.__file__).parent
    literal = re.compile(r"[\"']FL\d{3}[\"']")
    written = [f"{path.relative_to(package)}:{number}"
               for path in sorted(package.rglob("*.py")) if path != package / "compiler" / "codes.py"
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if literal.search(line)]
    assert written == []


def test_templates_refuse_values_that_skipped_the_quoting_filters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # every {{ expression }} must be a SQL literal: from a filter, or quoted beforehand in
    # Python (a flow's steps reach the template as compiled.QuotedStep rows)
    from flowlane.compiler import compiled

    env = compiled.environment()
    with pytest.raises(TypeError, match="was not passed through a SQL filter"):
        env.from_string("select {{ value }}").render(value="'; drop table x; --")
    assert env.from_string("select {{ value | lit }}").render(value="'; x") == "select '''; x'"
    text = ("kind: flow\nslug: f\nsteps:\n  a:\n    handler: m:f\n"
            "  b:\n    handler: m:g\n    needs: [a]\n    if: {a: {x: \"'; drop\"}}\n")
    flow = api.project_from_text(text).flows[0]
    row = compiled.quoted_step(flow.step("b"))
    assert all(isinstance(value, sqltext.Sql) for value in row if value is not None)
    assert row.required_input_pattern == "'{\"a\":{\"x\":\"''; drop\"}}'::jsonb"
    unquoted = row._replace(when_unmet="skip'); drop table x; --")
    monkeypatch.setattr(compiled, "quoted_step", lambda step: unquoted)
    with pytest.raises(TypeError, match="was not passed through a SQL filter"):
        compiled.render_flow(flow)


def test_step_calls_are_the_template_rendered_for_each_step() -> None:
    # compiled.StepCalls fills a pattern made from the template once per set of arguments
    # present: the same text as rendering the template per step, whatever the values hold
    from flowlane.compiler import compiled

    text = ("kind: flow\nslug: f\nsteps:\n  a:\n    handler: m:f\n"
            "  b:\n    flow: other\n    needs: [a]\n"
            "  c:\n    handler: m:g\n    needs: [b]\n    if: {b: {x: \"100% %s {0} %(a)s\"}}\n"
            "---\nkind: flow\nslug: other\nsteps:\n  a:\n    handler: m:f\n")
    flow = api.project_from_text(text).flow("f")
    steps = [compiled.quoted_step(step) for step in flow.steps]
    assert [step.child_flow is None for step in steps] == [True, False, True]
    slug = sqltext.literal(flow.slug)
    env = compiled.environment()
    odd = env.from_string("-- 100% {x} {{ step.queue_name }}%s\n({{ flow_slug }}, {{ step.slug }}, "
                          "{{ step.required_input_pattern }}, {{ step.slug }}{% if step.child_flow "
                          "is not none %}, child => {{ step.child_flow }}{% endif %})\n")
    for template in (env.get_template("add_step.sql.j2"), odd):
        expected = "".join(template.render(flow_slug=slug, step=step) for step in steps)
        assert compiled.StepCalls(template).render(slug, steps) == expected
    assert "'{\"b\":{\"x\":\"100% %s {0} %(a)s\"}}'::jsonb" in compiled.render_flow(flow)


def test_timeout_bound_matches_the_sql_core() -> None:
    # the SQL Core (0004) refuses a timeout whose stall threshold (timeout + 30 s) overflows
    text = "kind: flow\nslug: f\ndefaults: {timeout: %d}\nsteps:\n  a:\n    handler: m:f\n"
    assert api.project_from_text(text % 2147483617).flows[0].timeout == 2147483617
    with pytest.raises(errors.CompileError) as raised:
        api.project_from_text(text % 2147483618)
    (finding,) = raised.value.diagnostics
    assert finding.code == "FL013" and "at most 2147483617" in finding.message


def test_diagnostic_text_never_carries_control_characters() -> None:
    # a value like handler: "\e]0;owned\a" is quoted in messages: terminals and CI logs
    # must not receive its escape sequence; each control character stays one symbol wide
    found = Diagnostic("f\x1b.yaml", 1, 4, "FL070", "handler `\x1b]0;x\x07` is bad", "fix\x9b",
                       "ab\x1bc\td")
    text = found.to_text()
    assert not any((ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) < 0xA0 for ch in text)
    assert "\u241b]0;x\u2407" in found.headline()
    source, caret = text.splitlines()[2:4]
    assert source.index("c") == caret.index("^")


def test_graphs_draw_wait_and_child_flow_steps_outside_the_queues() -> None:
    from flowlane.compiler import diagram, load_project

    golden = Path(__file__).parent / "golden" / "valid"
    project = load_project([golden / "wait_steps.yaml", golden / "child_flows.yaml"])
    waits = diagram.render(project.flow("approvals"))
    assert 'subgraph q1["no queue: signals and child flows"]' in waits
    assert 's_approve(["approve (wait)"])' in waits and 's_paid(["paid (wait)"])' in waits
    assert 'subgraph q0["queue: approvals__prepare"]' in waits
    orders = diagram.render(project.flow("orders"), "dot")
    assert '"each" [label="each (map, flow: pack_line)", shape=component' in orders
    assert 's_invoice[/"invoice (flow: invoicing)"/]' in diagram.render(project.flow("orders"))
    assert 'label="no queue: signals and child flows";' in orders
