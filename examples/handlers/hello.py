"""Handlers of ``flows/hello_world.yaml``."""

from __future__ import annotations

from typing import Any


def greet(input: Any, ctx: Any = None) -> dict[str, str]:
    name = input.get("name", "world") if isinstance(input, dict) else "world"
    return {"greeting": f"Hello, {name}!"}
