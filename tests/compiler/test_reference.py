"""docs/yaml-reference.md is generated from the JSON Schema (whose defaults
tests/test_defaults.py holds equal to the compiler's) and the compiler's own tables."""

from __future__ import annotations

from typing import Any

from flowlane.compiler import cron, reference, schema
from flowlane.compiler.analyze import HANDLER_OPTIONS


def test_the_reference_is_generated_from_the_schema() -> None:
    assert reference.DOC.read_text(encoding="utf-8") == reference.render(), (
        f"docs/yaml-reference.md is stale: run `{reference.COMMAND}`")


def _sections(text: str) -> dict[str, str]:
    """Each ``## `` heading of the reference and the text under it."""
    parts = text.split("\n## ")[1:]
    return {part.partition("\n")[0]: part.partition("\n")[2] for part in parts}


def _keys(body: str) -> list[str]:
    return [line.split("`")[1] for line in body.splitlines() if line.startswith("| `")]


SKIPPED = ("if", "then", "not", "examples", "x-flowlane-examples")  # conditions and examples


def _mappings(node: Any) -> list[dict[str, Any]]:
    """Every mapping with keys of its own at or below ``node`` (conditions and examples aside)."""
    if isinstance(node, list):
        return [found for item in node for found in _mappings(item)]
    if not isinstance(node, dict):
        return []
    here = [node] if isinstance(node.get("properties"), dict) else []
    return here + [found for key, value in node.items() if key not in SKIPPED
                   for found in _mappings(value)]


def test_every_kind_has_a_section_with_every_key_of_its_document() -> None:
    published = schema.published()
    sections = _sections(reference.render())
    for kind in published["$defs"]["kind"]["enum"]:
        definition = next(rule["then"]["$ref"].rpartition("/")[2] for rule in published["allOf"]
                          if rule["if"]["properties"]["kind"]["const"] == kind)
        assert _keys(sections[f"`kind: {kind}`"]) == list(published["$defs"][definition]["properties"])


def test_every_nested_mapping_has_a_section_with_its_keys() -> None:
    published = schema.published()
    tables = [_keys(body) for body in _sections(reference.render()).values()]
    for node in _mappings(published["$defs"]):
        assert list(node["properties"]) in tables, list(node["properties"])


def test_the_schedule_and_dedup_keys_are_listed() -> None:
    sections = _sections(reference.render())
    assert _keys(sections["`dedup` (in `kind: flow`)"]) == ["key"]
    assert {"cron", "every", "timezone", "input", "overlap", "catch_up"} <= set(
        _keys(sections["`kind: schedule`"]))


def test_the_compiler_tables_are_in_the_reference() -> None:
    sections = _sections(reference.render())
    schedule = sections["`kind: schedule`"]
    for shorthand, expression in cron.SHORTHANDS.items():
        assert f"`{shorthand}` (`{expression}`)" in schedule
    for field in cron.FIELDS:
        assert f"{field.name} {field.allowed}" in schedule
    step = sections["`steps.<step>` (in `kind: flow`)"]
    for kind, options in HANDLER_OPTIONS.items():
        assert f"a {kind} step takes no {', '.join(f'`{option}`' for option in options)}" in step
