"""The shape of a flow (docs/shape.md): its identity, compared as JSON."""

from __future__ import annotations

import hashlib
import json
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
            if a.get(key) != b.get(key):
                lines.append(f"step {index} ({b.get('slug')}): {key} is {_show(a.get(key))} in "
                             f"{old_name}, {_show(b.get(key))} in {new_name}")
    return lines


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
