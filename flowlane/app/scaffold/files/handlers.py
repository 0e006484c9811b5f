"""Step handlers: `def handler(input, ctx)` (or `async def`); the return value is the output."""

from __future__ import annotations

from typing import Any


def greet(input: dict[str, Any], ctx: Any) -> dict[str, str]:
    return {"greeting": f"Hello, {input.get('name', 'world')}!"}
