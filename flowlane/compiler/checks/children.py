"""Child flows: steps that start a run of another flow of the project."""

from __future__ import annotations

from flowlane.compiler import codes
from flowlane.compiler.checks.shared import Analysis, report_unknown


def child_flows(state: Analysis) -> None:
    """Every child flow is a flow or alias of the project (FL140), and no flow can start
    itself through children, directly or not (FL141)."""
    edges: dict[str, list[tuple[str, str]]] = {}  # flow -> (step, concrete child flow)
    for flow in state.flows.values():
        entry = state.flow_entries[flow.slug]
        for step in flow.steps:
            if step.flow is None:
                continue
            if step.flow in state.aliases:
                targets = list(state.aliases[step.flow].versions)
            elif step.flow in state.flows:
                targets = [step.flow]
            else:
                if step.flow not in state.known_flows and step.flow not in state.known_aliases:
                    report_unknown(entry, ("steps", step.slug, "flow"), step.flow, state,
                                   codes.CHILD_FLOW_UNKNOWN)
                continue
            edges.setdefault(flow.slug, []).extend((step.slug, t) for t in targets)
    for cycle in _cycles(edges):
        first_flow, first_step = cycle[0]
        path = " -> ".join(f"{f} (step {s})" for f, s in cycle) + f" -> {first_flow}"
        state.findings.append(state.flow_entries[first_flow].doc.diagnostic(
            ("steps", first_step, "flow"), codes.CHILD_FLOW_CYCLE,
            f"flow `{first_flow}` can start itself through child flows: {path}",
            "a child flow may not start its ancestors; break the cycle (or do the repeated "
            "work in a map step)"))


def _cycles(edges: dict[str, list[tuple[str, str]]]) -> list[list[tuple[str, str]]]:
    """One cycle of (flow, step) per strongly connected group, found by depth-first search
    from each flow in order; each reported once, from its first flow in name order."""
    found: list[list[tuple[str, str]]] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(edges):
        stack: list[tuple[str, str]] = []

        def walk(flow: str, visiting: set[str], start: str = start,
                 stack: list[tuple[str, str]] = stack) -> list[tuple[str, str]] | None:
            for step, child in edges.get(flow, []):
                stack.append((flow, step))
                if child == start:
                    return list(stack)
                if child not in visiting and child > start:
                    visiting.add(child)
                    cycle = walk(child, visiting)
                    if cycle:
                        return cycle
                stack.pop()
            return None

        cycle = walk(start, {start})
        if cycle and frozenset(f for f, _ in cycle) not in seen:
            seen.add(frozenset(f for f, _ in cycle))
            found.append(cycle)
    return found
