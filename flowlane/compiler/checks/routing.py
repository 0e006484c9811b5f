"""Queues across flows: a flow's own queues are its alone."""

from __future__ import annotations

from flowlane.compiler import codes
from flowlane.compiler.checks.shared import Analysis


def ownership(state: Analysis) -> None:
    """A queue owned by one flow is never used by another flow nor declared shared."""
    for flow in state.flows.values():
        for queue in flow.owned_queues:
            owner = state.owners.setdefault(queue, flow.slug)
            if owner != flow.slug:
                entry = state.flow_entries[flow.slug]
                state.findings.append(entry.doc.diagnostic(
                    ("slug",), codes.QUEUE_OWNED_ELSEWHERE,
                    f"queue `{queue}` of flow `{flow.slug}` is already owned by flow `{owner}`",
                    "rename the flow or use explicit queues"))
    for flow in state.flows.values():
        if flow.queue_mode != "explicit":
            continue
        entry = state.flow_entries[flow.slug]
        for step in flow.steps:
            holder = None if step.queue is None else state.owners.get(step.queue)
            if holder is not None:
                state.findings.append(entry.doc.diagnostic(
                    ("queues", step.slug), codes.QUEUE_OWNED_ELSEWHERE,
                    f"queue `{step.queue}` is owned by flow `{holder}` and cannot be shared",
                    "choose another name for the shared queue; a flow's own queues are private"))
