"""Handlers of ``examples/events/orders.yaml`` and ``webhooks.yaml`` (they only shape data: a
real one would call the payment provider in ``charge`` and send mail in ``receipt``)."""

from __future__ import annotations

from typing import Any


def charge(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"charged": True, "order_id": input["order_id"]}


def receipt(input: Any, ctx: Any = None) -> dict[str, Any]:
    return {"sent_to_customer": True, "order_id": input["charge"]["order_id"]}


def payment_receipt(input: Any, ctx: Any = None) -> dict[str, Any]:
    """``examples/events/webhooks.yaml``: the signal's payload is the output of its wait step."""
    return {"sent_to_customer": True, "amount_cents": input["paid"]["amount_cents"]}
