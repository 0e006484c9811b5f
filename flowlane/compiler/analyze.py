"""Semantic checks across documents, producing the validated :class:`Project`.

Each kind of document has its module of checks in ``checks/`` (flows, aliases, workers,
schedules, triggers, webhooks, queues; failure handlers and child flows across flows); they
share what the project declares through ``checks.shared.Analysis``. This module runs them in
order: a check of one kind may read what the checks before it built (a worker reads the flows
and aliases, a schedule the flow it starts).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from flowlane.compiler import codes, schema
from flowlane.compiler.checks import (
    aliases,
    children,
    failures,
    flows,
    namespace,
    queues,
    routing,
    schedules,
    triggers,
    webhooks,
    workers,
)
from flowlane.compiler.checks.flows import HANDLER_OPTIONS
from flowlane.compiler.checks.shared import Analysis, Entry
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.loader import Document
from flowlane.compiler.model import Project

__all__ = ["HANDLER_OPTIONS", "analyze"]  # HANDLER_OPTIONS (checks/flows.py) stays importable from here


def analyze(documents: Iterable[Document], *, complete: bool = True
            ) -> tuple[Project | None, list[Diagnostic]]:
    """Schema and semantic checks of every document; a Project only when nothing is wrong.

    ``complete=False`` says some file failed to load: references to unknown flows are
    then not reported (they are most likely declared in the broken file).
    """
    state = Analysis(complete=complete)
    of_kind = _by_kind(_schema_valid(documents, state))
    namespace.namespace(of_kind["flow"], of_kind["alias"], state)
    for entry in of_kind["flow"]:
        if state.flow_entries.get(entry.slug) is entry:
            flows.build_flow(entry, state)
    routing.ownership(state)
    for entry in of_kind["alias"]:
        aliases.build_alias(entry, state)
    children.child_flows(state)
    failures.failure_handlers(state)
    workers.build_workers(of_kind["worker"], state)
    built = schedules.build_schedules(of_kind["schedule"], state)
    limits = queues.build_queue_limits(of_kind["queue"], state)
    built_triggers = triggers.build_triggers(of_kind["trigger"], state)
    built_webhooks = webhooks.build_webhooks(of_kind["webhook"], state)
    if state.findings:
        return None, state.findings
    project = Project(
        flows=tuple(state.flows.values()),
        aliases=tuple(state.aliases.values()),
        workers=tuple(state.workers),
        schedules=tuple(built),
        queue_limits=tuple(limits),
        triggers=tuple(built_triggers),
        webhooks=tuple(built_webhooks),
    )
    return project, []


def _by_kind(entries: list[Entry]) -> defaultdict[str, list[Entry]]:
    """The schema-valid documents of each kind, in the order they were read."""
    found: defaultdict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        found[entry.data["kind"]].append(entry)
    return found


def _kinds() -> str:
    first, *others = schema.published()["$defs"]["kind"]["enum"]
    return f"`kind: {first}`, " + ", ".join(f"`{kind}`" for kind in others[:-1]) + f" or `{others[-1]}`"


def _schema_valid(documents: Iterable[Document], state: Analysis) -> list[Entry]:
    entries = []
    for doc in documents:
        if not isinstance(doc.data, dict):
            what = "empty" if doc.data is None else f"not a mapping ({type(doc.data).__name__})"
            state.findings.append(doc.diagnostic(
                (), codes.NOT_A_MAPPING, f"YAML document {doc.index + 1} is {what}",
                f"each document must be a mapping with {_kinds()}"))
            continue
        problems = schema.validate_document(doc)
        if problems and isinstance(doc.data.get("slug"), str):
            state.declared.add(doc.data["slug"])
        state.findings.extend(problems)
        if not problems:
            entries.append(Entry(doc, doc.data))
        elif doc.data.get("kind") == "flow":
            state.findings.extend(_partial_findings(doc, state.complete))
    return entries


def _partial_findings(doc: Document, complete: bool) -> list[Diagnostic]:
    """The flow-local semantic findings of a document that also has schema errors."""
    repaired = schema.repaired_flow(doc.data)
    if repaired is None:
        return []
    scratch = Analysis(complete=complete)
    flows.FlowChecker(Entry(doc, repaired.data), scratch, repaired.placeholders).run()
    return scratch.findings
