"""Inputs that once reached a traceback or a wrong position: numbers no value can hold, UTF-16
surrogate escapes, line-break characters editors do not count, aliases and deep nesting; and
documents generated from the published JSON Schema, loaded by both YAML parsers (libyaml and
pure-Python PyYAML), never raise and always print."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from flowlane.compiler import api, diagnostics, loader, schema
from flowlane.compiler.diagnostics import Diagnostic

COMPOSERS = [loader.LibyamlComposer, loader.PurePythonComposer]
HUGE = "9" * 5000


@pytest.fixture(params=COMPOSERS, ids=["libyaml", "pure-python"])
def composer(request: pytest.FixtureRequest) -> Iterator[type]:
    saved = loader.COMPOSER
    loader.COMPOSER = request.param
    yield request.param
    loader.COMPOSER = saved


def _flow(step: str) -> str:
    return f"kind: flow\nslug: a\nsteps:\n  s:\n    handler: m:f\n{step}"


def _findings(text: str) -> list[Diagnostic]:
    found = api.validate_text(text, "f.yaml")
    for fmt in diagnostics.FORMATTERS:  # every output format can be written
        diagnostics.render(found, fmt).encode("utf-8")
    return found


def _only(text: str) -> Diagnostic:
    found = _findings(text)
    assert len(found) == 1, [d.headline() for d in found]
    return found[0]


def test_loaders_under_test_differ() -> None:
    assert yaml.CSafeLoader in loader.LibyamlComposer.__mro__
    assert yaml.SafeLoader in loader.PurePythonComposer.__mro__
    assert yaml.CSafeLoader not in loader.PurePythonComposer.__mro__


@pytest.mark.usefixtures("composer")
@pytest.mark.parametrize("where", ["    timeout: {n}\n", "    if: {{x: {{y: [{n}]}}}}\n"])
def test_huge_integers_are_located_findings(where: str) -> None:
    text = _flow(where.format(n=HUGE))
    found = _only(text)
    assert (found.line, found.code) == (6, "FL012" if "timeout" in where else "FL071")
    assert "(5000 characters)" in found.message and found.help
    with pytest.raises(Exception) as raised:
        api.project_from_text(text)
    assert type(raised.value).__name__ == "CompileError"


@pytest.mark.usefixtures("composer")
@pytest.mark.parametrize("number", ["1e400", ".inf", "-.Inf", ".nan"])
def test_non_finite_numbers_say_what_they_are(number: str) -> None:
    option = _only(_flow(f"    timeout: {number}\n"))
    assert option.message == f"`timeout` must be an integer, not `{number}`, a number out of range"
    assert option.help == "use a whole number from 3 to 2147483617"
    assert _only(_flow(f"    if: {{x: {number}}}\n")).code == "FL071"


@pytest.mark.usefixtures("composer")
@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\ud83d\\ude00"])
def test_surrogate_escapes_are_syntax_errors(escape: str) -> None:
    for step in (f'    needs: ["{escape}"]\n', f'    if: {{x: "{escape}"}}\n',
                 f'    if: {{"{escape}": 1}}\n'):
        found = _only(_flow(step))
        assert found.code == "FL001" and found.line == 6, found.headline()
        assert "invalid Unicode character escape" in found.message


@pytest.mark.usefixtures("composer")
@pytest.mark.parametrize("char", ["\x85", "\u2028", "\u2029"])
def test_line_breaks_editors_do_not_count(char: str) -> None:
    # in a comment: no syntax error; in a string: text, and later lines keep their numbers
    text = _flow(f"    description: \"a{char}b\" # note{char}more\n    needs: [nope]\n")
    found = _only(text)
    assert (found.code, found.line, found.col) == ("FL030", 7, 13)
    assert found.source_line == "    needs: [nope]"
    project = api.project_from_text(_flow(f"    description: \"a{char}b\"  # x{char}y\n"))
    assert project.flows[0].steps[0].description == f"a{char}b"


@pytest.mark.usefixtures("composer")
def test_words_yaml_reads_as_values_get_a_quoting_hint() -> None:
    found = _findings(_flow("    needs: [true, null]\n"))
    assert [d.help for d in found] == [
        'YAML reads `true` as a boolean; write `"true"` for the text',
        'YAML reads `null` as null; write `"null"` for the text',
    ]


@pytest.mark.usefixtures("composer")
def test_a_duplicate_key_through_an_alias_is_located_at_the_alias() -> None:
    found = _only("kind: flow\n&k slug: a\n*k : b\nsteps: {s: {handler: m:f}}\n")
    assert (found.code, found.line) == ("FL003", 3)
    assert found.message == "duplicate key `slug` through an alias of the key at line 2"


@pytest.mark.usefixtures("composer")
def test_deep_nesting_is_located() -> None:
    depth = 5000
    found = _only(_flow("    if: {x: " + "[" * depth + "]" * depth + "}\n"))
    assert found.code == "FL001" and found.line == 6 and found.col > 1


def test_help_lists_a_bounded_number_of_names() -> None:
    steps = "".join(f"  s{i}:\n    handler: m:f\n    needs: [zz{i}]\n" for i in range(300))
    found = api.validate_text(f"kind: flow\nslug: a\nsteps:\n{steps}", "f.yaml")
    assert len(found) == 300
    assert {d.help for d in found} == {
        "steps of this flow: `s0`, `s1`, `s2`, `s3`, `s4` and 295 more"}


def test_a_close_name_is_still_suggested_among_many() -> None:
    steps = "".join(f"  step_{i}:\n    handler: m:f\n" for i in range(300))
    text = (f"kind: flow\nslug: a\nsteps:\n{steps}  summarize_threads:\n    handler: m:f\n"
            "  last:\n    handler: m:f\n    needs: [sumarize_threads]\n")
    assert [d.help for d in api.validate_text(text, "f.yaml")] == [
        "did you mean `summarize_threads`?"]


# it rewrites what it is given; deferred: building it takes seconds, which collecting
# the module (every run, the fast loop's too) would pay
_DOCUMENTS = st.deferred(lambda: from_schema(copy.deepcopy(schema.published())))


@pytest.mark.slow  # generating documents from the whole schema takes a minute
@pytest.mark.parametrize("composer", COMPOSERS, ids=["libyaml", "pure-python"], indirect=True)
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(document=_DOCUMENTS, style=st.sampled_from(["block", "flow", "json"]))
def test_documents_from_the_schema_never_raise(composer: type, document: object,
                                               style: str) -> None:
    if style == "json":
        text = json.dumps(document, ensure_ascii=False)
    else:
        text = yaml.safe_dump(document, allow_unicode=True, default_flow_style=style == "flow")
    found = _findings(text)
    if not found:
        api.compile_project(api.project_from_text(text))
