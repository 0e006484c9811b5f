"""Limits on the JSON that enters the engine (docs/reliability.md, "Limits").

The SQL Core enforces the same numbers on run inputs (``flowlane.json_limits()``,
checked when a run is inserted); the worker checks handler outputs before
sending them and decodes claimed inputs without ever raising. A parity test
(tests/core/test_reliability_sql.py) proves the two copies agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 100  # nesting of arrays/objects: a scalar is 0, [] is 1, [[1]] is 2
MAX_BYTES = 64 * 1024 * 1024  # of JSON text
MAX_INPUT_BYTES = 1024 * 1024  # the run input as JSON text; documented in README
TERMINAL = ("completed", "failed", "cancelled")  # the statuses a run ends in
STATUSES = ("waiting", "started", *TERMINAL)  # waiting: a delayed start, not begun yet
# a run's priority (the flow option `priority`, `start --priority`); the JSON Schema states
# the same range for the YAML (tests/runtime keep the two equal)
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a JSON value the worker could not decode (the task then fails)."""

    reason: str


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``value`` nests arrays/objects deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


# one encoder for every output: json.dumps with an option builds a new one per call
_ENCODER = json.JSONEncoder(allow_nan=False)
_TOO_DEEP = f"handler returned JSON nested deeper than {MAX_DEPTH} levels (the limit)"


def check_output(output: Any) -> str | None:
    """None when a handler's ``output`` can be stored, else why not (too deep a nesting
    first, whatever else is wrong with it)."""
    try:
        text = _ENCODER.encode(output)
    except (TypeError, ValueError, RecursionError) as exc:
        return _TOO_DEEP if depth_exceeds(output) else (
            f"handler returned a value that is not JSON-serialisable: {exc}")
    # each level of nesting opens a bracket: only a text with more of them needs the walk
    if text.count("[") + text.count("{") > MAX_DEPTH and depth_exceeds(output):
        return _TOO_DEEP
    if "\\u0000" in text:
        return "handler returned a string containing \\u0000, which PostgreSQL jsonb cannot store"
    if len(text) > MAX_BYTES:  # ASCII (the encoder escapes the rest): a character is a byte
        return f"handler returned {len(text)} bytes of JSON, more than the limit of {MAX_BYTES} bytes"
    return None


def safe_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads`` for jsonb read by the worker: a value it cannot decode becomes
    :class:`Undecodable` instead of an exception that would fail the whole claimed batch."""
    if isinstance(data, memoryview):
        data = bytes(data)
    try:
        return json.loads(data)
    except RecursionError:
        return Undecodable(
            f"it is nested deeper than the worker can decode (the limit is {MAX_DEPTH} levels)"
        )
    except ValueError as exc:
        return Undecodable(f"it is not valid JSON: {exc}")


def undecodable_field(*values: tuple[str, Any]) -> str | None:
    """The error for the first ``(name, value)`` that could not be decoded, else None."""
    for name, value in values:
        if isinstance(value, Undecodable):
            return f"the task {name} cannot be decoded: {value.reason}"
    return None
