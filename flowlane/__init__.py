"""flowlane: declarative YAML workflows compiled to SQL, run on PostgreSQL + PGMQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowlane.compiler.model import Project

if TYPE_CHECKING:
    from flowlane.runtime.worker import Worker

__all__ = ["Project", "Worker"]


def __getattr__(name: str) -> Any:
    # the worker (and psycopg) load only when asked for: the compiler never needs them
    if name == "Worker":
        from flowlane.runtime.worker import Worker

        return Worker
    raise AttributeError(f"module 'flowlane' has no attribute {name!r}")
