"""Semantic checks across documents, producing the validated :class:`Project`."""

from __future__ import annotations

import difflib
import functools
import itertools
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from flowlane import defaults
from flowlane.compiler import caching, codes, contracts, cron, durations, names, schema, toposort
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.loader import Document, unstorable
from flowlane.compiler.model import (
    Alias,
    Concurrency,
    Debounce,
    Flow,
    Location,
    Project,
    QueueLimits,
    QueueMode,
    Schedule,
    Step,
    Trigger,
    Webhook,
    WorkerDoc,
)


@dataclass
class _Entry:
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
    flow_entries: dict[str, _Entry] = field(default_factory=dict)
    known_flows: set[str] = field(default_factory=set)
    known_aliases: set[str] = field(default_factory=set)
    declared: set[str] = field(default_factory=set)  # slugs of schema-invalid documents
    complete: bool = True  # False when some file could not be read or parsed
    aliases: dict[str, Alias] = field(default_factory=dict)
    workers: list[WorkerDoc] = field(default_factory=list)
    owners: dict[str, str] = field(default_factory=dict)


def analyze(documents: Iterable[Document], *, complete: bool = True
            ) -> tuple[Project | None, list[Diagnostic]]:
    """Schema and semantic checks of every document; a Project only when nothing is wrong.

    ``complete=False`` says some file failed to load: references to unknown flows are
    then not reported (they are most likely declared in the broken file).
    """
    state = Analysis(complete=complete)
    entries = _schema_valid(documents, state)
    flows = [e for e in entries if e.data["kind"] == "flow"]
    aliases = [e for e in entries if e.data["kind"] == "alias"]
    workers = [e for e in entries if e.data["kind"] == "worker"]
    schedules = [e for e in entries if e.data["kind"] == "schedule"]
    queues = [e for e in entries if e.data["kind"] == "queue"]
    triggers = [e for e in entries if e.data["kind"] == "trigger"]
    webhooks = [e for e in entries if e.data["kind"] == "webhook"]
    _namespace(flows, aliases, state)
    for entry in flows:
        if state.flow_entries.get(entry.slug) is entry:
            _build_flow(entry, state)
    _ownership(state)
    for entry in aliases:
        _build_alias(entry, state)
    _child_flows(state)
    _failure_handlers(state)
    _build_workers(workers, state)
    built = _build_schedules(schedules, state)
    limits = _build_queue_limits(queues, state)
    built_triggers = _build_triggers(triggers, state)
    built_webhooks = _build_webhooks(webhooks, state)
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


def _kinds() -> str:
    first, *others = schema.published()["$defs"]["kind"]["enum"]
    return f"`kind: {first}`, " + ", ".join(f"`{kind}`" for kind in others[:-1]) + f" or `{others[-1]}`"



def _schema_valid(documents: Iterable[Document], state: Analysis) -> list[_Entry]:
    entries = []
    for doc in documents:
        if not isinstance(doc.data, dict):
            what = "empty" if doc.data is None else f"not a mapping ({type(doc.data).__name__})"
            state.findings.append(doc.diagnostic(
                (), "FL007", f"YAML document {doc.index + 1} is {what}",
                f"each document must be a mapping with {_kinds()}"))
            continue
        problems = schema.validate_document(doc)
        if problems and isinstance(doc.data.get("slug"), str):
            state.declared.add(doc.data["slug"])
        state.findings.extend(problems)
        if not problems:
            entries.append(_Entry(doc, doc.data))
        elif doc.data.get("kind") == "flow":
            state.findings.extend(_partial_findings(doc, state.complete))
    return entries


def _partial_findings(doc: Document, complete: bool) -> list[Diagnostic]:
    """The flow-local semantic findings of a document that also has schema errors."""
    repaired = schema.repaired_flow(doc.data)
    if repaired is None:
        return []
    scratch = Analysis(complete=complete)
    _FlowChecker(_Entry(doc, repaired.data), scratch, repaired.placeholders).run()
    return scratch.findings


def _namespace(flows: list[_Entry], aliases: list[_Entry], state: Analysis) -> None:
    """Flow and alias slugs share one case-insensitive namespace; an alias may adopt the
    name of a flow it lists (``names.alias_may_take_flow_name``)."""
    first: dict[str, _Entry] = {}
    for entry in [*flows, *aliases]:  # flows first: a clash of kinds meets the flow as `other`
        folded = entry.slug.lower()
        other = first.get(folded)
        if other is None or _adopts(entry, other):
            first[folded] = entry
            if entry.data["kind"] == "flow":
                state.flow_entries[entry.slug] = entry
                state.known_flows.add(entry.slug)
            else:
                state.known_aliases.add(entry.slug)
            continue
        where = other.loc()
        both = {entry.data["kind"], other.data["kind"]}
        code = "FL051" if both == {"flow", "alias"} else "FL021"
        help = "flow and alias slugs share one namespace (case-insensitive); rename one of them"
        if both == {"flow", "alias"}:
            help = (f"an alias may take the name of a flow only when it lists that flow, "
                    f"spelled the same, as its active or draining version: to give `{other.slug}` "
                    f"a new version without renaming its callers, add a flow `{other.slug}_v2` "
                    f"and an alias `{other.slug}` with `active: {other.slug}_v2` and "
                    f"`draining: [{other.slug}]` (README, \"Versions behind an alias from the "
                    "start\"); otherwise rename the alias")
        if entry.data["kind"] == "flow" == other.data["kind"]:
            limit = names.version_slug_limit(other.data.get("queues", "flow"))
            suggestion = names.next_version_slug(other.slug, max_length=limit)
            help += f" (a new flow version gets a new slug such as `{suggestion}`)"
        state.findings.append(entry.doc.diagnostic(
            ("slug",), code,
            f"{entry.data['kind']} slug `{entry.slug}` is already used by "
            f"{other.data['kind']} `{other.slug}` at {where}", help))


def _adopts(entry: _Entry, other: _Entry) -> bool:
    """``entry`` is an alias taking the name of the flow ``other`` that it lists."""
    if entry.data["kind"] != "alias" or other.data["kind"] != "flow":
        return False
    versions = [entry.data.get("active"), *entry.data.get("draining", [])]
    return names.alias_may_take_flow_name(entry.slug, other.slug, versions)


class _FlowChecker:
    """Checks one flow document and builds its model."""

    def __init__(self, entry: _Entry, state: Analysis,
                 placeholders: frozenset[str] = frozenset()) -> None:
        self.entry = entry
        self.placeholders = placeholders
        self.doc = entry.doc
        self.slug = entry.slug
        self.steps: dict[str, dict[str, Any]] = entry.data["steps"]
        self.step_names = Suggester(list(self.steps))
        self.state = state
        self.errors = 0

    def error(self, path: tuple[str | int, ...], code: str, message: str,
              help: str | None = None, *, key: bool = False) -> None:
        self.errors += 1
        if not self._about_placeholder(path):
            self.state.findings.append(self.doc.diagnostic(path, code, message, help, key=key))

    def _about_placeholder(self, path: tuple[str | int, ...]) -> bool:
        """A finding about a step with schema errors of its own, other than its ``needs``
        (the only part its placeholder keeps), follows from that error: the schema finding
        is the root cause, reported alone (how the step is routed, its type, its options
        depend on the broken part)."""
        if len(path) < 2 or path[1] not in self.placeholders:
            return False
        return path[0] == "queues" or (path[0] == "steps" and path[2:3] != ("needs",))

    def run(self) -> Flow | None:
        self._duplicate_steps()
        self._duration_ranges(("defaults",), self.entry.data.get("defaults", {}))
        self._duration_ranges((), self.entry.data, ("retention",))
        needs = {s: self._needs(s, spec) for s, spec in self.steps.items()}
        for slug, spec in self.steps.items():
            self._step_rules(slug, spec)
            self._condition_keys(slug, spec, needs[slug])
            self._map_over_child_run(slug, spec, needs[slug])
        self._read_contracts()
        self._contract_graph(needs)
        self._concurrency_keys_exist()
        self._debounce_fits()
        caching.check(self)
        order = self._order(needs)
        queues = self._routing(order) if order else None
        if self.errors or order is None or queues is None:
            return None
        return self._model(order, needs, queues)

    def _read_contracts(self) -> None:
        self.input_contract: contracts.Contract | None = None
        self.output_contracts: dict[str, contracts.Contract] = {}
        if "input_schema" in self.entry.data:
            self.input_contract = self._contract(("input_schema",), self.entry.data["input_schema"])
        for slug, spec in self.steps.items():
            if isinstance(spec, dict) and "output_schema" in spec:
                found = self._contract(("steps", slug, "output_schema"), spec["output_schema"])
                if found is not None:
                    self.output_contracts[slug] = found

    def _contract(self, path: tuple[str | int, ...], value: Any) -> contracts.Contract | None:
        found, problems = contracts.read(self.doc, path, value)
        self.errors += len(problems)
        self.state.findings.extend(problems)
        return found

    def _seen_as(self, need: str) -> dict[str, Any] | None:
        """The schema of what a later step sees of ``need`` (a map step: the array of its
        task outputs), None when it has no contract."""
        found = self.output_contracts.get(need)
        if found is None:
            return None
        spec = self.steps[need]
        return contracts.as_map_output(found.schema) if spec.get("type") == "map" else found.schema

    def _contract_graph(self, needs: dict[str, list[str]]) -> None:
        """Conditions and maps checked against the contracts of what they test or map."""
        for slug, spec in self.steps.items():
            if spec.get("type") == "map":
                self._map_source(slug, needs[slug])
            for keyword in ("if", "unless"):
                condition = spec.get(keyword)
                if isinstance(condition, dict):
                    self._condition_contract(slug, keyword, condition, needs[slug])

    def _concurrency_keys_exist(self) -> None:
        """A concurrency key the input_schema says is never present puts every run (or task)
        in the one bucket `null`: a misspelt pointer, refused."""
        schema = self.input_contract.schema if self.input_contract else None
        if schema is None:
            return
        places: list[tuple[tuple[str | int, ...], Any]] = [
            (("concurrency",), self.entry.data.get("concurrency"))]
        places += [(("steps", slug, "concurrency"), spec.get("concurrency"))
                   for slug, spec in self.steps.items() if isinstance(spec, dict)]
        places.append((("debounce",), self.entry.data.get("debounce")))
        for path, concurrency in places:
            key = concurrency.get("key") if isinstance(concurrency, dict) else None
            reason = contracts.never_present(schema, key) if isinstance(key, str) else None
            if reason:
                self.error((*path, "key"), "FL188",
                           f"{path[-1]} key `{key}` never has a value: by the input_schema, {reason}",
                           "point at a field of the run input (every run would share the key null)")

    def _debounce_fits(self) -> None:
        """A maximum wait shorter than the period would cut every period short; a dedup key makes
        every start an idempotent one, which is never debounced."""
        value = self.entry.data.get("debounce")
        if not isinstance(value, dict) or "period" not in value:
            return
        if "dedup" in self.entry.data:
            self.error(("debounce",), "FL189", "debounce beside dedup: every start has an idempotency key, "
                       "and a start with one is never debounced", "keep one of debounce and dedup")
        period, max_wait = value["period"], value.get("max_wait")
        if max_wait is not None and durations.to_seconds(max_wait) < durations.to_seconds(period):
            self.error(("debounce", "max_wait"), "FL189",
                       f"debounce max_wait {max_wait} is shorter than its period {period}",
                       "make max_wait at least the period, or leave it out (no maximum)")

    def _map_source(self, slug: str, needs: list[str]) -> None:
        if needs:
            mapped, what = self._seen_as(needs[0]), f"the output of `{needs[0]}`"
        else:
            mapped = self.input_contract.schema if self.input_contract else None
            what = "the run input"
        if mapped is not None and contracts.not_an_array(mapped):
            self.error(("steps", slug, "type"), "FL104",
                       f"map step `{slug}` maps {what}, whose schema is never an array "
                       f"(type {contracts.declared_types(mapped)})",
                       "map over a step whose output_schema is an array (`type: array`), or make "
                       "this a single step")

    def _condition_contract(self, slug: str, keyword: str, condition: dict[str, Any],
                            needs: list[str]) -> None:
        if not self.steps[slug].get("needs"):
            tested = self.input_contract.schema if self.input_contract else None
            if tested is not None:
                reason = contracts.never_contains(tested, condition)
                if reason:
                    self._never_matches(("steps", slug, keyword), slug, keyword, "the run input",
                                        reason)
            return
        for need, pattern in condition.items():
            tested = self._seen_as(need) if need in needs else None
            if tested is None:
                continue
            reason = contracts.never_contains(tested, pattern)
            if reason:
                self._never_matches(("steps", slug, keyword, need), slug, keyword,
                                    f"the output of `{need}`", reason)

    def _never_matches(self, path: tuple[str | int, ...], slug: str, keyword: str, what: str,
                       reason: str) -> None:
        outcome = "be met" if keyword == "if" else "hold"
        self.error(path, "FL103",
                   f"`{keyword}` of step `{slug}` can never {outcome}: by its schema, in {what} "
                   f"{reason}",
                   "correct the condition, or the schema if the data can look like this")

    def _duplicate_steps(self) -> None:
        seen: dict[str, str] = {}
        for slug in self.steps:
            other = seen.setdefault(slug.lower(), slug)
            if other != slug:
                line = self.doc.key_at(("steps", other)).line
                self.error(("steps", slug), "FL022",
                           f"step slug `{slug}` duplicates `{other}` (line {line}) "
                           "case-insensitively", "rename one of the two steps", key=True)

    def _needs(self, slug: str, spec: dict[str, Any]) -> list[str]:
        listed: list[str] = list(spec.get("needs", []))
        valid: list[str] = []
        for i, need in enumerate(listed):
            path = ("steps", slug, "needs", i)
            if need in valid:
                self.error(path, "FL034", f"step `{slug}` lists `{need}` twice in `needs`",
                           "remove the duplicate")
            elif need not in self.steps:
                help = _suggest(need, self.step_names, "steps of this flow")
                self.error(path, "FL030", f"step `{slug}` needs unknown step `{need}`", help)
            else:
                valid.append(need)
        return valid

    def _duration_ranges(self, path: tuple[str, ...], options: dict[str, Any],
                         names: tuple[str, ...] | None = None) -> None:
        """A duration written with a unit is checked against the option's range here (the
        schema states the range once, on the integer form, where it checks it itself)."""
        for option in names or DURATION_OPTIONS:
            value = options.get(option)
            if not isinstance(value, str) or value == "forever":  # retention's other word
                continue
            low, high = _duration_range(option)
            seconds = durations.to_seconds(value)
            if not low <= seconds <= high:
                self.error((*path, option), "FL016",
                           f"`{option}` is {seconds} seconds; it must be at least {low} "
                           f"and at most {high} seconds",
                           f"for example: {_duration_example(option)}")

    def _step_rules(self, slug: str, spec: dict[str, Any]) -> None:
        self._handler_rules(slug, spec)
        self._duration_ranges(("steps", slug), spec)
        if spec.get("type") == "map" and len(spec.get("needs", [])) > 1:
            self.error(("steps", slug, "type"), "FL032",
                       f"map step `{slug}` has {len(spec['needs'])} needs; a map step has "
                       "0 (maps the run input) or 1 (maps that step's output array)",
                       "add a single step that combines the inputs and map over its output")
        has_condition = "if" in spec or "unless" in spec
        if "when_unmet" in spec and not has_condition:
            self.error(("steps", slug, "when_unmet"), "FL033",
                       f"step `{slug}` sets `when_unmet` but has no `if` or `unless`",
                       "add a condition or remove `when_unmet`", key=True)
        for keyword in ("if", "unless"):
            if keyword in spec:
                self._condition(("steps", slug, keyword), spec[keyword])

    def _handler_rules(self, slug: str, spec: dict[str, Any]) -> None:
        """A step runs a handler, unless it is a wait step (a signal completes it) or starts
        a child flow (its child run completes it)."""
        if "flow" in spec:
            self._child_flow_rules(slug, spec)
        elif spec.get("type") != "wait":
            if "handler" not in spec:
                self.error(("steps", slug), "FL010", f"missing required key `handler` in `{slug}`",
                           "add `handler:` (or `type: wait` for a step that waits for a signal, "
                           "or `flow:` to start a child flow)", key=True)
            return
        elif "handler" in spec:
            self.error(("steps", slug, "handler"), "FL036",
                       f"wait step `{slug}` has a handler: a signal completes a wait step",
                       "remove `handler:`, or remove `type: wait` to run the handler", key=True)
        kind = "wait" if spec.get("type") == "wait" else "child-flow"
        meaning = ("`timeout` is how long a wait step waits for its signal" if kind == "wait"
                   else "the child flow's own options govern its steps; `max_attempts` is how "
                   "many child runs an element may start")
        for option in HANDLER_OPTIONS[kind]:
            if option in spec:
                self.error(("steps", slug, option), "FL037",
                           f"`{option}` means nothing for {kind} step `{slug}`: it runs no handler",
                           f"remove `{option}:`; {meaning}", key=True)

    def _map_over_child_run(self, slug: str, spec: dict[str, Any], needs: list[str]) -> None:
        """A map step maps its need's output array; a child run's output is an object."""
        if spec.get("type") != "map" or len(needs) != 1:
            return
        need = self.steps[needs[0]]
        if "flow" in need and need.get("type") != "map":
            self.error(("steps", slug, "needs", 0), "FL039",
                       f"map step `{slug}` maps the output of `{needs[0]}`, a child-flow step whose "
                       "output is its child run's output, an object of the child's last steps",
                       f"add a step after `{needs[0]}` that returns the array to map, or make "
                       f"`{needs[0]}` a map step")

    def _child_flow_rules(self, slug: str, spec: dict[str, Any]) -> None:
        if "handler" in spec:
            self.error(("steps", slug, "handler"), "FL038",
                       f"step `{slug}` has both a handler and a child flow (`flow:`)",
                       "keep one: `handler:` runs a function, `flow:` starts a run of a flow",
                       key=True)
        if spec.get("type") == "wait":
            self.error(("steps", slug, "type"), "FL038",
                       f"wait step `{slug}` cannot start a child flow",
                       "remove `flow:` (a signal completes a wait step) or `type: wait`", key=True)

    def _condition_keys(self, slug: str, spec: dict[str, Any], needs: list[str]) -> None:
        """A step with needs tests its condition against ``{need: output}`` of its direct
        needs only (the engine sees nothing else): any other top-level key never matches."""
        if not spec.get("needs"):
            return  # a root step's condition tests the run input: any key is fine
        for keyword in ("if", "unless"):
            condition = spec.get(keyword)
            if not isinstance(condition, dict):
                continue
            for key in condition:
                if key in needs or key in spec["needs"]:
                    continue
                listed = _listing(spec["needs"])
                if key in self.steps:
                    help = (f"add `{key}` to the needs of `{slug}` (it is not a direct need, so "
                            f"its output is not part of what `{keyword}` tests), or test a need: "
                            f"{listed}")
                else:
                    close = closest(str(key), spec["needs"])
                    help = (f"did you mean `{close}`?" if close else
                            f"`{keyword}` tests the outputs of `{slug}`'s needs: {listed}")
                outcome = "be met" if keyword == "if" else "hold"
                self.error(("steps", slug, keyword, key), "FL035",
                           f"`{keyword}` of step `{slug}` names `{key}`, which is not among its "
                           f"needs: the condition can never {outcome}", help, key=True)

    def _condition(self, path: tuple[str | int, ...], value: Any) -> None:
        bad = unstorable(value)
        if bad is not None:
            self.error(path, "FL071", f"condition contains {bad[0]}", bad[1])

    def _order(self, needs: dict[str, list[str]]) -> list[str] | None:
        declared = list(self.steps)
        order = toposort.stable_order(declared, needs)
        if len(order) == len(declared):
            return order
        for cycle in toposort.find_cycles(declared, needs, set(order)):
            self._cycle(cycle)
        return None

    def _cycle(self, cycle: list[str]) -> None:
        edges = list(itertools.pairwise(cycle))
        lines = [
            f"`{b}` needs `{a}` at line {self._need_line(b, a)}" for a, b in edges
        ]
        a, b = edges[0]
        index = self.steps[b]["needs"].index(a)
        self.error(("steps", b, "needs", index), codes.DEPENDENCY_CYCLE,
                   "dependency cycle: " + " -> ".join(cycle),
                   "; ".join(lines) + "; remove one of these needs")

    def _need_line(self, step: str, need: str) -> int:
        index = self.steps[step]["needs"].index(need)
        return self.doc.at(("steps", step, "needs", index)).line

    def _waits(self) -> set[str]:
        """The steps without a queue: wait steps and child-flow steps."""
        return {slug for slug, spec in self.steps.items()
                if spec.get("type") == "wait" or "flow" in spec}

    def _routing(self, order: list[str]) -> dict[str, str] | None:
        """The queue of every step that has one (a wait step has none)."""
        routing = self.entry.data.get("queues", "flow")
        if routing == "flow":
            return self._flow_routing(order)
        if routing == "per-step":
            return self._per_step_routing(order)
        return self._explicit_routing(cast(dict[str, str], routing))

    def _flow_routing(self, order: list[str]) -> dict[str, str] | None:
        queue = self.slug.lower()
        if len(queue) > names.QUEUE_MAX:
            self.error(("slug",), "FL044",
                       f"flow `{self.slug}` routes to its own queue `{queue[:20]}...`, which is "
                       f"{len(queue)} characters long; the PGMQ limit is {names.QUEUE_MAX}",
                       f"shorten the slug to {names.QUEUE_MAX} characters or route with an "
                       "explicit `queues:` mapping")
            return None
        waits = self._waits()
        return dict.fromkeys((s for s in order if s not in waits), queue)

    def _per_step_routing(self, order: list[str]) -> dict[str, str] | None:
        routes: dict[str, str] = {}
        waits = self._waits()
        for index, step in enumerate(order):
            if step in waits:
                continue
            queue = names.per_step_queue(self.slug, step, index)
            if queue is None:
                self.error(("steps", step), "FL043",
                           f"per-step queue of step `{step}` cannot be named: both "
                           f"`{self.slug.lower()}__{step.lower()}` and "
                           f"`{self.slug.lower()}__{index}` exceed {names.QUEUE_MAX} characters",
                           "shorten the flow slug or route with an explicit `queues:` mapping",
                           key=True)
            else:
                routes[step] = queue
        return routes if len(routes) == len(order) - len(waits) else None

    def _explicit_routing(self, routing: dict[str, str]) -> dict[str, str] | None:
        before = self.errors
        waits = self._waits()
        for step in routing:
            if step in waits:
                kind = "wait" if self.steps[step].get("type") == "wait" else "child-flow"
                self.error(("queues", step), codes.ROUTING_NAMES_QUEUELESS_STEP,
                           f"`queues` routes {kind} step `{step}`, which has no queue",
                           "remove this entry: a signal completes a wait step, a child run a "
                           "child-flow step; no worker serves either", key=True)
            elif step not in self.steps:
                close = self.step_names.closest(step)
                help = f"did you mean `{close}`?" if close else "remove this entry"
                self.error(("queues", step), codes.ROUTING_NAMES_UNKNOWN_STEP,
                           f"`queues` routes unknown step `{step}`", help, key=True)
        queues_line = self.doc.key_at(("queues",)).line
        for step in self.steps:
            if step not in routing and step not in waits:
                self.error(("steps", step), codes.ROUTING_MISSES_STEP,
                           f"step `{step}` has no entry in the explicit `queues` mapping "
                           f"(line {queues_line})",
                           f"add `{step}: <queue>` under `queues:`; an explicit mapping must "
                           "route every step", key=True)
        return dict(routing) if self.errors == before else None

    def _model(self, order: list[str], needs: dict[str, list[str]],
               queues: dict[str, str]) -> Flow:
        steps = tuple(self._step(i, slug, needs[slug], queues.get(slug))
                      for i, slug in enumerate(order))
        routing = self.entry.data.get("queues", "flow")
        mode = cast(QueueMode, routing if isinstance(routing, str) else "explicit")
        options = self.entry.data.get("defaults", {})
        return Flow(
            slug=self.slug,
            queue_mode=mode,
            steps=steps,
            max_attempts=int(options.get("max_attempts", defaults.MAX_ATTEMPTS)),
            base_delay=durations.to_seconds(options.get("base_delay", defaults.BASE_DELAY)),
            timeout=durations.to_seconds(options.get("timeout", defaults.TIMEOUT)),
            retention=self._retention(),
            deadline=_opt_seconds(options, "deadline"),
            dedup_key=self.entry.data.get("dedup", {}).get("key"),
            concurrency=_concurrency(self.entry.data),
            priority=_opt_int(self.entry.data, "priority"),
            debounce=_debounce(self.entry.data),
            on_failure=self.entry.data.get("on_failure", {}).get("flow"),
            on_failure_on_cancel=bool(self.entry.data.get("on_failure", {}).get("on_cancel", False)),
            description=self.entry.data.get("description"),
            input_schema=self.input_contract.schema if self.input_contract else None,
            location=self.entry.loc(),
        )

    def _retention(self) -> int | None:
        value = self.entry.data.get("retention", defaults.RETENTION)
        return None if value == "forever" else durations.to_seconds(value)

    def _step(self, index: int, slug: str, needs: list[str], queue: str | None) -> Step:
        spec = self.steps[slug]
        get = spec.get
        contract = self.output_contracts.get(slug)
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
            max_attempts=_opt_int(spec, "max_attempts"),
            base_delay=_opt_seconds(spec, "base_delay"),
            timeout=_opt_seconds(spec, "timeout"),
            start_delay=_opt_seconds(spec, "start_delay"),
            description=get("description"),
            output_schema=None if contract is None else contract.schema,
            flow=get("flow"),
            concurrency=_concurrency(spec),
            compensate=get("compensate", {}).get("flow"),
            cache=caching.step_cache(spec),
            location=self.entry.loc(("steps", slug), key=True),
            handler_location=(self.entry.loc(("steps", slug, "handler"))
                              if "handler" in spec else None),
        )


# step options that concern a handler, meaningless for a wait or child-flow step
HANDLER_OPTIONS = {"wait": ("max_attempts", "base_delay", "start_delay", "concurrency", "cache"),
                    "child-flow": ("base_delay", "start_delay", "timeout", "concurrency", "cache")}


def _concurrency(spec: dict[str, Any]) -> Concurrency | None:
    value = spec.get("concurrency")
    return None if value is None else Concurrency(int(value["limit"]), value.get("key"),
                                                  value.get("when_full", "queue"))


def _debounce(spec: dict[str, Any]) -> Debounce | None:
    value = spec.get("debounce")
    if value is None:
        return None
    return Debounce(durations.to_seconds(value["period"]), value.get("key"), _opt_seconds(value, "max_wait"))


def _opt_int(spec: dict[str, Any], key: str) -> int | None:
    value = spec.get(key)
    return None if value is None else int(value)


def _opt_seconds(spec: dict[str, Any], key: str) -> int | None:
    value = spec.get(key)
    return None if value is None else durations.to_seconds(value)


DURATION_OPTIONS = ("timeout", "base_delay", "start_delay", "deadline")


def _duration_range(option: str) -> tuple[int, int]:
    seconds = schema.published()["$defs"][option]["anyOf"][0]
    return int(seconds["minimum"]), int(seconds["maximum"])


def _duration_example(option: str) -> str:
    return str(schema.published()["$defs"][option]["examples"][-1])


SUGGESTIONS = 5  # names a `help:` line lists at most, so output grows with the findings only


def _suggest(name: str, known: Suggester, what: str) -> str:
    """`did you mean` the closest known name, else the first few known names."""
    close = known.closest(name)
    if close:
        return f"did you mean `{close}`?"
    return f"{what}: {_listing(known.known)}"


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


def _listing(names: list[str]) -> str:
    """The first few ``names``, quoted, and how many more there are."""
    shown = ", ".join(f"`{n}`" for n in names[:SUGGESTIONS])
    more = len(names) - SUGGESTIONS
    return shown + (f" and {more} more" if more > 0 else "")


def _build_flow(entry: _Entry, state: Analysis) -> None:
    flow = _FlowChecker(entry, state).run()
    if flow is not None:
        state.flows[flow.slug] = flow


def _ownership(state: Analysis) -> None:
    """A queue owned by one flow is never used by another flow nor declared shared."""
    for flow in state.flows.values():
        for queue in flow.owned_queues:
            owner = state.owners.setdefault(queue, flow.slug)
            if owner != flow.slug:
                entry = state.flow_entries[flow.slug]
                state.findings.append(entry.doc.diagnostic(
                    ("slug",), "FL045",
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
                    ("queues", step.slug), "FL045",
                    f"queue `{step.queue}` is owned by flow `{holder}` and cannot be shared",
                    "choose another name for the shared queue; a flow's own queues are private"))


def _child_flows(state: Analysis) -> None:
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
                    _report_unknown(entry, ("steps", step.slug, "flow"), step.flow, state, "FL140")
                continue
            edges.setdefault(flow.slug, []).extend((step.slug, t) for t in targets)
    for cycle in _cycles(edges):
        first_flow, first_step = cycle[0]
        path = " -> ".join(f"{f} (step {s})" for f, s in cycle) + f" -> {first_flow}"
        state.findings.append(state.flow_entries[first_flow].doc.diagnostic(
            ("steps", first_step, "flow"), "FL141",
            f"flow `{first_flow}` can start itself through child flows: {path}",
            "a child flow may not start its ancestors; break the cycle (or do the repeated "
            "work in a map step)"))


def _failure_handlers(state: Analysis) -> None:
    """A failure handler is another flow or alias of the project (FL142, FL143); so is a
    step's compensation (FL144)."""
    for flow in state.flows.values():
        entry = state.flow_entries[flow.slug]
        named = flow.on_failure
        if named == flow.slug:
            state.findings.append(entry.doc.diagnostic(
                ("on_failure", "flow"), "FL143", f"flow `{flow.slug}` names itself as its failure handler",
                "name another flow: the handler runs when this flow has failed"))
        elif named is not None and not _is_flow_or_alias(named, state):
            _report_unknown(entry, ("on_failure", "flow"), named, state, "FL142")
        for step in flow.steps:
            if step.compensate is not None and not _is_flow_or_alias(step.compensate, state):
                _report_unknown(entry, ("steps", step.slug, "compensate", "flow"), step.compensate,
                                state, "FL144")


def _is_flow_or_alias(name: str, state: Analysis) -> bool:
    return name in state.known_flows or name in state.known_aliases


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


def _build_alias(entry: _Entry, state: Analysis) -> None:
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
                path, "FL052", f"alias `{entry.slug}` lists `{slug}` twice",
                "a version is either active or draining, once"))
            continue
        seen.add(slug)
        if slug not in state.known_flows:
            problems += 1
            _report_unknown(entry, path, slug, state, "FL050")
        elif slug not in state.flows:
            problems += 1  # that flow has errors of its own, reported there
    if problems == 0:
        state.aliases[entry.slug] = Alias(
            slug=entry.slug, active=data["active"], draining=tuple(draining),
            description=data.get("description"), location=entry.loc(),
        )


def _report_unknown(entry: _Entry, path: tuple[str | int, ...], slug: str, state: Analysis,
                    code: str) -> None:
    """An unknown name, unless it is declared by a document with errors of its own."""
    if state.complete and slug not in state.declared:
        state.findings.append(_unknown_flow(entry, path, slug, state, code))


def _unknown_flow(entry: _Entry, path: tuple[str | int, ...], slug: str, state: Analysis,
                  code: str) -> Diagnostic:
    if slug in state.known_aliases and code == "FL050":
        return entry.doc.diagnostic(path, code, f"`{slug}` is an alias, not a concrete flow",
                                    "an alias points at concrete flow slugs only")
    with_aliases = code in ("FL060", "FL140", "FL142", "FL144")
    candidates = sorted(state.known_flows | (state.known_aliases if with_aliases else set()))
    close = closest(slug, candidates)
    help = f"did you mean `{close}`?" if close else "declare the flow with `kind: flow`"
    return entry.doc.diagnostic(path, code, f"`{slug}` is not a flow of this project", help)


def _build_workers(entries: list[_Entry], state: Analysis) -> None:
    names_seen: dict[str, _Entry] = {}
    for entry in entries:
        worker = _build_worker(entry, state)
        if worker is None:
            continue
        other = names_seen.setdefault(worker.name, entry)
        if other is not entry:
            state.findings.append(entry.doc.diagnostic(
                ("name",) if "name" in entry.data else ("queue",), "FL063",
                f"worker name `{worker.name}` is already used at {other.loc(('queue',))}",
                "give each worker document a distinct `name`"))
            continue
        state.workers.append(worker)
    _coverage(state)


def _build_worker(entry: _Entry, state: Analysis) -> WorkerDoc | None:
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
                _report_unknown(entry, path, name, state, "FL060")
            continue
        if not any(f.steps_on(queue) for f in versions):
            problems += 1
            routed = sorted({q for f in versions for q in f.queues})
            state.findings.append(entry.doc.diagnostic(
                path, "FL061", f"`{name}` routes no step to queue `{queue}`",
                "it routes to " + _listing(routed) +
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
            workers = _listing([w.name for w in state.workers if w.queue == step.queue])
            state.findings.append(entry.doc.diagnostic(
                path, "FL062",
                f"step `{step.slug}` of flow `{flow.slug}` is routed to queue `{step.queue}`, "
                "but no worker document for that queue lists this flow",
                f"add `{flow.slug}` (or an alias with it as active or draining version) to "
                f"`flows` of worker {workers}; otherwise its tasks would wait forever",
                key=flow.queue_mode != "explicit"))


def _build_schedules(entries: list[_Entry], state: Analysis) -> list[Schedule]:
    built: dict[str, Schedule] = {}
    for entry in entries:
        schedule = _build_schedule(entry, state)
        if schedule is None:
            continue
        other = built.get(schedule.name)
        if other is not None:
            state.findings.append(entry.doc.diagnostic(
                ("name",), "FL083", f"schedule name `{schedule.name}` is already used at "
                f"{other.location}", "give each schedule a distinct `name`"))
            continue
        built[schedule.name] = schedule
    return [built[name] for name in sorted(built)]


def _build_schedule(entry: _Entry, state: Analysis) -> Schedule | None:
    data = entry.data
    before = len(state.findings)
    target = _schedule_target(entry, state)
    if ("cron" in data) == ("every" in data):
        both = "cron" in data
        state.findings.append(entry.doc.diagnostic(
            ("every",) if both else ("name",), "FL013" if both else "FL010",
            f"schedule `{entry.slug}` " + ("has both `cron` and `every`" if both else
                                           "has neither `cron` nor `every`"),
            "give one: `cron: \"0 2 * * *\"` or `every: 10m`", key=both))
    fields = _cron_fields(entry, state) if "cron" in data else None
    zone = str(data.get("timezone", "UTC"))
    if zone not in _time_zones():
        close = closest(zone, sorted(_time_zones()))
        state.findings.append(entry.doc.diagnostic(
            ("timezone",), "FL081", f"unknown time zone `{zone}`",
            f"did you mean `{close}`?" if close else "use an IANA name such as `Europe/Berlin` or `UTC`"))
    every = durations.to_seconds(data["every"]) if "every" in data else None
    if every is not None and every < 1:
        state.findings.append(entry.doc.diagnostic(
            ("every",), "FL016", f"schedule `{entry.slug}`: `every` must be at least 1 second",
            "write an interval such as `30s`, `10m` or `1h`"))
    run_input = data.get("input", {})
    if target is not None:
        _check_schedule_input(entry, target, run_input, state)
    if len(state.findings) > before:
        return None
    return Schedule(
        name=str(data["name"]), flow=str(data["flow"]), cron=data.get("cron"), cron_fields=fields,
        every=every, timezone=zone, input=run_input, overlap=data.get("overlap", "skip"),
        catch_up=data.get("catch_up", "latest"), description=data.get("description"),
        location=entry.loc(("name",)),
    )


def _schedule_target(entry: _Entry, state: Analysis) -> Flow | None:
    """The flow a schedule starts today (an alias: its active version)."""
    return _start_target(entry, state, "FL082", "schedule")


def _start_target(entry: _Entry, state: Analysis, code: str, what: str) -> Flow | None:
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


def _cron_fields(entry: _Entry, state: Analysis) -> tuple[tuple[int, ...] | None, ...] | None:
    try:
        parsed = cron.parse(str(entry.data["cron"]))
    except cron.CronError as exc:
        state.findings.append(entry.doc.diagnostic(
            ("cron",), "FL080", f"schedule `{entry.slug}`: {exc}",
            "five fields: minute hour day-of-month month day-of-week, e.g. `0 2 * * *`; "
            "or @hourly, @daily, @weekly, @monthly, @yearly"))
        return None
    return (parsed.minutes, parsed.hours, parsed.days, parsed.months, parsed.weekdays)


def _check_schedule_input(entry: _Entry, flow: Flow, run_input: Any, state: Analysis) -> None:
    """The input checks a start makes that the YAML already decides: a root map's list and
    the flow's input contract."""
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None and not isinstance(run_input, list):
        state.findings.append(entry.doc.diagnostic(
            ("input",) if "input" in entry.data else ("flow",), "FL084",
            f"schedule `{entry.slug}`: flow `{flow.slug}` maps its run input in step "
            f"`{root_map.slug}`, so the input must be a list",
            "give `input:` a list, e.g. `input: [1, 2, 3]`"))
    violation = None if flow.input_schema is None else contracts.rejects(flow.input_schema,
                                                                          run_input)
    if violation is not None:
        state.findings.append(entry.doc.diagnostic(
            ("input",) if "input" in entry.data else ("flow",), "FL105",
            f"schedule `{entry.slug}`: flow `{flow.slug}` would refuse this input: {violation}",
            "change `input:` to match the flow's `input_schema`"))


def _build_triggers(entries: list[_Entry], state: Analysis) -> list[Trigger]:
    return _named_once(entries, state, _build_trigger, "FL111", "trigger",
                       "give each trigger a distinct `name`")


_Named = TypeVar("_Named", Trigger, Webhook)


def _named_once(entries: list[_Entry], state: Analysis,
                build: Callable[[_Entry, Analysis], _Named | None],
                code: str, kind: str, help: str) -> list[_Named]:
    """Each entry built, the second of a name refused with ``code``; by name."""
    built: dict[str, _Named] = {}
    for entry in entries:
        item = build(entry, state)
        if item is None:
            continue
        other = built.get(item.name)
        if other is not None:
            state.findings.append(entry.doc.diagnostic(
                ("name",), code, f"{kind} name `{item.name}` is already used at {other.location}", help))
            continue
        built[item.name] = item
    return [built[name] for name in sorted(built)]


def _build_trigger(entry: _Entry, state: Analysis) -> Trigger | None:
    data = entry.data
    before = len(state.findings)
    events = tuple(sorted(set(data["events"])))
    target = _start_target(entry, state, "FL110", "trigger")
    for keyword in ("when", "unless"):
        if keyword in data:
            bad = unstorable(data[keyword])
            if bad is not None:
                state.findings.append(entry.doc.diagnostic((keyword,), "FL071",
                                                           f"condition contains {bad[0]}", bad[1]))
    pointers: list[tuple[tuple[str | int, ...], Any]] = [
        (("input", field), pointer) for field, pointer in data.get("input", {}).items()]
    pointers += [(("key",), data["key"])] if "key" in data else []
    for path, pointer in pointers:
        _check_event_pointer(entry, path, str(pointer), events, state)
    if target is not None:
        _check_trigger_input(entry, target, state)
    if len(state.findings) > before:
        return None
    return Trigger(
        name=str(data["name"]), flow=str(data["flow"]), table=str(data["table"]), events=events,
        when=data.get("when"), unless=data.get("unless"), input=data.get("input"), key=data.get("key"),
        on_refused=data.get("on_refused", "fail"), description=data.get("description"),
        location=entry.loc(("name",)),
    )


_EVENT_ROWS = {"insert": ("new",), "update": ("old", "new"), "delete": ("old",)}


def _check_event_pointer(entry: _Entry, path: tuple[str | int, ...], pointer: str,
                         events: tuple[str, ...], state: Analysis) -> None:
    """A pointer into `old` or `new` finds a value for at least one of the trigger's events."""
    row = pointer.split("/")[1]
    if row == "op" or any(row in _EVENT_ROWS[event] for event in events):
        return
    state.findings.append(entry.doc.diagnostic(
        path, "FL112", f"trigger `{entry.slug}`: `{pointer}` points into the {row} row, which "
        f"{' and '.join(events)} events do not have",
        "an insert has only `/new`, a delete only `/old`, an update both"))


def _check_trigger_input(entry: _Entry, flow: Flow, state: Analysis) -> None:
    """What the flow's input contract decides from the input's field names alone: required
    fields the mapping does not give, fields a closed object does not allow, a root map's list."""
    mapping = entry.data.get("input")
    path: tuple[str | int, ...] = ("input",) if mapping is not None else ("flow",)
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None:
        state.findings.append(entry.doc.diagnostic(
            path, "FL113", f"trigger `{entry.slug}`: flow `{flow.slug}` maps its run input in step "
            f"`{root_map.slug}`, so the input must be a list; a trigger's input is an object",
            "start a flow whose root step is not a map"))
        return
    contract = flow.input_schema
    if mapping is None or not isinstance(contract, Mapping):
        return  # the row's columns are known only to the database: set_trigger's start checks
    _check_mapped_fields(entry, flow, mapping, contract, "FL113", state)


def _check_mapped_fields(entry: _Entry, flow: Flow, mapping: Mapping[str, Any], contract: Mapping[str, Any],
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


def _build_webhooks(entries: list[_Entry], state: Analysis) -> list[Webhook]:
    return _named_once(entries, state, _build_webhook, "FL115", "webhook",
                       "give each webhook a distinct `name`: it is the webhook's path")


def _build_webhook(entry: _Entry, state: Analysis) -> Webhook | None:
    data = entry.data
    before = len(state.findings)
    target = _start_target(entry, state, "FL114", "webhook")
    signal = data.get("signal")
    if target is not None and signal is not None:
        _check_signalled_step(entry, target, str(signal["step"]), state)
    elif target is not None:
        _check_webhook_input(entry, target, state)
    if len(state.findings) > before:
        return None
    return Webhook(
        name=str(data["name"]), scheme=data["scheme"], secret_env=str(data["secret_env"]),
        flow=str(data["flow"]), input=data.get("input"),
        signal_step=None if signal is None else str(signal["step"]),
        signal_run=None if signal is None else str(signal["run"]),
        max_body=int(data.get("max_body", 1048576)), description=data.get("description"),
        location=entry.loc(("name",)),
    )


def _check_signalled_step(entry: _Entry, flow: Flow, step: str, state: Analysis) -> None:
    found = next((s for s in flow.steps if s.slug == step), None)
    if found is not None and found.type == "wait":
        return
    waits = [s.slug for s in flow.steps if s.type == "wait"]
    state.findings.append(entry.doc.diagnostic(
        ("signal", "step"), "FL116", f"webhook `{entry.slug}` signals step `{step}` of flow `{flow.slug}`, "
        + ("which is not a wait step" if found is not None else "which has no such step"),
        "name one of its wait steps: " + ", ".join(f"`{w}`" for w in waits) if waits
        else f"flow `{flow.slug}` has no wait step (`type: wait`)"))


def _check_webhook_input(entry: _Entry, flow: Flow, state: Analysis) -> None:
    """A mapped input is an object: a flow whose root step maps the input cannot take it, and
    its field names must fit the flow's contract (the values come with each delivery)."""
    mapping = entry.data.get("input")
    if mapping is None:
        return
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None:
        state.findings.append(entry.doc.diagnostic(
            ("input",), "FL117", f"webhook `{entry.slug}`: flow `{flow.slug}` maps its run input in step "
            f"`{root_map.slug}`, so the input must be a list; a mapped `input` is an object",
            "leave out `input` to start the flow with the delivered body"))
    elif isinstance(flow.input_schema, Mapping):
        _check_mapped_fields(entry, flow, mapping, flow.input_schema, "FL117", state)


@functools.cache
def _time_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) | {"UTC"}


RATE_PER_MAX = 86400  # the longest rate limit window: one day


def _build_queue_limits(entries: list[_Entry], state: Analysis) -> list[QueueLimits]:
    """Each queue declared once (FL182), with a limit (FL186) and a window in range
    (FL016), routed to by some step (FL183: a misspelt name would limit nothing)."""
    built: dict[str, QueueLimits] = {}
    declared_by: dict[str, _Entry] = {}
    for entry in entries:
        limits = _build_queue_limit(entry, state)
        if limits is None:
            continue
        other = built.get(limits.name)
        if other is not None:
            state.findings.append(entry.doc.diagnostic(
                ("name",), "FL182", f"queue `{limits.name}` is already declared at "
                f"{other.location}", "declare each queue's limits in one `kind: queue` document"))
            continue
        built[limits.name] = limits
        declared_by[limits.name] = entry
    _unrouted_queues(declared_by, state)
    return [built[name] for name in sorted(built)]


def _build_queue_limit(entry: _Entry, state: Analysis) -> QueueLimits | None:
    data = entry.data
    rate = data.get("rate_limit")
    if "concurrency" not in data and rate is None:
        state.findings.append(entry.doc.diagnostic(
            ("name",), "FL186", f"queue `{data['name']}` declares no limit",
            "add `concurrency: N` and/or `rate_limit: {limit: N, per: 1s}`, or delete the "
            "document (a queue without one has no limits)"))
        return None
    per = None if rate is None else durations.to_seconds(rate["per"])
    if per is not None and not 1 <= per <= RATE_PER_MAX:  # the schema checks the integer form
        state.findings.append(entry.doc.diagnostic(
            ("rate_limit", "per"), "FL016",
            f"`per` is {per} seconds; it must be at least 1 and at most {RATE_PER_MAX} seconds",
            "for example: 1s"))
        return None
    return QueueLimits(
        name=str(data["name"]), concurrency=_opt_int(data, "concurrency"),
        rate_limit=None if rate is None else int(rate["limit"]), rate_per=per,
        description=data.get("description"), location=entry.loc(("name",)),
    )


def _unrouted_queues(declared: dict[str, _Entry], state: Analysis) -> None:
    """Only when every flow was built: a flow with errors may route to the queue."""
    if not state.complete or set(state.flows) != state.known_flows or state.declared:
        return
    routed = sorted({q for flow in state.flows.values() for q in flow.queues})
    for name, entry in declared.items():
        if name in routed:
            continue
        close = closest(name, routed)
        help = (f"did you mean `{close}`?" if close else
                "steps are routed to " + (_listing(routed) if routed else "no queue"))
        state.findings.append(entry.doc.diagnostic(
            ("name",), "FL183",
            f"no step is routed to queue `{name}`: its limits would hold nothing back", help))
