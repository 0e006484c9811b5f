"""What every check may read and write of the project: the documents (``Entry``), the
findings and the flows, aliases and names found so far (``Analysis``), and the project-wide
answers the checks of several document kinds share (is a name a flow of this project, which
flow a document starts, the names to suggest for a misspelt one)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flowlane.compiler import codes, durations
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.loader import Document
from flowlane.compiler.model import Alias, Flow, Location, QueueLimits, Schedule, Trigger, Webhook, WorkerDoc


@dataclass
class Entry:
    """A schema-valid document waiting for semantic checks."""

    doc: Document
    data: dict[str, Any]

    @property
    def slug(self) -> str:
        return str(self.data.get("slug") or self.data.get("name") or self.data["queue"])

    def loc(self, path: tuple[str | int, ...] = ("slug",), *, key: bool = False) -> Location:
        line, col = self.doc.line_col(path, key=key)
        return Location(self.doc.path, line, col)


@dataclass
class Analysis:
    """Findings plus the model parts that passed their checks."""

    findings: list[Diagnostic] = field(default_factory=list)
    flows: dict[str, Flow] = field(default_factory=dict)
    flow_entries: dict[str, Entry] = field(default_factory=dict)
    known_flows: set[str] = field(default_factory=set)
    known_aliases: set[str] = field(default_factory=set)
    declared: set[str] = field(default_factory=set)  # slugs of schema-invalid documents
    complete: bool = True  # False when some file could not be read or parsed
    aliases: dict[str, Alias] = field(default_factory=dict)
    workers: list[WorkerDoc] = field(default_factory=list)
    owners: dict[str, str] = field(default_factory=dict)


def report_unknown(entry: Entry, path: tuple[str | int, ...], slug: str, state: Analysis,
                   code: str) -> None:
    """An unknown name, unless it is declared by a document with errors of its own."""
    if state.complete and slug not in state.declared:
        state.findings.append(_unknown_flow(entry, path, slug, state, code))


def _unknown_flow(entry: Entry, path: tuple[str | int, ...], slug: str, state: Analysis,
                  code: str) -> Diagnostic:
    if slug in state.known_aliases and code == codes.ALIAS_UNKNOWN_FLOW:
        return entry.doc.diagnostic(path, code, f"`{slug}` is an alias, not a concrete flow",
                                    "an alias points at concrete flow slugs only")
    with_aliases = code in (codes.WORKER_UNKNOWN_FLOW, codes.CHILD_FLOW_UNKNOWN,
                            codes.FAILURE_HANDLER_UNKNOWN,
                            codes.COMPENSATION_UNKNOWN)
    candidates = sorted(state.known_flows | (state.known_aliases if with_aliases else set()))
    close = closest(slug, candidates)
    help = f"did you mean `{close}`?" if close else "declare the flow with `kind: flow`"
    return entry.doc.diagnostic(path, code, f"`{slug}` is not a flow of this project", help)


def is_flow_or_alias(name: str, state: Analysis) -> bool:
    return name in state.known_flows or name in state.known_aliases


SUGGESTIONS = 5  # names a `help:` line lists at most, so output grows with the findings only


def suggest(name: str, known: Suggester, what: str) -> str:
    """`did you mean` the closest known name, else the first few known names."""
    close = known.closest(name)
    if close:
        return f"did you mean `{close}`?"
    return f"{what}: {listing(known.known)}"


COMPARED = 100  # names a suggestion compares at most: finding N typos among N names stays linear


class Suggester:
    """Finds the known name closest to a misspelt one (difflib), comparing it only with a
    few names of about its length that start with the same letter when there are many (a typo
    rarely changes both); the names are indexed once, so N lookups cost N, not N squared."""

    def __init__(self, known: list[str]) -> None:
        self.known = known
        self.index: dict[tuple[str, int], list[str]] = {}
        for name in known:
            self.index.setdefault((name[:1].lower(), len(name)), []).append(name)

    def closest(self, name: str) -> str | None:
        candidates = self.known
        if len(candidates) > COMPARED:
            first = name[:1].lower()
            sizes = [len(name) + delta for delta in (0, -1, 1, -2, 2)]  # nearest first
            candidates = [k for size in sizes
                          for k in self.index.get((first, size), ())[:COMPARED]][:COMPARED]
        close = difflib.get_close_matches(name, candidates, n=1)
        return close[0] if close else None


def closest(name: str, known: list[str]) -> str | None:
    return Suggester(known).closest(name)


def listing(names: list[str]) -> str:
    """The first few ``names``, quoted, and how many more there are."""
    shown = ", ".join(f"`{n}`" for n in names[:SUGGESTIONS])
    more = len(names) - SUGGESTIONS
    return shown + (f" and {more} more" if more > 0 else "")


def opt_int(spec: dict[str, Any], key: str) -> int | None:
    value = spec.get(key)
    return None if value is None else int(value)


def opt_seconds(spec: dict[str, Any], key: str) -> int | None:
    value = spec.get(key)
    return None if value is None else durations.to_seconds(value)


def start_target(entry: Entry, state: Analysis, code: str, what: str) -> Flow | None:
    """The flow a schedule or trigger starts today (an alias: its active version); ``code``
    reports a name that is no flow or alias of the project."""
    name = entry.data["flow"]
    if name in state.aliases:
        return state.flows.get(state.aliases[name].active)
    if name in state.flows:
        return state.flows[name]
    if name not in state.known_flows and name not in state.known_aliases and state.complete \
            and name not in state.declared:
        close = closest(name, sorted(state.known_flows | state.known_aliases))
        state.findings.append(entry.doc.diagnostic(
            ("flow",), code, f"{what} `{entry.slug}` starts `{name}`, which is not a flow "
            "or alias of this project",
            f"did you mean `{close}`?" if close else "declare the flow with `kind: flow`"))
    return None


_Named = TypeVar("_Named", Schedule, Trigger, Webhook, QueueLimits)


def named_once(entries: list[Entry], state: Analysis,
               build: Callable[[Entry, Analysis], _Named | None],
               code: str, taken: str, help: str) -> list[_Named]:
    """Each schedule, trigger, webhook or queue entry built, the second of a name refused with
    ``code`` (``taken``: what is said of its name, ``{name}`` in it); by name."""
    built: dict[str, _Named] = {}
    for entry in entries:
        item = build(entry, state)
        if item is None:
            continue
        other = built.get(item.name)
        if other is not None:
            state.findings.append(entry.doc.diagnostic(
                ("name",), code, taken.format(name=item.name) + f" at {other.location}", help))
            continue
        built[item.name] = item
    return [built[name] for name in sorted(built)]


def check_mapped_fields(entry: Entry, flow: Flow, mapping: Mapping[str, Any], contract: Mapping[str, Any],
                        code: str, state: Analysis) -> None:
    """The field names of an input mapped by pointers against the flow's object contract:
    required fields the mapping does not give, fields a closed object does not allow."""
    what = entry.data["kind"]
    missing = [name for name in contract.get("required", []) if name not in mapping]
    if missing:
        state.findings.append(entry.doc.diagnostic(
            ("input",), code, f"{what} `{entry.slug}`: flow `{flow.slug}` requires "
            + ", ".join(f"`{name}`" for name in missing) + " in its input, which `input` does not map",
            "map each required field to a pointer, e.g. " + _POINTER_EXAMPLE[what]))
    if contract.get("additionalProperties") is False:
        extra = [name for name in mapping if name not in contract.get("properties", {})]
        if extra:
            state.findings.append(entry.doc.diagnostic(
                ("input", extra[0]), code, f"{what} `{entry.slug}`: flow `{flow.slug}` accepts no "
                f"field `{extra[0]}` in its input (its input_schema has additionalProperties: false)",
                "remove the field or add it to the flow's input_schema"))


_POINTER_EXAMPLE = {"trigger": "`order_id: /new/id`", "webhook": "`order_id: /data/order_id`"}
