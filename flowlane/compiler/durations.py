"""Durations in YAML: an integer of seconds or a string ``<n>s|m|h|d`` (``5m``); compiled
SQL always holds seconds. The JSON Schema's ``$defs/duration`` accepts the same spellings."""

from __future__ import annotations

import re

from flowlane import errors

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
PATTERN = r"^[0-9]+[smhd]$"
_SPELLING = re.compile(PATTERN)


def to_seconds(value: int | str) -> int:
    """The seconds a duration stands for; raises :class:`flowlane.errors.UsageError` for
    anything else (a bool, a negative number, ``5 min``)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise errors.UsageError(f"not a duration: {value!r}",
                                hint="write seconds as an integer, or 30s, 10m, 2h, 1d")
    if isinstance(value, int):
        if value < 0:
            raise errors.UsageError(f"a duration is not negative: {value}")
        return value
    text = value.strip()
    if text.isdigit():
        return int(text)
    if not _SPELLING.match(text):
        raise errors.UsageError(f"not a duration: {value!r}",
                                hint="write seconds as an integer, or 30s, 10m, 2h, 1d")
    return int(text[:-1]) * _UNITS[text[-1]]
