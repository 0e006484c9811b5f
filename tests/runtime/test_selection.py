"""Queue selection and handler import rules (no database)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flowlane import Project, errors
from flowlane.compiler import Flow, HandlerRef, Location, Step, WorkerDoc, project_from_text
from flowlane.compiler.model import Alias, QueueMode
from flowlane.runtime.registry import HandlerRegistry
from flowlane.runtime.selection import select
from flowlane.runtime.worker import Worker


def _flow(slug: str, mode: QueueMode, routes: dict[str, str], handler: str = "json:dumps") -> Flow:
    steps = tuple(
        Step(step, i, handler, queue, handler_location=Location(f"flows/{slug}.yaml", 10 + i, 5))
        for i, (step, queue) in enumerate(routes.items())
    )
    return Flow(slug, mode, steps, location=Location(f"flows/{slug}.yaml", 1, 1))


def _project() -> Project:
    """Built from the model directly: the compiler would also ask for a worker document
    listing shared_v1 on queue jobs, which is the case these tests are about."""
    plain = _flow("plain", "flow", {"a": "plain", "b": "plain"})
    split = _flow("split", "per-step", {"a": "split__a", "b": "split__b"})
    shared = _flow("shared_v1", "explicit", {"a": "jobs", "b": "alerts"})
    shared2 = _flow("shared_v2", "explicit", {"a": "jobs", "b": "jobs"})
    return Project(
        (plain, split, shared, shared2),
        workers=(
            WorkerDoc("jobs_worker", "jobs", ("shared_v2",), max_concurrent=3, batch_size=7),
        ),
    )


def test_plain_flow_infers_its_queue_and_refuses_step() -> None:
    chosen = select(_project(), flow="plain")
    assert chosen.queue == "plain" and [h.step_slug for h in chosen.handlers] == ["a", "b"]
    with pytest.raises(errors.UsageError, match="--step is not allowed"):
        select(_project(), flow="plain", step="a")


def test_per_step_flow_requires_step() -> None:
    with pytest.raises(errors.UsageError, match="--step is required") as info:
        select(_project(), flow="split")
    assert "--flow split --step a" in (info.value.hint or "")
    chosen = select(_project(), flow="split", step="b")
    assert chosen.queue == "split__b" and [h.step_slug for h in chosen.handlers] == ["b"]
    with pytest.raises(errors.UsageError, match="no step 'c'"):
        select(_project(), flow="split", step="c")


def test_explicit_routing_needs_queue() -> None:
    with pytest.raises(errors.UsageError, match="--queue"):
        select(_project(), flow="shared_v1")


def test_queue_uses_the_worker_document_or_every_routed_step() -> None:
    chosen = select(_project(), queue="jobs")
    assert chosen.deployment is not None and chosen.default_name == "jobs_worker"
    assert {(h.flow_slug, h.step_slug) for h in chosen.handlers} == {("shared_v2", "a"), ("shared_v2", "b")}
    narrowed = select(_project(), queue="jobs", flows=["shared_v1"])
    assert {(h.flow_slug, h.step_slug) for h in narrowed.handlers} == {("shared_v1", "a")}
    everything = select(_project(), queue="alerts")
    assert [(h.flow_slug, h.step_slug) for h in everything.handlers] == [("shared_v1", "b")]
    with pytest.raises(errors.UsageError, match="no step"):
        select(_project(), queue="nowhere")
    with pytest.raises(errors.UsageError, match="cannot be combined"):
        select(_project(), queue="jobs", flow="plain")


def test_missing_handlers_refuse_with_yaml_locations() -> None:
    steps = [
        HandlerRef("f", "a", "f", "json:dumps", Location("flows/f.yaml", 5, 12)),
        HandlerRef("f", "b", "f", "no_such_module_xyz:run", Location("flows/f.yaml", 8, 12)),
        HandlerRef("f", "c", "f", "json:no_such_attr", Location("flows/f.yaml", 11, 12)),
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
    assert {(h.flow_slug, h.step_slug) for h in chosen.handlers} == {("shared_v2", "a"), ("shared_v2", "b")}
    with pytest.raises(errors.UsageError, match="no `kind: worker` document is named 'nobody'") as e:
        select(_project(), name="nobody")
    assert e.value.hint is not None and "jobs_worker" in e.value.hint and "--queue Q" in e.value.hint
    with pytest.raises(errors.UsageError, match="unknown flow or alias 'nope'") as e:
        select(_project(), queue="jobs", flows=["nope"])
    assert e.value.hint is not None and "shared_v2" in e.value.hint
    with pytest.raises(errors.UsageError, match="--name of a worker document"):
        select(_project())


PROJECT_YAML = """
kind: flow
slug: shared
queues: {a: jobs, b: jobs}
steps:
  a: {handler: "json:dumps"}
  b: {handler: "json:dumps"}
---
kind: worker
name: jobs_worker
queue: jobs
flows: [shared]
max_concurrent: 3
batch_size: 7
"""


def test_worker_takes_a_project_or_a_path(tmp_path: Path) -> None:
    (tmp_path / "project.yaml").write_text(PROJECT_YAML)
    for given in (project_from_text(PROJECT_YAML), tmp_path, str(tmp_path)):
        worker = Worker(given, queue="jobs", handle_signals=False)
        assert isinstance(worker.project, Project)
        assert (worker.queue, worker.name) == ("jobs", "jobs_worker")
        assert (worker.max_concurrent, worker.batch_size) == (3, 7)
        assert worker.selection.flows == ["shared"]
        assert {h.step_slug for h in worker.selection.handlers} == {"a", "b"}
    with pytest.raises(errors.ProjectError, match="cannot use dict"):
        Worker({}, queue="jobs")  # type: ignore[arg-type]


SPLIT_ALIAS = """\
kind: flow
slug: orders_v1
steps:
  a: {handler: json:dumps}
---
kind: flow
slug: orders_v2
steps:
  a: {handler: json:dumps}
---
kind: alias
slug: orders
active: orders_v2
draining: [orders_v1]
"""


def test_flow_alias_whose_versions_use_different_queues_is_refused() -> None:
    project = project_from_text(SPLIT_ALIAS)
    with pytest.raises(errors.UsageError, match="route their steps to different queues") as info:
        select(project, flow="orders")
    assert "orders_v2: orders_v2; orders_v1: orders_v1" in str(info.value)  # active first
    assert info.value.hint is not None
    assert "`flowlane worker --queue orders_v1 --flows orders`" in info.value.hint
    assert "`flowlane worker --queue orders_v2 --flows orders`" in info.value.hint
    # each of those commands selects exactly one version's handlers
    for version in ("orders_v1", "orders_v2"):
        chosen = select(project, queue=version, flows=["orders"])
        assert chosen.flows == [version]
    assert select(project, flow="orders_v2").queue == "orders_v2"  # a concrete slug is fine


def test_worker_pairs_are_exact_flow_step_pairs() -> None:
    worker = Worker(_project(), queue="jobs", handle_signals=False)
    assert worker.pairs == [("shared_v2", "a"), ("shared_v2", "b")]
    assert worker.name == "jobs_worker" and worker.compile is False


def test_unknown_flow_hint_lists_aliases_too() -> None:
    project = dataclasses.replace(_project(), aliases=(Alias("shared", "shared_v2", ("shared_v1",)),))
    with pytest.raises(errors.UsageError, match="unknown flow 'nope'") as e:
        select(project, flow="nope")
    assert e.value.hint is not None
    assert "known flows: plain, shared_v1, shared_v2, split; aliases: shared" in e.value.hint
