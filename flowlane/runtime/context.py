"""What a handler gets besides its input."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskContext:
    """``def handler(input, ctx)``: identity of the task and the worker's shutdown signal.

    ``shutdown`` is set when the worker begins a graceful stop; long handlers
    may poll ``ctx.shutdown.is_set()`` (or ``ctx.shutdown.wait(seconds)``) and
    return early. ``attempt`` is 1 on the first execution.
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

    @property
    def shutting_down(self) -> bool:
        return self.shutdown.is_set()
