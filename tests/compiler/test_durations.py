"""Durations: the JSON Schema's written form and the compiler's conversion agree."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowlane.compiler import durations, schema

SCHEMA_PATTERN = re.compile(schema.published()["$defs"]["duration"]["pattern"])


@pytest.mark.parametrize(("text", "seconds"), [
    ("0s", 0), ("45s", 45), ("5m", 300), ("2h", 7200), ("1d", 86400), (90, 90),
])
def test_a_duration_converts_to_seconds(text: str | int, seconds: int) -> None:
    assert durations.to_seconds(text) == seconds


@pytest.mark.parametrize("text", ["5", "5 m", "5M", "-5s", "1.5h", "5ms", "", "s", True])
def test_anything_else_is_refused_with_the_accepted_forms(text: str | bool) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        durations.to_seconds(text)


@given(st.one_of(st.from_regex(SCHEMA_PATTERN), st.text(alphabet="0123456789smhdx .-", max_size=13)))
def test_the_schema_accepts_exactly_what_the_compiler_converts(text: str) -> None:
    try:
        durations.to_seconds(text)
        converted = True
    except ValueError:
        converted = False
    assert converted == bool(SCHEMA_PATTERN.search(text))
