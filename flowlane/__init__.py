"""flowlane: declarative YAML workflows compiled to SQL, run on PostgreSQL + PGMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowlane import _lazy

if TYPE_CHECKING:
    from flowlane.compiler.api import load_project
    from flowlane.compiler.model import Project
    from flowlane.runtime.worker import Worker

__all__ = ["Project", "Worker", "load_project"]

__version__ = "0.2.0.dev0"  # the only place the version is written

# nothing loads until asked for: the compiler never needs psycopg, a handler module never jinja2
__getattr__ = _lazy.exports(__name__, {
    "flowlane.compiler.api": ("load_project",),
    "flowlane.compiler.model": ("Project",),
    "flowlane.runtime.worker": ("Worker",),
})
