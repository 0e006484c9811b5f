"""Handlers of the failure-handler example (examples/failure_handler/orders.yaml)."""

from __future__ import annotations

from typing import Any


def reserve(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"reservation": f"R-{input['order_id']}", "items": input.get("items", [])}


def charge(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"payment": f"P-{ctx.flow_input['order_id']}", "amount": ctx.flow_input.get("amount", 0)}


def ship(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"tracking": f"T-{ctx.flow_input['order_id']}"}


def release(failure: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The failure handler: ``failure`` holds the failed run's id, flow, status, error, failed
    step and its error, the completed steps' outputs and the run's input."""
    done = failure["outputs"]
    undone = []
    if "charge" in done:
        undone.append(f"refunded {done['charge']['payment']}")
    if "reserve" in done:
        undone.append(f"released {done['reserve']['reservation']}")
    ctx.log.info("order %s %s at %s: %s", failure["input"].get("order_id"), failure["status"],
                 failure["failed_step"], failure["error"])
    return {"undone": undone}
