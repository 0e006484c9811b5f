"""YAML -> validated model -> SQL. Never touches a database.

Public API::

    from flowlane import compiler
    compiler.validate(["flows"])           # -> list[Diagnostic]
    project = compiler.load_project(["flows"])  # -> Project or CompileError
    files = compiler.compile_project(project)   # -> {"flows/x.sql": "...", "aliases.sql": "..."}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowlane import _lazy

if TYPE_CHECKING:
    from flowlane.compiler.api import (
        CompileResult,
        WriteSummary,
        analyze_paths,
        compile_paths,
        compile_project,
        load_project,
        project_from_text,
        validate,
        validate_text,
        write_output,
    )
    from flowlane.compiler.diagnostics import Diagnostic
    from flowlane.compiler.model import Alias, Flow, HandlerRef, Location, Project, Step, WorkerDoc

__all__ = [
    "Alias",
    "CompileResult",
    "Diagnostic",
    "Flow",
    "HandlerRef",
    "Location",
    "Project",
    "Step",
    "WorkerDoc",
    "WriteSummary",
    "analyze_paths",
    "compile_paths",
    "compile_project",
    "load_project",
    "project_from_text",
    "validate",
    "validate_text",
    "write_output",
]

# importing a submodule (flowlane.compiler.model) loads neither the loader nor jinja2
__getattr__ = _lazy.exports(__name__, {
    "flowlane.compiler.api": (
        "CompileResult", "WriteSummary", "analyze_paths", "compile_paths", "compile_project",
        "load_project", "project_from_text", "validate", "validate_text", "write_output",
    ),
    "flowlane.compiler.diagnostics": ("Diagnostic",),
    "flowlane.compiler.model": ("Alias", "Flow", "HandlerRef", "Location", "Project", "Step", "WorkerDoc"),
})
