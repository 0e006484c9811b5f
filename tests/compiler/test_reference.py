"""docs/yaml-reference.md is generated from the JSON Schema (whose defaults
tests/test_defaults.py holds equal to the compiler's)."""

from __future__ import annotations

from flowlane.compiler import reference, schema


def test_the_reference_is_generated_from_the_schema() -> None:
    assert reference.DOC.read_text(encoding="utf-8") == reference.render(), (
        "docs/yaml-reference.md is stale: run `python -m flowlane.compiler.reference --write`")


def test_every_key_of_the_schema_is_in_the_reference() -> None:
    text = reference.render()
    defs = schema.published()["$defs"]
    for kind in ("flow", "alias", "worker", "step", "defaults"):
        for key in defs[kind]["properties"]:
            assert f"| `{key}` |" in text, (kind, key)

