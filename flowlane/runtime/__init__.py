"""The Python worker runtime and client: run handlers for a queue, start and inspect runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowlane import _lazy

if TYPE_CHECKING:
    from flowlane.runtime.client import AsyncClient, Client
    from flowlane.runtime.config import WorkerConfig
    from flowlane.runtime.context import TaskContext
    from flowlane.runtime.worker import Worker

__all__ = ["AsyncClient", "Client", "TaskContext", "Worker", "WorkerConfig"]

# handler modules import flowlane.runtime.context: the worker (psycopg_pool) loads only when asked for
__getattr__ = _lazy.exports(__name__, {
    "flowlane.runtime.client": ("AsyncClient", "Client"),
    "flowlane.runtime.config": ("WorkerConfig",),
    "flowlane.runtime.context": ("TaskContext",),
    "flowlane.runtime.worker": ("Worker",),
})
