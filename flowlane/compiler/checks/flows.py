"""A flow document: the list of its checks (steps, graph, conditions, options; its contracts and
routing in their modules) and, when they pass, its model."""

from __future__ import annotations

import itertools
from typing import Any

from flowlane.compiler import codes, durations, schema, toposort
from flowlane.compiler.checks import flow_cache, flow_routing
from flowlane.compiler.checks.flow_contracts import FlowContracts
from flowlane.compiler.checks.flow_document import FlowDocument
from flowlane.compiler.checks.flow_model import flow_model
from flowlane.compiler.checks.shared import (
    Analysis,
    Entry,
    closest,
    listing,
    suggest,
)
from flowlane.compiler.loader import unstorable
from flowlane.compiler.model import Flow


class FlowChecker(FlowDocument):
    """Checks one flow document and builds its model."""

    def run(self) -> Flow | None:
        self._duplicate_steps()
        self._duration_ranges(("defaults",), self.entry.data.get("defaults", {}))
        self._duration_ranges((), self.entry.data, ("retention",))
        needs = {s: self._needs(s, spec) for s, spec in self.steps.items()}
        for slug, spec in self.steps.items():
            self._step_rules(slug, spec)
            self._condition_keys(slug, spec, needs[slug])
            self._map_over_child_run(slug, spec, needs[slug])
        self.contracts = FlowContracts(self)
        self.contracts.check_graph(needs)
        self.contracts.check_concurrency_keys()
        self._debounce_fits()
        flow_cache.check(self, self.contracts)
        order = self._order(needs)
        queues = flow_routing.queues_of(self, order) if order else None
        if self.errors or order is None or queues is None:
            return None
        return flow_model(self, self.contracts, order, needs, queues)

    def _debounce_fits(self) -> None:
        """A maximum wait shorter than the period would cut every period short; a dedup key makes
        every start an idempotent one, which is never debounced."""
        value = self.entry.data.get("debounce")
        if not isinstance(value, dict) or "period" not in value:
            return
        if "dedup" in self.entry.data:
            self.error(("debounce",), codes.DEBOUNCE_CONFLICT,
                       "debounce beside dedup: every start has an idempotency key, "
                       "and a start with one is never debounced", "keep one of debounce and dedup")
        period, max_wait = value["period"], value.get("max_wait")
        if max_wait is not None and durations.to_seconds(max_wait) < durations.to_seconds(period):
            self.error(("debounce", "max_wait"), codes.DEBOUNCE_CONFLICT,
                       f"debounce max_wait {max_wait} is shorter than its period {period}",
                       "make max_wait at least the period, or leave it out (no maximum)")

    def _duplicate_steps(self) -> None:
        seen: dict[str, str] = {}
        for slug in self.steps:
            other = seen.setdefault(slug.lower(), slug)
            if other != slug:
                line = self.doc.key_at(("steps", other)).line
                self.error(("steps", slug), codes.DUPLICATE_STEP,
                           f"step slug `{slug}` duplicates `{other}` (line {line}) "
                           "case-insensitively", "rename one of the two steps", key=True)

    def _needs(self, slug: str, spec: dict[str, Any]) -> list[str]:
        listed: list[str] = list(spec.get("needs", []))
        valid: list[str] = []
        for i, need in enumerate(listed):
            path = ("steps", slug, "needs", i)
            if need in valid:
                self.error(path, codes.DEPENDENCY_TWICE, f"step `{slug}` lists `{need}` twice in `needs`",
                           "remove the duplicate")
            elif need not in self.steps:
                help = suggest(need, self.step_names, "steps of this flow")
                self.error(path, codes.UNKNOWN_DEPENDENCY, f"step `{slug}` needs unknown step `{need}`", help)
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
                self.error((*path, option), codes.DURATION_OUT_OF_RANGE,
                           f"`{option}` is {seconds} seconds; it must be at least {low} "
                           f"and at most {high} seconds",
                           f"for example: {_duration_example(option)}")

    def _step_rules(self, slug: str, spec: dict[str, Any]) -> None:
        self._handler_rules(slug, spec)
        self._duration_ranges(("steps", slug), spec)
        if spec.get("type") == "map" and len(spec.get("needs", [])) > 1:
            self.error(("steps", slug, "type"), codes.MAP_WITH_MANY_NEEDS,
                       f"map step `{slug}` has {len(spec['needs'])} needs; a map step has "
                       "0 (maps the run input) or 1 (maps that step's output array)",
                       "add a single step that combines the inputs and map over its output")
        has_condition = "if" in spec or "unless" in spec
        if "when_unmet" in spec and not has_condition:
            self.error(("steps", slug, "when_unmet"), codes.WHEN_UNMET_WITHOUT_CONDITION,
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
                self.error(("steps", slug), codes.MISSING_KEY, f"missing required key `handler` in `{slug}`",
                           "add `handler:` (or `type: wait` for a step that waits for a signal, "
                           "or `flow:` to start a child flow)", key=True)
            return
        elif "handler" in spec:
            self.error(("steps", slug, "handler"), codes.WAIT_STEP_WITH_HANDLER,
                       f"wait step `{slug}` has a handler: a signal completes a wait step",
                       "remove `handler:`, or remove `type: wait` to run the handler", key=True)
        kind = "wait" if spec.get("type") == "wait" else "child-flow"
        meaning = ("`timeout` is how long a wait step waits for its signal" if kind == "wait"
                   else "the child flow's own options govern its steps; `max_attempts` is how "
                   "many child runs an element may start")
        for option in HANDLER_OPTIONS[kind]:
            if option in spec:
                self.error(("steps", slug, option), codes.OPTION_MEANS_NOTHING,
                           f"`{option}` means nothing for {kind} step `{slug}`: it runs no handler",
                           f"remove `{option}:`; {meaning}", key=True)

    def _map_over_child_run(self, slug: str, spec: dict[str, Any], needs: list[str]) -> None:
        """A map step maps its need's output array; a child run's output is an object."""
        if spec.get("type") != "map" or len(needs) != 1:
            return
        need = self.steps[needs[0]]
        if "flow" in need and need.get("type") != "map":
            self.error(("steps", slug, "needs", 0), codes.MAP_OVER_CHILD_RUN,
                       f"map step `{slug}` maps the output of `{needs[0]}`, a child-flow step whose "
                       "output is its child run's output, an object of the child's last steps",
                       f"add a step after `{needs[0]}` that returns the array to map, or make "
                       f"`{needs[0]}` a map step")

    def _child_flow_rules(self, slug: str, spec: dict[str, Any]) -> None:
        if "handler" in spec:
            self.error(("steps", slug, "handler"), codes.CHILD_FLOW_STEP_CONFLICT,
                       f"step `{slug}` has both a handler and a child flow (`flow:`)",
                       "keep one: `handler:` runs a function, `flow:` starts a run of a flow",
                       key=True)
        if spec.get("type") == "wait":
            self.error(("steps", slug, "type"), codes.CHILD_FLOW_STEP_CONFLICT,
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
                listed = listing(spec["needs"])
                if key in self.steps:
                    help = (f"add `{key}` to the needs of `{slug}` (it is not a direct need, so "
                            f"its output is not part of what `{keyword}` tests), or test a need: "
                            f"{listed}")
                else:
                    close = closest(str(key), spec["needs"])
                    help = (f"did you mean `{close}`?" if close else
                            f"`{keyword}` tests the outputs of `{slug}`'s needs: {listed}")
                outcome = "be met" if keyword == "if" else "hold"
                self.error(("steps", slug, keyword, key), codes.CONDITION_NAMES_NO_NEED,
                           f"`{keyword}` of step `{slug}` names `{key}`, which is not among its "
                           f"needs: the condition can never {outcome}", help, key=True)

    def _condition(self, path: tuple[str | int, ...], value: Any) -> None:
        bad = unstorable(value)
        if bad is not None:
            self.error(path, codes.UNSTORABLE_CONDITION, f"condition contains {bad[0]}", bad[1])

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


# step options that concern a handler, meaningless for a wait or child-flow step
HANDLER_OPTIONS = {"wait": ("max_attempts", "base_delay", "start_delay", "concurrency", "cache"),
                   "child-flow": ("base_delay", "start_delay", "timeout", "concurrency", "cache")}


DURATION_OPTIONS = ("timeout", "base_delay", "start_delay", "deadline")


def _duration_range(option: str) -> tuple[int, int]:
    seconds = schema.published()["$defs"][option]["anyOf"][0]
    return int(seconds["minimum"]), int(seconds["maximum"])


def _duration_example(option: str) -> str:
    return str(schema.published()["$defs"][option]["examples"][-1])


def build_flow(entry: Entry, state: Analysis) -> None:
    flow = FlowChecker(entry, state).run()
    if flow is not None:
        state.flows[flow.slug] = flow
