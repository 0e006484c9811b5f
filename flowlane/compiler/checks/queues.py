"""Queue documents: limits of the queues that steps are routed to."""

from __future__ import annotations

from flowlane.compiler import codes, durations
from flowlane.compiler.checks.shared import Analysis, Entry, closest, listing, named_once, opt_int
from flowlane.compiler.model import QueueLimits

RATE_PER_MAX = 86400  # the longest rate limit window: one day


def build_queue_limits(entries: list[Entry], state: Analysis) -> list[QueueLimits]:
    """Each queue declared once (FL182), with a limit or its archive (FL186), a window in range
    (FL016), routed to by some step (FL183: a misspelt name would limit nothing)."""
    declared_by: dict[str, Entry] = {}

    def build(entry: Entry, state: Analysis) -> QueueLimits | None:
        limits = _build_queue_limit(entry, state)
        if limits is not None:
            declared_by.setdefault(limits.name, entry)  # the first one built is the one kept
        return limits

    built = named_once(entries, state, build, codes.DUPLICATE_QUEUE, "queue `{name}` is already declared",
                       "declare each queue's limits in one `kind: queue` document")
    _unrouted_queues(declared_by, state)
    return built


def _build_queue_limit(entry: Entry, state: Analysis) -> QueueLimits | None:
    data = entry.data
    rate = data.get("rate_limit")
    if "concurrency" not in data and rate is None and "archive" not in data:
        state.findings.append(entry.doc.diagnostic(
            ("name",), codes.QUEUE_WITHOUT_LIMIT, f"queue `{data['name']}` declares no limit",
            "add `concurrency: N` and/or `rate_limit: {limit: N, per: 1s}`, or delete the "
            "document (a queue without one has no limits)"))
        return None
    per = None if rate is None else durations.to_seconds(rate["per"])
    if per is not None and not 1 <= per <= RATE_PER_MAX:  # the schema checks the integer form
        state.findings.append(entry.doc.diagnostic(
            ("rate_limit", "per"), codes.DURATION_OUT_OF_RANGE,
            f"`per` is {per} seconds; it must be at least 1 and at most {RATE_PER_MAX} seconds",
            "for example: 1s"))
        return None
    return QueueLimits(
        name=str(data["name"]), concurrency=opt_int(data, "concurrency"),
        rate_limit=None if rate is None else int(rate["limit"]), rate_per=per,
        archive=bool(data.get("archive", True)), description=data.get("description"),
        location=entry.loc(("name",)),
    )


def _unrouted_queues(declared: dict[str, Entry], state: Analysis) -> None:
    """Only when every flow was built: a flow with errors may route to the queue."""
    if not state.complete or set(state.flows) != state.known_flows or state.declared:
        return
    routed = sorted({q for flow in state.flows.values() for q in flow.queues})
    for name, entry in declared.items():
        if name in routed:
            continue
        close = closest(name, routed)
        help = (f"did you mean `{close}`?" if close else
                "steps are routed to " + (listing(routed) if routed else "no queue"))
        state.findings.append(entry.doc.diagnostic(
            ("name",), codes.QUEUE_NOT_ROUTED,
            f"no step is routed to queue `{name}`: its limits would hold nothing back", help))
