"""Exponential backoff with jitter for reconnecting to the database."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from flowlane.runtime import log
from flowlane.runtime.tasks import describe

JITTER = (0.75, 1.25)  # each delay is multiplied by a random factor in this range


class Backoff:
    """Delays from ``first`` doubling up to ``maximum``, each jittered so that workers that
    lost the database together do not retry in step; ``uniform`` draws the jitter factor."""

    def __init__(
        self,
        first: float = 0.1,
        maximum: float = 5.0,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.first = first
        self.maximum = maximum
        self._uniform = uniform
        self._current = first

    def next(self) -> float:
        delay = self._current
        self._current = min(self.maximum, self._current * 2)
        return delay * self._uniform(*JITTER)

    def reset(self) -> None:
        self._current = self.first

    async def retry_later(
        self,
        component: str,
        exc: BaseException,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        **fields: Any,
    ) -> None:
        """Log ``database_unavailable`` for ``component``, then wait the next delay
        (with ``sleep``, e.g. a pause that ends early on stop; default ``asyncio.sleep``)."""
        delay = self.next()
        log.event(
            logging.WARNING,
            "database_unavailable",
            component=component,
            error=describe(exc),
            **fields,
            retry_in=f"{delay:.2f}s",
        )
        await (sleep or asyncio.sleep)(delay)
