"""``Project.load``: the validated project, the entry point for the worker runtime.

    from flowlane import Project
    project = Project.load("flows/")        # raises CompileError with .diagnostics
    project.flows / project.aliases / project.workers
    project.handlers(queue, flows)          # HandlerRef(flow_slug, step_slug, queue, handler)
    project.routed_pairs(queue, flows)      # {(flow_slug, step_slug), ...}
"""

from __future__ import annotations

from flowlane.compiler.api import load_project as load
from flowlane.compiler.model import Alias, Flow, HandlerRef, Location, Project, Step, WorkerDoc

__all__ = ["Alias", "Flow", "HandlerRef", "Location", "Project", "Step", "WorkerDoc", "load"]
