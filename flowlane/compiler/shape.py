"""The shape of a flow (docs/shape.md): its identity, compared as JSON."""

from __future__ import annotations

import difflib
import hashlib
import json
from decimal import Decimal
from typing import Any

from flowlane.compiler.model import Flow, Step


def flow_shape(flow: Flow) -> dict[str, Any]:
    """Everything but options, descriptions and handlers; contracts only where written (a
    flow without any has the shape it had before contracts existed)."""
    shape: dict[str, Any] = {"queue_mode": flow.queue_mode,
                             "steps": [_step_shape(s) for s in flow.steps]}
    if flow.input_schema is not None:
        shape["input_schema"] = _plain(flow.input_schema)
    return shape


def step_shape(step: Step) -> dict[str, Any]:
    """One step's part of its flow's shape."""
    return _step_shape(step)


def _step_shape(step: Step) -> dict[str, Any]:
    shape: dict[str, Any] = {
        "slug": step.slug,
        "type": step.type,
        "needs": sorted(step.needs),
        "if": _plain(step.condition_if),
        "unless": _plain(step.condition_unless),
        "when_unmet": step.when_unmet,
        "when_exhausted": step.when_exhausted,
        "queue": step.queue,
    }
    if step.output_schema is not None:
        shape["output_schema"] = _plain(step.output_schema)
    if step.flow is not None:  # only a child-flow step has the key: older shapes stay the same
        shape["flow"] = step.flow
    return shape


def _plain(value: Any) -> Any:
    return None if value is None else json.loads(json.dumps(value))


def canonical_text(shape: dict[str, Any]) -> str:
    return json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def shape_sha256(shape: dict[str, Any]) -> str:
    return text_sha256(canonical_text(shape))


def text_sha256(canonical: str) -> str:
    """The digest of a shape's canonical text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


_STEP_KEYS = ("slug", "type", "needs", "if", "unless", "when_unmet", "when_exhausted", "queue",
              "output_schema", "flow")
_ABSENT: Any = object()  # a missing key, which SQL sees as NULL (shown as ``absent``)


def differences(old: dict[str, Any], new: dict[str, Any],
                old_name: str = "the database", new_name: str = "the given shape") -> list[str]:
    """Readable lines, one per difference, in the words of the SQL Core's
    ``_shape_differences`` (with the default names, exactly its text: a parity test proves
    it). Where a database is at hand, ask it instead (``verify_flow``); this copy serves the
    offline comparisons (``check --base``)."""
    lines = _flow_differences(old, new, old_name, new_name)
    old_steps, new_steps = old.get("steps") or [], new.get("steps") or []
    if len(old_steps) != len(new_steps):
        lines.append(f"step count: {len(old_steps)} in {old_name}, {len(new_steps)} in {new_name}")
    for index in range(max(len(old_steps), len(new_steps))):
        if index >= len(old_steps):
            lines.append(f"step {index} ({_get(new_steps[index], 'slug')}): only in {new_name}")
        elif index >= len(new_steps):
            lines.append(f"step {index} ({_get(old_steps[index], 'slug')}): only in {old_name}")
        else:
            lines += _step_differences(index, old_steps[index], new_steps[index],
                                       old_name, new_name)
    return lines


def _flow_differences(old: dict[str, Any], new: dict[str, Any], old_name: str,
                      new_name: str) -> list[str]:
    """The differences outside the steps."""
    lines: list[str] = []
    old_mode, new_mode = old.get("queue_mode", _ABSENT), new.get("queue_mode", _ABSENT)
    if not same_json(old_mode, new_mode):
        lines.append(f"queue_mode: {shown(old_mode)} in {old_name}, {shown(new_mode)} in {new_name}")
    old_input, new_input = old.get("input_schema", _ABSENT), new.get("input_schema", _ABSENT)
    if not same_json(old_input, new_input):
        lines.append(f"input_schema: {shown(old_input)} in {old_name}, {shown(new_input)} in {new_name}")
    lines += [f"unknown key {key} in {new_name}" for key in sorted(new)
              if key not in ("queue_mode", "steps", "input_schema")]
    return lines


def described(old: dict[str, Any], new: dict[str, Any],
              old_name: str = "the database", new_name: str = "the given shape") -> list[str]:
    """The differences for a reader: as ``differences`` while both shapes have the same steps
    in the same order; otherwise the steps added, removed and moved are named by slug, and
    the steps of both are compared by slug rather than by position (an inserted step is one
    line, not a difference at every position after it)."""
    old_steps, new_steps = _steps_by_slug(old), _steps_by_slug(new)
    if old_steps is None or new_steps is None or same_steps(old, new):
        return differences(old, new, old_name, new_name)
    lines = _flow_differences(old, new, old_name, new_name)
    old_order, new_order = list(old_steps), list(new_steps)
    lines += [f"step `{slug}` added in {new_name} (position {new_order.index(slug)})"
              for slug in new_order if slug not in old_steps]
    lines += [f"step `{slug}` removed: in {old_name} (position {old_order.index(slug)}), "
              f"not in {new_name}" for slug in old_order if slug not in new_steps]
    lines += [f"step `{slug}` moved: position {old_order.index(slug)} in {old_name}, "
              f"{new_order.index(slug)} in {new_name}" for slug in _moved(old_order, new_order)]
    for slug in new_order:
        if slug in old_steps:
            lines += _key_differences(f"step `{slug}`", old_steps[slug], new_steps[slug],
                                      old_name, new_name)
    return lines


def same_steps(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Both shapes have steps of the same slugs in the same order (``differences`` then
    compares them position by position, step by step)."""
    old_steps, new_steps = _steps_by_slug(old), _steps_by_slug(new)
    return old_steps is None or new_steps is None or list(old_steps) == list(new_steps)


def _steps_by_slug(shape: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The steps of a shape by slug, None when some step has no slug of its own."""
    steps = shape.get("steps") or []
    found: dict[str, dict[str, Any]] = {}
    for step in steps if isinstance(steps, list) else [None]:
        slug = step.get("slug") if isinstance(step, dict) else None
        if not isinstance(step, dict) or not isinstance(slug, str) or slug in found:
            return None
        found[slug] = step
    return found


def _moved(old_order: list[str], new_order: list[str]) -> list[str]:
    """The steps of both whose order among the others changed: those outside the longest
    run of steps kept in the same order, in the order of ``new_order``."""
    old_kept = [s for s in old_order if s in new_order]
    new_kept = [s for s in new_order if s in old_order]
    matcher = difflib.SequenceMatcher(None, old_kept, new_kept, autojunk=False)
    in_place = {new_kept[b.b + i] for b in matcher.get_matching_blocks() for i in range(b.size)}
    return [s for s in new_kept if s not in in_place]


def _step_differences(index: int, old: dict[str, Any], new: dict[str, Any],
                      old_name: str, new_name: str) -> list[str]:
    old_slug, new_slug = old.get("slug", _ABSENT), new.get("slug", _ABSENT)
    if not same_json(old_slug, new_slug):
        return [(f"step {index}: slug is {shown(old_slug)} in {old_name}, "
                 f"{shown(new_slug)} in {new_name}")]
    return _key_differences(f"step {index} ({shown(old_slug)})", old, new, old_name, new_name)


def _key_differences(label: str, old: dict[str, Any], new: dict[str, Any],
                     old_name: str, new_name: str) -> list[str]:
    lines = [f"{label}: {key} is {shown(old.get(key, _ABSENT))} in {old_name}, "
             f"{shown(new.get(key, _ABSENT))} in {new_name}"
             for key in _STEP_KEYS[1:]
             if not same_json(old.get(key, _ABSENT), new.get(key, _ABSENT))]
    lines += [f"{label}: unknown key {key} in {new_name}" for key in sorted(new)
              if key not in _STEP_KEYS]
    return lines


def _get(step: dict[str, Any], key: str) -> str:
    return shown(step.get(key, _ABSENT))


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


def shown(value: Any) -> str:
    """A value as the SQL Core's ``_shape_text`` shows it: a string bare, a missing key as
    ``absent``, anything else as PostgreSQL prints the jsonb value."""
    if value is _ABSENT:
        return "absent"
    return value if isinstance(value, str) else jsonb_text(value)


def jsonb_text(value: Any) -> str:
    """``value::text`` for a jsonb value: ``", "`` and ``": "`` separators, object keys
    shortest first (then by their UTF-8 bytes), numbers in PostgreSQL's numeric notation."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode("utf-8")), k.encode("utf-8")))
        return "{" + ", ".join(f"{jsonb_text(k)}: {jsonb_text(value[k])}" for k in keys) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(jsonb_text(item) for item in value) + "]"
    if isinstance(value, float):
        number = Decimal(repr(value))  # the text json.dumps sends, read as numeric reads it
        return format(abs(number) if number.is_zero() else number, "f")
    return json.dumps(value, ensure_ascii=False)
