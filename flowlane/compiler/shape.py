"""The shape of a flow (docs/shape.md): its identity, compared as JSON."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

from flowlane.compiler.model import Flow, Step


def flow_shape(flow: Flow) -> dict[str, Any]:
    """Everything but options, descriptions and handlers."""
    return {"queue_mode": flow.queue_mode, "steps": [_step_shape(s) for s in flow.steps]}


def _step_shape(step: Step) -> dict[str, Any]:
    return {
        "slug": step.slug,
        "type": step.type,
        "needs": sorted(step.needs),
        "if": _plain(step.condition_if),
        "unless": _plain(step.condition_unless),
        "when_unmet": step.when_unmet,
        "when_exhausted": step.when_exhausted,
        "queue": step.queue,
    }


def _plain(value: Any) -> Any:
    return None if value is None else json.loads(json.dumps(value))


def canonical_text(shape: dict[str, Any]) -> str:
    return json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def shape_sha256(shape: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_text(shape).encode("utf-8")).hexdigest()


def differences(old: dict[str, Any], new: dict[str, Any],
                old_name: str = "the database", new_name: str = "the given shape") -> list[str]:
    """Readable lines, one per difference (the same wording as the SQL Core)."""
    lines: list[str] = []
    if old.get("queue_mode") != new.get("queue_mode"):
        lines.append(f"queue_mode: {old.get('queue_mode')} in {old_name}, "
                     f"{new.get('queue_mode')} in {new_name}")
    old_steps, new_steps = old.get("steps", []), new.get("steps", [])
    if len(old_steps) != len(new_steps):
        lines.append(f"step count: {len(old_steps)} in {old_name}, {len(new_steps)} in {new_name}")
    for index, (a, b) in enumerate(zip(old_steps, new_steps, strict=False)):
        for key in ("slug", "type", "needs", "if", "unless", "when_unmet", "when_exhausted",
                    "queue"):
            if not same_json(a.get(key), b.get(key)):
                lines.append(f"step {index} ({b.get('slug')}): {key} is {_show(a.get(key))} in "
                             f"{old_name}, {_show(b.get(key))} in {new_name}")
    return lines


def same_json(a: Any, b: Any) -> bool:
    """Equality with jsonb's meaning (the SQL Core's ensure_flow_shape decides with it):
    ``true`` is not ``1`` (Python says it is), and numbers compare by value, so ``1e3``
    equals ``1000`` and ``1.5e300`` equals the digits PostgreSQL prints for it."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return Decimal(repr(a)) == Decimal(repr(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
