"""YAML -> validated model -> SQL. Never touches a database.

Public API::

    from flowlane import compiler
    compiler.validate(["flows"])           # -> list[Diagnostic]
    project = compiler.load_project(["flows"])  # -> Project or CompileError
    files = compiler.compile_project(project)   # -> {"flows/x.sql": "...", "aliases.sql": "..."}

The pipeline (``api`` runs the stages in this order)::

    load      loader.py       YAML files -> Documents (line and column of every node)
    validate  schema.py       Documents against the JSON Schema (fastcheck.py: its fast path)
    analyze   analyze.py      semantic checks -> model.py's frozen Project (checks/: one
                              module per kind of document, sharing checks/shared.py)
                              (toposort.py: step order, cycles; names.py: name rules and the
                              names the compiler derives)
    render    compiled.py     Project -> SQL files (templates/*.sql.j2, quoting in sqltext.py;
                              shape.py: the flow shape) and the compiled format read back

Findings along the way are ``Diagnostic`` data (diagnostics.py, stable codes in codes.py).

Tools built on the stages, never used by them::

    check.py      ``flowlane check``: stale SQL and shape changes since a git base (gitrev.py)
    diagram.py    ``flowlane graph``: Mermaid or Graphviz diagrams of a flow
    pytypes.py    ``flowlane types``: ``Literal`` types of the project's names
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
