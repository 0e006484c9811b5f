"""Property tests: robustness on arbitrary input, determinism, complete routes, immutable shapes."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowlane import errors
from flowlane.compiler import api, check, loader, names, shape
from flowlane.compiler.diagnostics import Diagnostic
from tests.compiler.strategies import JSON_VALUE, SLUG, flow_documents, to_yaml

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
YAML_PIECES = st.sampled_from([
    "kind: flow\n", "kind: alias\n", "kind: worker\n", "slug: a\n", "steps:\n", "  s:\n",
    "    handler: m:f\n", "    needs: [s]\n", "---\n", "- x\n", "&a ", "*a", "<<: *a\n", "\t",
    "? [k]\n: v\n", "!!str ", "{", "}", "[", "]", ": ", "'", '"', "#", "\n", "queues: per-step\n",
    "active: a\n", "flows: [a]\n", "queue: q\n", "    type: map\n", "    if: {a: 1}\n",
])


def _only_flowlane_errors(text: str) -> None:
    found = api.validate_text(text, "fuzz.yaml")
    assert all(isinstance(d, Diagnostic) for d in found)
    try:
        api.project_from_text(text, "fuzz.yaml")
    except errors.CompileError as exc:
        assert exc.diagnostics == tuple(found)
    else:
        assert found == []


@FAST
@given(st.text(max_size=300))
def test_arbitrary_text_gives_diagnostics_never_exceptions(text: str) -> None:
    _only_flowlane_errors(text)


@FAST
@given(st.lists(YAML_PIECES | st.text(max_size=5), max_size=30).map("".join))
def test_yaml_like_text_gives_diagnostics_never_exceptions(text: str) -> None:
    _only_flowlane_errors(text)


NESTED = st.recursive(
    JSON_VALUE,
    lambda inner: st.dictionaries(
        st.sampled_from(["kind", "slug", "steps", "needs", "handler", "queues", "type", "if",
                         "active", "draining", "flows", "queue", "defaults", "timeout", "a"]),
        inner, max_size=5),
    max_leaves=20,
)


@FAST
@given(NESTED, st.sampled_from(["flow", "alias", "worker", "other"]))
def test_arbitrary_nested_data_gives_diagnostics_never_exceptions(data: Any, kind: str) -> None:
    if isinstance(data, dict):
        data = {"kind": kind, **data}
    _only_flowlane_errors(to_yaml(data))
    _only_flowlane_errors(yaml.safe_dump(data, allow_unicode=True))


def _stream(documents: list[dict[str, Any]]) -> str:
    return "\n---\n".join(to_yaml(d) for d in documents)


@st.composite
def project_documents(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 3))
    slugs = draw(st.lists(SLUG, min_size=count, max_size=count, unique_by=str.lower))
    return [draw(flow_documents(slug=f"f{s}")) for s in slugs]


@pytest.mark.slow  # seconds of generated documents: the whole suite's, not the fast loop's
@FAST
@given(st.data())
def test_compile_is_deterministic_and_independent_of_document_order(data: st.DataObject) -> None:
    documents = data.draw(project_documents())
    first = api.compile_project(api.project_from_text(_stream(documents), "p.yaml"))
    again = api.compile_project(api.project_from_text(_stream(documents), "p.yaml"))
    shuffled = documents[:]
    random.Random(data.draw(st.integers())).shuffle(shuffled)
    other = api.compile_project(api.project_from_text(_stream(shuffled), "p.yaml"))
    assert first == again == other


_ADD_STEP = re.compile(r"select flowlane\.add_step\(\n(.*?)\n\);", re.DOTALL)


def _add_steps(sql: str) -> list[dict[str, str]]:
    calls = []
    for body in _ADD_STEP.findall(sql):
        args = dict(line.strip().rstrip(",").split(" => ", 1) for line in body.split("\n"))
        calls.append(args)
    return calls


@FAST
@given(flow_documents())
def test_routes_are_complete_and_canonical(document: dict[str, Any]) -> None:
    project = api.project_from_text(to_yaml(document), "f.yaml")
    flow = project.flows[0]
    sql = api.compile_project(project)[f"flows/{flow.slug}.sql"]
    calls = _add_steps(sql)
    assert sorted(c["step_slug"].strip("'") for c in calls) == sorted(document["steps"])
    queues = {c["queue_name"].strip("'") for c in calls}
    assert all(names.queue_problem(q) is None or "__" in q for q in queues)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", q) and len(q) <= 47 for q in queues)
    routing = document.get("queues", "flow")
    if routing == "flow":
        expected = {flow.slug.lower()}
    elif routing == "per-step":
        expected = {s.queue for s in flow.steps}
        assert all(q.startswith(flow.slug.lower() + "__") for q in expected)
    else:
        expected = set(routing.values())
    assert queues == expected == set(flow.queues)


def _mutations(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Structural changes, each of which must change the shape."""
    steps = list(document["steps"])
    changed: list[dict[str, Any]] = []
    extra = json.loads(json.dumps(document))
    extra["steps"]["zz_added"] = {"handler": "pkg.mod:added"}
    if "queues" in extra and isinstance(extra["queues"], dict):
        extra["queues"]["zz_added"] = "qadded"
    changed.append(extra)
    typed = json.loads(json.dumps(document))
    first = typed["steps"][steps[0]]
    if len(first.get("needs", [])) <= 1:
        first["type"] = "single" if first.get("type") == "map" else "map"
        changed.append(typed)
    rerouted = json.loads(json.dumps(document))
    rerouted["queues"] = {s: "qother" for s in steps} if document.get("queues") != {
        s: "qother" for s in steps} else "per-step"
    changed.append(rerouted)
    conditioned = json.loads(json.dumps(document))
    last = conditioned["steps"][steps[-1]]
    # a condition keyed by a need (the input of a root step): FL035 refuses other keys
    key = last["needs"][0] if last.get("needs") else "changed"
    last["unless"] = {key: {"changed": True}}
    if document["steps"][steps[-1]].get("unless") != last["unless"]:
        changed.append(conditioned)
    return changed


@FAST
@given(flow_documents())
def test_structural_change_requires_a_new_version_option_change_does_not(
    document: dict[str, Any],
) -> None:
    project = api.project_from_text(to_yaml(document), "f.yaml")
    committed = api.compile_project(project)[f"flows/{project.flows[0].slug}.sql"]
    assert check.committed_shape(committed) == shape.flow_shape(project.flows[0])
    for mutated in _mutations(document):
        flow = api.project_from_text(to_yaml(mutated), "f.yaml").flows[0]
        change = check._compare(flow, committed, [flow.slug], ())
        assert change is not None and change.differences
        assert change.suggestion != flow.slug
    tuned = json.loads(json.dumps(document))
    tuned["defaults"] = {"max_attempts": 9, "timeout": 99}
    for spec in tuned["steps"].values():
        spec["base_delay"] = 1
        spec["description"] = "changed"
        spec["handler"] = "other.module:fn"
    flow = api.project_from_text(to_yaml(tuned), "f.yaml").flows[0]
    assert check._compare(flow, committed, [flow.slug], ()) is None


@pytest.mark.slow  # seconds of generated documents: the whole suite's, not the fast loop's
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(flow_documents(), NESTED), st.sampled_from(["flow", "alias", "worker"]))
def test_fast_schema_check_never_accepts_what_jsonschema_rejects(data: Any, kind: str) -> None:
    from flowlane.compiler import fastcheck, schema

    if isinstance(data, dict) and "kind" not in data:
        data = {"kind": kind, **data}
    for name in ("flow", "alias", "worker"):
        validator = schema._validator(name)
        if fastcheck.compile_schema(validator.schema)(data):
            assert validator.is_valid(data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(project_documents(), st.randoms(use_true_random=False))
def test_compile_is_independent_of_the_order_files_are_given_in(
    documents: list[dict[str, Any]], rnd: random.Random,
) -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for index, document in enumerate(documents):
            file = Path(tmp) / f"{rnd.choice('abc')}{index}.yaml"
            file.write_text(to_yaml(document), encoding="utf-8")
            files.append(file)
        first = api.compile_project(api.load_project(files))
        rnd.shuffle(files)
        shuffled = api.compile_project(api.load_project(files))
        whole = api.compile_project(api.load_project([tmp]))
    assert first == shuffled == whole


def _tags(node: Any) -> list[str]:
    children = node.value if isinstance(node.value, list) else []
    flat = [c for child in children for c in (child if isinstance(child, tuple) else (child,))]
    return [node.tag, *(tag for child in flat for tag in _tags(child))]


class _StockResolving(loader.LibyamlComposer):  # type: ignore[misc]
    resolve = yaml.resolver.BaseResolver.resolve


@FAST
@given(st.lists(YAML_PIECES | st.text(max_size=5), max_size=30).map("".join))
def test_the_composer_tags_nodes_as_pyyaml_resolves_them(text: str) -> None:
    """The composers' shortcut resolver gives every node the tag PyYAML's own would."""
    try:
        ours = [_tags(root) for root in yaml.compose_all(text, Loader=loader.COMPOSER)]
    except yaml.YAMLError:
        return
    assert ours == [_tags(root) for root in yaml.compose_all(text, Loader=_StockResolving)]


@FAST
@given(st.lists(YAML_PIECES | st.text(max_size=5), max_size=30).map("".join))
def test_building_without_alias_tracking_changes_nothing_without_aliases(text: str) -> None:
    """A text without ``*`` has no alias, so the builder's untracked walk gives what the
    tracked one gives: the same data, positions and findings."""
    text = text.replace("*", "")
    source = loader.Source("f.yaml", loader.source_lines(text))
    try:
        roots = list(yaml.compose_all(text, Loader=loader.COMPOSER))
    except (yaml.YAMLError, RecursionError):
        return
    for index, root in enumerate(roots):
        built = [loader._builder(source, index, aliases=tracked) for tracked in (True, False)]
        tracked, untracked = (b.build(root) for b in built)
        assert (tracked.data, tracked.places, tracked.start) == (
            untracked.data, untracked.places, untracked.start)
        assert built[0].findings == built[1].findings
