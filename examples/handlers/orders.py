"""Handlers of ``examples/events/orders.yaml`` (they only shape data: a real one would call
the payment provider in ``charge`` and send mail in ``receipt``)."""

from __future__ import annotations

from typing import Any


def charge(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"charged": True, "order_id": input["order_id"]}


def receipt(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"sent_to_customer": True, "order_id": input["charge"]["order_id"]}
