"""The Python worker runtime and client: run handlers for a queue, start and inspect runs."""

from __future__ import annotations

from flowlane.runtime.client import Client
from flowlane.runtime.context import TaskContext
from flowlane.runtime.worker import Worker

__all__ = ["Client", "TaskContext", "Worker"]
