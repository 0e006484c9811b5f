"""Handlers of the failure-handler and compensation example (examples/failure_handler/orders.yaml)."""

from __future__ import annotations

from typing import Any


def reserve(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"reservation": f"R-{input['order_id']}", "items": input.get("items", [])}


def charge(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"payment": f"P-{ctx.flow_input['order_id']}", "amount": ctx.flow_input.get("amount", 0)}


def ship(input: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"tracking": f"T-{ctx.flow_input['order_id']}"}


def release(undo: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """A compensation: ``undo`` holds the failed run's id and flow, the step, and the step's
    input and output."""
    return {"released": undo["output"]["reservation"]}


def refund(undo: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"refunded": undo["output"]["payment"], "amount": undo["output"]["amount"]}


def notify(failure: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The failure handler: ``failure`` holds the failed run's id, flow, status, error, failed
    step and its error, the completed steps' outputs and the run's input."""
    order = failure["input"].get("order_id")
    ctx.log.info("order %s %s at %s: %s", order, failure["status"], failure["failed_step"], failure["error"])
    return {"told": order, "completed": sorted(failure["outputs"])}
