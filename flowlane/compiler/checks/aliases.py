"""Alias documents: names for a flow's versions."""

from __future__ import annotations

from flowlane.compiler import codes
from flowlane.compiler.checks.shared import Analysis, Entry, report_unknown
from flowlane.compiler.model import Alias


def build_alias(entry: Entry, state: Analysis) -> None:
    data = entry.data
    draining: list[str] = list(data.get("draining", []))
    targets = [(("active",), data["active"])] + [
        (("draining", i), slug) for i, slug in enumerate(draining)
    ]
    problems = 0
    seen: set[str] = set()
    for path, slug in targets:
        if slug in seen:
            problems += 1
            state.findings.append(entry.doc.diagnostic(
                path, codes.ALIAS_LISTS_FLOW_TWICE, f"alias `{entry.slug}` lists `{slug}` twice",
                "a version is either active or draining, once"))
            continue
        seen.add(slug)
        if slug not in state.known_flows:
            problems += 1
            report_unknown(entry, path, slug, state, codes.ALIAS_UNKNOWN_FLOW)
        elif slug not in state.flows:
            problems += 1  # that flow has errors of its own, reported there
    if problems == 0:
        state.aliases[entry.slug] = Alias(
            slug=entry.slug, active=data["active"], draining=tuple(draining),
            description=data.get("description"), location=entry.loc(),
        )
