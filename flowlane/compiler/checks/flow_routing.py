"""Where a flow routes its steps: its own queue, one queue per step, or an explicit mapping."""

from __future__ import annotations

from typing import cast

from flowlane.compiler import codes, names
from flowlane.compiler.checks.flow_document import FlowDocument


def queues_of(flow: FlowDocument, order: list[str]) -> dict[str, str] | None:
    """The queue of every step that has one (a wait step has none)."""
    routing = flow.entry.data.get("queues", "flow")
    if routing == "flow":
        return _flow_routing(flow, order)
    if routing == "per-step":
        return _per_step_routing(flow, order)
    return _explicit_routing(flow, cast(dict[str, str], routing))


def _flow_routing(flow: FlowDocument, order: list[str]) -> dict[str, str] | None:
    queue = flow.slug.lower()
    if len(queue) > names.QUEUE_MAX:
        flow.error(("slug",), codes.FLOW_QUEUE_UNNAMEABLE,
                   f"flow `{flow.slug}` routes to its own queue `{queue[:20]}...`, which is "
                   f"{len(queue)} characters long; the PGMQ limit is {names.QUEUE_MAX}",
                   f"shorten the slug to {names.QUEUE_MAX} characters or route with an "
                   "explicit `queues:` mapping")
        return None
    waits = flow.waits()
    return dict.fromkeys((s for s in order if s not in waits), queue)


def _per_step_routing(flow: FlowDocument, order: list[str]) -> dict[str, str] | None:
    routes: dict[str, str] = {}
    waits = flow.waits()
    for index, step in enumerate(order):
        if step in waits:
            continue
        queue = names.per_step_queue(flow.slug, step, index)
        if queue is None:
            flow.error(("steps", step), codes.PER_STEP_QUEUE_UNNAMEABLE,
                       f"per-step queue of step `{step}` cannot be named: both "
                       f"`{flow.slug.lower()}__{step.lower()}` and "
                       f"`{flow.slug.lower()}__{index}` exceed {names.QUEUE_MAX} characters",
                       "shorten the flow slug or route with an explicit `queues:` mapping",
                       key=True)
        else:
            routes[step] = queue
    return routes if len(routes) == len(order) - len(waits) else None


def _explicit_routing(flow: FlowDocument, routing: dict[str, str]) -> dict[str, str] | None:
    before = flow.errors
    waits = flow.waits()
    for step in routing:
        if step in waits:
            kind = "wait" if flow.steps[step].get("type") == "wait" else "child-flow"
            flow.error(("queues", step), codes.ROUTING_NAMES_QUEUELESS_STEP,
                       f"`queues` routes {kind} step `{step}`, which has no queue",
                       "remove this entry: a signal completes a wait step, a child run a "
                       "child-flow step; no worker serves either", key=True)
        elif step not in flow.steps:
            close = flow.step_names.closest(step)
            help = f"did you mean `{close}`?" if close else "remove this entry"
            flow.error(("queues", step), codes.ROUTING_NAMES_UNKNOWN_STEP,
                       f"`queues` routes unknown step `{step}`", help, key=True)
    queues_line = flow.doc.key_at(("queues",)).line
    for step in flow.steps:
        if step not in routing and step not in waits:
            flow.error(("steps", step), codes.ROUTING_MISSES_STEP,
                       f"step `{step}` has no entry in the explicit `queues` mapping "
                       f"(line {queues_line})",
                       f"add `{step}: <queue>` under `queues:`; an explicit mapping must "
                       "route every step", key=True)
    return dict(routing) if flow.errors == before else None
