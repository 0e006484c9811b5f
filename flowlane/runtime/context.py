"""What a handler gets besides its input."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class TaskContext:
    """``def handler(input, ctx)``: identity of the task and the worker's shutdown signal.

    ``shutdown`` is set when the worker begins a graceful stop; long handlers
    may poll ``ctx.shutdown.is_set()`` (or ``ctx.shutdown.wait(seconds)``; in an
    ``async def`` handler ``await ctx.wait_shutdown(seconds)``) and return early.
    ``attempt`` is 1 on the first execution. ``deadline``: when the run has to be
    finished (the flow's ``deadline`` option), None without one; a long handler may stop
    early rather than produce a result the run can no longer take.
    """

    run_id: str
    flow_slug: str
    step_slug: str
    task_index: int
    attempt: int
    flow_input: Any
    queue_name: str
    msg_id: int
    worker_id: str
    shutdown: threading.Event = field(repr=False)
    log: logging.LoggerAdapter[logging.Logger] = field(repr=False)
    deadline: datetime | None = None

    @property
    def shutting_down(self) -> bool:
        return self.shutdown.is_set()

    async def wait_shutdown(self, timeout: float | None = None) -> bool:
        """For ``async def`` handlers: wait until the worker stops (True) or ``timeout`` (False)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.shutdown.is_set():
            if deadline is not None and loop.time() >= deadline:
                return False
            remaining = 0.05 if deadline is None else min(0.05, deadline - loop.time())
            await asyncio.sleep(max(0.0, remaining))
        return True
