"""`retention`: compiled to seconds only where it differs from the default, so files written
before the option compile to the same bytes; `forever` is null; too long is refused."""

from __future__ import annotations

import pytest

from flowlane.compiler import api

FLOW = 'kind: flow\nslug: kept\n{option}steps:\n  one: {{handler: "json:dumps"}}\n'


def _create_flow(option: str) -> str:
    sql = api.compile_project(api.project_from_text(FLOW.format(option=option)))["flows/kept.sql"]
    return sql[sql.index("select flowlane.create_flow("):].split(");", 1)[0]


@pytest.mark.parametrize(("option", "line"), [
    ("retention: 7d\n", "retention => 604800"),
    ("retention: 90m\n", "retention => 5400"),
    ("retention: 3600\n", "retention => 3600"),
    ("retention: forever\n", "retention => null"),
])
def test_a_stated_retention_compiles_to_seconds(option: str, line: str) -> None:
    assert _create_flow(option).endswith(f"queue_mode => 'flow',\n  {line}\n")


@pytest.mark.parametrize("option", ["", "retention: 30d\n", "retention: 2592000\n"])
def test_the_default_retention_adds_nothing(option: str) -> None:
    assert "retention" not in _create_flow(option)


@pytest.mark.parametrize(("value", "code", "message"), [
    ("99999999d", "FL016", "it must be at least 1 and at most 2147483647 seconds"),
    ("0d", "FL016", "it must be at least 1"),
    ("3w", "FL013", "invalid format, got `3w`"),
    ("0", "FL013", "must be at least 1"),
])
def test_a_bad_retention_is_a_located_error(value: str, code: str, message: str) -> None:
    findings = api.validate_text(FLOW.format(option=f"retention: {value}\n"))
    assert [(f.code, f.line) for f in findings] == [(code, 3)], findings
    assert message in findings[0].message
