"""Structured log lines (no database)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from flowlane.runtime import log
from flowlane.runtime.limits import MAX_DEPTH
from flowlane.runtime.limits import check_output as check_json


def test_event_lines_quote_values_and_skip_none(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="flowlane.worker"):
        log.event(
            logging.INFO,
            "task_failed",
            run_id="r1",
            step="a",
            error='Bad "x" = y',
            note=None,
            empty="",
        )
    (record,) = caplog.records
    assert record.getMessage() == 'task_failed run_id=r1 step=a error="Bad \\"x\\" = y" empty=""'
    payload = json.loads(log.JSONFormatter().format(record))
    assert payload["event"] == "task_failed" and payload["error"] == 'Bad "x" = y'
    assert "note" not in payload and payload["level"] == "info"


def test_output_json_check() -> None:
    assert check_json({"a": [1, 2.5, None, True, "x"]}) is None
    assert "not JSON-serialisable" in (check_json({"a": {1, 2}}) or "")
    assert "not JSON-serialisable" in (check_json(float("nan")) or "")
    assert "\\u0000" in (check_json("a\x00b") or "")


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_output_json_check_names_too_deep_a_nesting_first() -> None:
    too_deep = f"nested deeper than {MAX_DEPTH} levels"
    assert check_json(_nested(MAX_DEPTH)) is None
    assert too_deep in (check_json(_nested(MAX_DEPTH + 1)) or "")
    # whatever else is wrong with it: a leaf JSON cannot encode, or beyond Python's recursion
    assert too_deep in (check_json(_nested(MAX_DEPTH + 1, leaf={1, 2})) or "")
    assert too_deep in (check_json(_nested(MAX_DEPTH + 1, leaf=float("nan"))) or "")
    assert too_deep in (check_json(_nested(20 * MAX_DEPTH)) or "")
    assert "not JSON-serialisable" in (check_json(_nested(MAX_DEPTH, leaf={1, 2})) or "")
    # brackets inside strings are no nesting
    assert check_json({"text": "[{" * MAX_DEPTH, "list": ["[" * MAX_DEPTH]}) is None
