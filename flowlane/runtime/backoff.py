"""Exponential backoff with jitter for reconnecting to the database."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, first: float = 0.1, maximum: float = 5.0) -> None:
        self.first = first
        self.maximum = maximum
        self._current = first

    def next(self) -> float:
        delay = self._current
        self._current = min(self.maximum, self._current * 2)
        return delay * random.uniform(0.75, 1.25)

    def reset(self) -> None:
        self._current = self.first
