"""A step's cache (docs/flow-control.md, "Step caches"): its model and its fingerprint (its
checks are ``checks/flow_cache.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowlane.compiler import durations, shape
from flowlane.compiler.model import Step, StepCache


def step_cache(spec: Mapping[str, Any]) -> StepCache | None:
    """The ``cache`` of a checked step; a single key pointer is a list of one."""
    value = spec.get("cache")
    if value is None:
        return None
    key = value.get("key")
    return StepCache(durations.to_seconds(value["ttl"]),
                     None if key is None else (key,) if isinstance(key, str) else tuple(key))


def fingerprint(step: Step) -> str:
    """What a cache entry is kept under besides the flow, the step and the key: the step's
    shape and its handler, so that a changed handler never finds the older outputs."""
    identity = {"step": shape.step_shape(step), "handler": step.handler}
    return shape.shape_sha256(identity)[:32]
