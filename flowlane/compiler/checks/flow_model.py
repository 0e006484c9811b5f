"""The model of a flow document that passed its checks: what the compiler renders."""

from __future__ import annotations

from typing import Any, cast

from flowlane import defaults
from flowlane.compiler import caching, durations
from flowlane.compiler.checks.flow_contracts import FlowContracts
from flowlane.compiler.checks.flow_document import FlowDocument
from flowlane.compiler.checks.shared import opt_int, opt_seconds
from flowlane.compiler.model import Concurrency, Debounce, Flow, QueueMode, Step


def flow_model(flow: FlowDocument, contracts: FlowContracts, order: list[str],
               needs: dict[str, list[str]], queues: dict[str, str]) -> Flow:
    """The model of a flow document that passed its checks."""
    steps = tuple(_step(flow, contracts, i, slug, needs[slug], queues.get(slug))
                  for i, slug in enumerate(order))
    routing = flow.entry.data.get("queues", "flow")
    mode = cast(QueueMode, routing if isinstance(routing, str) else "explicit")
    options = flow.entry.data.get("defaults", {})
    return Flow(
        slug=flow.slug,
        queue_mode=mode,
        steps=steps,
        max_attempts=int(options.get("max_attempts", defaults.MAX_ATTEMPTS)),
        base_delay=durations.to_seconds(options.get("base_delay", defaults.BASE_DELAY)),
        timeout=durations.to_seconds(options.get("timeout", defaults.TIMEOUT)),
        retention=_retention(flow),
        deadline=opt_seconds(options, "deadline"),
        dedup_key=flow.entry.data.get("dedup", {}).get("key"),
        concurrency=_concurrency(flow.entry.data),
        priority=opt_int(flow.entry.data, "priority"),
        debounce=_debounce(flow.entry.data),
        on_failure=flow.entry.data.get("on_failure", {}).get("flow"),
        on_failure_on_cancel=bool(flow.entry.data.get("on_failure", {}).get("on_cancel", False)),
        description=flow.entry.data.get("description"),
        input_schema=contracts.input_contract.schema if contracts.input_contract else None,
        location=flow.entry.loc(),
    )

def _retention(flow: FlowDocument) -> int | None:
    value = flow.entry.data.get("retention", defaults.RETENTION)
    return None if value == "forever" else durations.to_seconds(value)

def _step(flow: FlowDocument, contracts: FlowContracts, index: int, slug: str, needs: list[str],
          queue: str | None) -> Step:
    spec = flow.steps[slug]
    get = spec.get
    contract = contracts.output_contracts.get(slug)
    return Step(
        slug=slug,
        index=index,
        handler=get("handler"),
        queue=queue,
        needs=tuple(needs),
        type=get("type", "single"),
        condition_if=get("if"),
        condition_unless=get("unless"),
        when_unmet=get("when_unmet", "skip"),
        when_exhausted=get("when_exhausted", "fail"),
        max_attempts=opt_int(spec, "max_attempts"),
        base_delay=opt_seconds(spec, "base_delay"),
        timeout=opt_seconds(spec, "timeout"),
        start_delay=opt_seconds(spec, "start_delay"),
        description=get("description"),
        output_schema=None if contract is None else contract.schema,
        flow=get("flow"),
        concurrency=_concurrency(spec),
        compensate=get("compensate", {}).get("flow"),
        cache=caching.step_cache(spec),
        location=flow.entry.loc(("steps", slug), key=True),
        handler_location=(flow.entry.loc(("steps", slug, "handler"))
                          if "handler" in spec else None),
    )


def _concurrency(spec: dict[str, Any]) -> Concurrency | None:
    value = spec.get("concurrency")
    return None if value is None else Concurrency(int(value["limit"]), value.get("key"),
                                                  value.get("when_full", "queue"))


def _debounce(spec: dict[str, Any]) -> Debounce | None:
    value = spec.get("debounce")
    if value is None:
        return None
    return Debounce(durations.to_seconds(value["period"]), value.get("key"), opt_seconds(value, "max_wait"))
