"""The handlers of the example shop, whose flows tests/ runs with flowlane's pytest plugin."""

from __future__ import annotations

from typing import Any


def validate(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    if input["price"] < 0:
        raise ValueError(f"a price is never negative, got {input['price']}")
    return {"order": input["order"]}


def lines(input: dict[str, Any], ctx: Any) -> list[int]:
    return list(range(1, 11))


def price(line: int, ctx: Any) -> int:
    return line * 10


def total(input: dict[str, Any], ctx: Any) -> int:
    return sum(input["price"])


def ship(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"shipped": input["total"]}


def request(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"asked": input["who"]}


def notify(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"approved_by": input["approve"]["by"]}


def offer(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"amount": 100}


def build_report(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"built": True}
