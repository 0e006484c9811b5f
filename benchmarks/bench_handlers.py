"""Handlers for the benchmarks: no real work."""

from __future__ import annotations

import time
from typing import Any


def stamp(input: Any, ctx: Any) -> dict[str, float]:
    return {"t": time.time()}


def split(input: Any, ctx: Any) -> list[int]:
    return list(range(int(ctx.flow_input.get("width", 10))))


def square(n: int, ctx: Any) -> int:
    return n * n


def meta(input: Any, ctx: Any) -> dict[str, int]:
    return {"count": len(input["split"])}


def total(input: Any, ctx: Any) -> dict[str, int]:
    return {"sum": sum(input["square"]), "count": input["meta"]["count"]}


def sleep_1ms(input: Any, ctx: Any) -> dict[str, float]:
    time.sleep(0.001)
    return {"t": time.time()}
