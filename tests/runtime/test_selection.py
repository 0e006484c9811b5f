"""Queue selection and handler import rules (no database)."""

from __future__ import annotations

import pytest

from flowlane import errors
from flowlane.runtime.model import FlowSpec, HandlerRef, RuntimeProject, StepSpec, WorkerSpec
from flowlane.runtime.registry import HandlerRegistry
from flowlane.runtime.selection import select


def _flow(slug: str, mode: str, routes: dict[str, str], handler: str = "json:dumps") -> FlowSpec:
    steps = tuple(
        StepSpec(slug, step, i, queue, HandlerRef.parse(handler, f"flows/{slug}.yaml:{10 + i}"))
        for i, (step, queue) in enumerate(routes.items())
    )
    return FlowSpec(slug, mode, {"queue_mode": mode, "steps": []}, steps, f"flows/{slug}.yaml:1")


def _project() -> RuntimeProject:
    plain = _flow("plain", "flow", {"a": "plain", "b": "plain"})
    split = _flow("split", "per-step", {"a": "split__a", "b": "split__b"})
    shared = _flow("shared_v1", "explicit", {"a": "jobs", "b": "alerts"})
    shared2 = _flow("shared_v2", "explicit", {"a": "jobs", "b": "jobs"})
    return RuntimeProject(
        {f.slug: f for f in (plain, split, shared, shared2)},
        workers=(
            WorkerSpec("jobs_worker", "jobs", ("shared_v2",), max_concurrent=3, batch_size=7),
        ),
    )


def test_plain_flow_infers_its_queue_and_refuses_step() -> None:
    chosen = select(_project(), flow="plain")
    assert chosen.queue == "plain" and [s.slug for s in chosen.steps] == ["a", "b"]
    with pytest.raises(errors.UsageError, match="--step is not allowed"):
        select(_project(), flow="plain", step="a")


def test_per_step_flow_requires_step() -> None:
    with pytest.raises(errors.UsageError, match="--step is required") as info:
        select(_project(), flow="split")
    assert "--flow split --step a" in (info.value.hint or "")
    chosen = select(_project(), flow="split", step="b")
    assert chosen.queue == "split__b" and [s.slug for s in chosen.steps] == ["b"]
    with pytest.raises(errors.UsageError, match="no step 'c'"):
        select(_project(), flow="split", step="c")


def test_explicit_routing_needs_queue() -> None:
    with pytest.raises(errors.UsageError, match="--queue"):
        select(_project(), flow="shared_v1")


def test_queue_uses_the_worker_document_or_every_routed_step() -> None:
    chosen = select(_project(), queue="jobs")
    assert chosen.deployment is not None and chosen.default_name == "jobs_worker"
    assert {(s.flow_slug, s.slug) for s in chosen.steps} == {("shared_v2", "a"), ("shared_v2", "b")}
    narrowed = select(_project(), queue="jobs", flows=["shared_v1"])
    assert {(s.flow_slug, s.slug) for s in narrowed.steps} == {("shared_v1", "a")}
    everything = select(_project(), queue="alerts")
    assert [(s.flow_slug, s.slug) for s in everything.steps] == [("shared_v1", "b")]
    with pytest.raises(errors.UsageError, match="no step"):
        select(_project(), queue="nowhere")
    with pytest.raises(errors.UsageError, match="cannot be combined"):
        select(_project(), queue="jobs", flow="plain")


def test_missing_handlers_refuse_with_yaml_locations() -> None:
    steps = [
        StepSpec("f", "a", 0, "f", HandlerRef.parse("json:dumps", "flows/f.yaml:5")),
        StepSpec("f", "b", 1, "f", HandlerRef.parse("no_such_module_xyz:run", "flows/f.yaml:8")),
        StepSpec("f", "c", 2, "f", HandlerRef.parse("json:no_such_attr", "flows/f.yaml:11")),
    ]
    with pytest.raises(errors.WorkerError) as info:
        HandlerRegistry.load(steps)
    text = str(info.value)
    assert (
        "flows/f.yaml:8: handler no_such_module_xyz:run of step f.b: "
        "module 'no_such_module_xyz' not found" in text
    )
    assert "flows/f.yaml:11: handler json:no_such_attr of step f.c" in text
    assert "flows/f.yaml:5" not in text
    registry = HandlerRegistry.load(steps[:1])
    assert registry.pairs == [("f", "a")] and not registry.get("f", "a").is_async  # type: ignore[union-attr]


def test_a_worker_document_name_selects_its_queue() -> None:
    chosen = select(_project(), name="jobs_worker")
    assert chosen.queue == "jobs" and chosen.default_name == "jobs_worker"
    assert {(s.flow_slug, s.slug) for s in chosen.steps} == {("shared_v2", "a"), ("shared_v2", "b")}
    with pytest.raises(errors.UsageError, match="--name of a worker document"):
        select(_project(), name="nobody")
