"""Durations: seconds or <n>s|m|h|d."""

from __future__ import annotations

import pytest

from flowlane import errors
from flowlane.compiler import durations


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0), (90, 90), ("45", 45), ("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), (" 5m ", 300),
])
def test_spellings(value: int | str, seconds: int) -> None:
    assert durations.to_seconds(value) == seconds


@pytest.mark.parametrize("value", [-1, True, 1.5, "5 min", "m", "1w", "", None])
def test_anything_else_is_refused(value: object) -> None:
    with pytest.raises(errors.UsageError):
        durations.to_seconds(value)  # type: ignore[arg-type]
