"""Handlers of ``flows/diamond.yaml``: a map fan-out, a fan-in and a conditional step."""

from __future__ import annotations

from typing import Any


def split(input: Any, ctx: Any = None) -> list[int]:
    return [int(n) for n in input.get("numbers", [])]


def square(item: Any, ctx: Any = None) -> int:
    return int(item) * int(item)


def describe(input: Any, ctx: Any = None) -> dict[str, int]:
    return {"count": len(input["split"])}


def total(input: Any, ctx: Any = None) -> dict[str, Any]:
    value = sum(input["square"])
    return {"total": value, "count": input["describe"]["count"], "notify": value > 100}


def notify(input: Any, ctx: Any = None) -> dict[str, str]:
    return {"message": f"total is {input['total']['total']}"}
