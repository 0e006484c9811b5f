"""Name rules: the JSON Schema's name definitions are generated from names.py's constants, and
names.py and the schema accept exactly the same names (tests/core/test_name_parity.py adds
the SQL Core)."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import given, settings

from flowlane.compiler import names, schema
from tests.compiler.strategies import FIXED, NAMES

ANNOTATIONS = {"description", "examples", "title", "x-flowlane-name", "x-flowlane-code",
               "patternErrorMessage", "errorMessage"}


def shipped_definitions() -> dict[str, dict[str, Any]]:
    """The name definitions of the shipped schema file, without annotations."""
    defs = schema.schema()["$defs"]
    found = {"slug": defs["slug"], "queue": defs["queue"],
             "deployment": defs["worker"]["properties"]["name"]}
    return {key: _plain(value) for key, value in found.items()}


def _plain(definition: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) if isinstance(v, dict) else v
            for k, v in definition.items() if k not in ANNOTATIONS}


def test_the_schema_file_states_the_rules_generated_from_names_py() -> None:
    assert shipped_definitions() == names.schema_definitions()


def schema_accepts(kind: str, value: str) -> bool:
    return bool(jsonschema.Draft202012Validator(shipped_definitions()[kind]).is_valid(value))


def check_agreement(value: str) -> None:
    assert (names.slug_problem(value) is None) == schema_accepts("slug", value), value
    assert (names.queue_problem(value) is None) == schema_accepts("queue", value), value


def test_fixed_near_misses_agree() -> None:
    for value in FIXED:
        check_agreement(value)
    assert names.slug_problem("Run") is not None and names.slug_problem("runs") is None
    assert not schema_accepts("deployment", "a\n") and schema_accepts("deployment", "1.a-b_c")


@settings(max_examples=400, deadline=None)
@given(NAMES)
def test_names_py_and_the_schema_accept_the_same_names(value: str) -> None:
    check_agreement(value)
