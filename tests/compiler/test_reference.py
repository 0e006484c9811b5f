"""docs/yaml-reference.md is generated from the JSON Schema and says the defaults the
compiler applies."""

from __future__ import annotations

from flowlane.compiler import model, reference, schema


def test_the_reference_is_generated_from_the_schema() -> None:
    assert reference.DOC.read_text(encoding="utf-8") == reference.render(), (
        "docs/yaml-reference.md is stale: run `python -m flowlane.compiler.reference --write`")


def test_every_key_of_the_schema_is_in_the_reference() -> None:
    text = reference.render()
    defs = schema.published()["$defs"]
    for kind in ("flow", "alias", "worker", "step", "defaults"):
        for key in defs[kind]["properties"]:
            assert f"| `{key}` |" in text, (kind, key)


def test_the_schema_states_the_compilers_defaults() -> None:
    defs = schema.published()["$defs"]
    worker = defs["worker"]["properties"]
    assert (defs["max_attempts"]["default"], defs["base_delay"]["default"],
            defs["timeout"]["default"]) == (model.DEFAULT_MAX_ATTEMPTS, model.DEFAULT_BASE_DELAY,
                                            model.DEFAULT_TIMEOUT)
    assert (worker["max_concurrent"]["default"], worker["batch_size"]["default"]) == (
        model.DEFAULT_MAX_CONCURRENT, model.DEFAULT_BATCH_SIZE)
