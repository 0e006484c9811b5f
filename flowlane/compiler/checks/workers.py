"""Worker documents, and the coverage of every routed step by a worker."""

from __future__ import annotations

from flowlane import defaults
from flowlane.compiler import codes
from flowlane.compiler.checks.shared import Analysis, Entry, listing, report_unknown
from flowlane.compiler.model import WorkerDoc


def build_workers(entries: list[Entry], state: Analysis) -> None:
    names_seen: dict[str, Entry] = {}
    for entry in entries:
        worker = _build_worker(entry, state)
        if worker is None:
            continue
        other = names_seen.setdefault(worker.name, entry)
        if other is not entry:
            state.findings.append(entry.doc.diagnostic(
                ("name",) if "name" in entry.data else ("queue",), codes.DUPLICATE_WORKER,
                f"worker name `{worker.name}` is already used at {other.loc(('queue',))}",
                "give each worker document a distinct `name`"))
            continue
        state.workers.append(worker)
    _coverage(state)


def _build_worker(entry: Entry, state: Analysis) -> WorkerDoc | None:
    data = entry.data
    queue: str = data["queue"]
    problems = 0
    for i, name in enumerate(data["flows"]):
        path = ("flows", i)
        if name in state.aliases:
            versions = [state.flows[s] for s in state.aliases[name].versions]
        elif name in state.flows:
            versions = [state.flows[name]]
        else:
            if name not in state.known_flows and name not in state.known_aliases:
                problems += 1
                report_unknown(entry, path, name, state, codes.WORKER_UNKNOWN_FLOW)
            continue
        if not any(f.steps_on(queue) for f in versions):
            problems += 1
            routed = sorted({q for f in versions for q in f.queues})
            state.findings.append(entry.doc.diagnostic(
                path, codes.WORKER_FLOW_NOT_ROUTED, f"`{name}` routes no step to queue `{queue}`",
                "it routes to " + listing(routed) +
                "; remove it from `flows` or route a step to this queue"))
    if problems:
        return None
    return WorkerDoc(
        name=str(data.get("name") or queue), queue=queue, flows=tuple(data["flows"]),
        max_concurrent=int(data.get("max_concurrent", defaults.MAX_CONCURRENT)),
        batch_size=int(data.get("batch_size", defaults.BATCH_SIZE)),
        description=data.get("description"), location=entry.loc(("queue",)),
    )


def _coverage(state: Analysis) -> None:
    """Where worker documents exist for a queue, every routed pair needs a worker."""
    covered: dict[str, set[tuple[str, str]]] = {}
    for worker in state.workers:
        pairs = covered.setdefault(worker.queue, set())
        for name in worker.flows:
            versions = (state.aliases[name].versions if name in state.aliases else (name,))
            for slug in versions:
                flow = state.flows.get(slug)
                if flow is not None:
                    pairs.update((slug, s.slug) for s in flow.steps_on(worker.queue))
    for flow in state.flows.values():
        entry = state.flow_entries[flow.slug]
        for step in flow.steps:
            routed = None if step.queue is None else covered.get(step.queue)
            if routed is None or (flow.slug, step.slug) in routed:
                continue
            path = ("queues", step.slug) if flow.queue_mode == "explicit" else ("steps", step.slug)
            workers = listing([w.name for w in state.workers if w.queue == step.queue])
            state.findings.append(entry.doc.diagnostic(
                path, codes.STEP_WITHOUT_WORKER,
                f"step `{step.slug}` of flow `{flow.slug}` is routed to queue `{step.queue}`, "
                "but no worker document for that queue lists this flow",
                f"add `{flow.slug}` (or an alias with it as active or draining version) to "
                f"`flows` of worker {workers}; otherwise its tasks would wait forever",
                key=flow.queue_mode != "explicit"))
