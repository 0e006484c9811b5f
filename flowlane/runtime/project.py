"""Load a flowlane project for the runtime (through the compiler) and narrow it.

The compiler validates the YAML (``Project.load``) and computes each flow's
shape; the worker only needs the narrow view of :mod:`flowlane.runtime.model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowlane import compiler, errors
from flowlane.compiler import shape as shapes
from flowlane.runtime.model import (
    AliasSpec,
    FlowSpec,
    HandlerRef,
    RuntimeProject,
    StepSpec,
    WorkerSpec,
)


def load_compiled(paths: Sequence[str | Path] = ("flows",)) -> compiler.Project:
    """The compiler's validated ``Project`` (raises ``CompileError`` with every finding)."""
    return compiler.load_project(list(paths))


def load(paths: str | Path | Sequence[str | Path] = ("flows",)) -> RuntimeProject:
    """Validate the YAML under ``paths`` and return the runtime view."""
    if isinstance(paths, str | Path):
        paths = [paths]
    return from_project(load_compiled(paths))


def as_runtime_project(project: Any) -> RuntimeProject:
    if isinstance(project, RuntimeProject):
        return project
    if isinstance(project, str | Path):
        return load(project)
    return from_project(project)


def _where(location: compiler.Location | None, fallback: str) -> str:
    if location is None:
        return fallback
    return f"{location.path}:{location.line}"


def from_project(project: Any, root: str | Path | None = None) -> RuntimeProject:
    """Narrow the compiler's ``Project`` to what a worker needs."""
    if not hasattr(project, "flows") or not hasattr(project, "aliases"):
        raise errors.ProjectError(f"cannot use {type(project).__name__} as a flowlane project")
    flows: dict[str, FlowSpec] = {}
    for flow in project.flows:
        source = _where(flow.location, flow.slug)
        steps = tuple(
            StepSpec(
                flow_slug=flow.slug,
                slug=step.slug,
                index=step.index,
                queue=step.queue,
                handler=HandlerRef.parse(
                    step.handler, _where(step.handler_location or step.location, source)
                )
                if step.handler
                else None,
            )
            for step in flow.steps
        )
        flows[flow.slug] = FlowSpec(
            flow.slug, flow.queue_mode, shapes.flow_shape(flow), steps, source
        )
    aliases = {a.slug: AliasSpec(a.slug, a.active, tuple(a.draining)) for a in project.aliases}
    workers = tuple(
        WorkerSpec(
            w.name,
            w.queue,
            tuple(w.flows),
            w.max_concurrent,
            w.batch_size,
            _where(w.location, w.name),
        )
        for w in getattr(project, "workers", ())
    )
    return RuntimeProject(flows, aliases, workers, str(root or Path.cwd()))
