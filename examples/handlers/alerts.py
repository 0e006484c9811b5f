"""Handlers of ``examples/flow_control/slack_alerts.yaml`` (they only shape text: a real one
would post to Slack in ``deliver``)."""

from __future__ import annotations

from typing import Any


def render(input: Any, ctx: Any = None) -> dict[str, str]:
    customer = input.get("customer_id", "?") if isinstance(input, dict) else "?"
    return {"text": f"alert for customer {customer}"}


def deliver(input: Any, ctx: Any = None) -> dict[str, Any]:
    rendered = input.get("render", {}) if isinstance(input, dict) else {}
    return {"posted": True, "text": rendered.get("text", "digest")}
