"""Structured log lines (no database)."""

from __future__ import annotations

import json
import logging

import pytest

from flowlane.runtime import log
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
