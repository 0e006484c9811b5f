"""Load a flowlane project for the runtime (through the compiler) and narrow it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowlane import errors
from flowlane.runtime.model import RuntimeProject


def load(paths: str | Path = "flows") -> RuntimeProject:
    """Validate the YAML under ``paths`` with the compiler and return the runtime view."""
    try:
        from flowlane.compiler.project import Project
    except ModuleNotFoundError as exc:  # pragma: no cover - only in a partial checkout
        raise errors.ProjectError(
            "the flowlane compiler is not available in this checkout"
        ) from exc
    return from_project(Project.load(paths))


def as_runtime_project(project: Any) -> RuntimeProject:
    if isinstance(project, RuntimeProject):
        return project
    if isinstance(project, str | Path):
        return load(project)
    return from_project(project)


def from_project(project: Any) -> RuntimeProject:
    """Narrow the compiler's ``Project`` to what a worker needs."""
    raise errors.ProjectError(f"cannot use {type(project).__name__} as a flowlane project")
