"""OpenTelemetry traces, with the optional extra ``flowlane[otel]``.

A run remembers the W3C trace context it was started in (``runs.trace_parent``, from the
transaction's ``flowlane.traceparent`` setting). A worker whose process has an OpenTelemetry
SDK configured makes a span per task attempt whose parent is that context; map tasks also
link to it (``flowlane.map_index``). A run started outside any trace has a context of its own,
derived from its id (:func:`run_trace_parent`), so its tasks' spans still make one trace.
Without the package, or without a configured SDK, nothing is imported per task and nothing
is asked of the database.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import uuid
from typing import Any

from flowlane.runtime.tasks import ClaimedTask, TaskResult

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def current_traceparent() -> str | None:
    """The caller's trace context as a W3C traceparent: the current OpenTelemetry span when
    the application uses OpenTelemetry, else ``$TRACEPARENT`` (how a shell or a CI job hands
    its trace to a command); None outside a trace. Never imports OpenTelemetry itself."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is not None:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    given = os.environ.get("TRACEPARENT", "").strip().lower()
    return given if _TRACEPARENT.fullmatch(given) else None


def run_trace_parent(run_id: str) -> str:
    """The trace context of a run started outside any trace, the same in every worker: the
    trace id is the run id (so a run's trace is found by its id), the parent span id is
    derived from it (no span of that id is ever exported: the tasks' spans are the trace's
    top), and it is sampled, so the run's tasks make one trace whoever runs them."""
    span_id = hashlib.sha256(run_id.encode()).hexdigest()[:16]
    return f"00-{uuid.UUID(run_id).hex}-{span_id}-01"


class Tracing:
    """Spans of task attempts, for a worker whose process configured an SDK."""

    def __init__(self, trace: Any, propagator: Any) -> None:
        self._trace = trace
        self._propagator = propagator
        self._tracer = trace.get_tracer("flowlane.worker")

    @classmethod
    def configured(cls) -> Tracing | None:
        """Tracing when OpenTelemetry is installed and a tracer provider is set (by a handler
        module or the application's startup), else None."""
        if importlib.util.find_spec("opentelemetry") is None:
            return None
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None
        return cls(trace, TraceContextTextMapPropagator())

    def start(self, task: ClaimedTask, trace_parent: str | None, is_map: bool) -> Any:
        """The attempt's span, started (``finish`` ends it): a child of the context the run
        was started in, else of the run's own (:func:`run_trace_parent`)."""
        parent = self._propagator.extract({"traceparent": trace_parent or run_trace_parent(task.run_id)})
        links = []
        if is_map and trace_parent:
            linked = self._trace.get_current_span(parent).get_span_context()
            links.append(self._trace.Link(linked, {"flowlane.map_index": task.task_index}))
        return self._tracer.start_span(
            f"{task.flow_slug}.{task.step_slug}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "flowlane.flow": task.flow_slug,
                "flowlane.step": task.step_slug,
                "flowlane.run_id": task.run_id,
                "flowlane.task_index": task.task_index,
                "flowlane.attempt": task.attempt,
                "messaging.destination.name": task.queue_name,
            },
        )

    def finish(self, span: Any, result: TaskResult) -> None:
        span.set_attribute("flowlane.outcome", "completed" if result.ok else "failed")
        if not result.ok:
            span.add_event("exception", {
                "exception.type": result.error_type or "Error",
                "exception.message": result.error or "",
                "exception.stacktrace": result.traceback or "",
            })
            status = self._trace.Status(self._trace.StatusCode.ERROR, result.error or "")
            span.set_status(status)
        span.end()
