"""Handlers for the benchmarks: no work, just the wall-clock time the handler started."""

from __future__ import annotations

import time
from typing import Any


def stamp(input: Any, ctx: Any) -> dict[str, float]:
    return {"t": time.time()}
