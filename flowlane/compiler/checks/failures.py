"""Failure handlers and compensations: flows of the project that can run and start."""

from __future__ import annotations

from collections.abc import Mapping

from flowlane.compiler import codes, contracts, toposort
from flowlane.compiler.checks.shared import Analysis, Entry, is_flow_or_alias, listing, report_unknown
from flowlane.compiler.model import Flow, Step


def failure_handlers(state: Analysis) -> None:
    """A failure handler is another flow or alias of the project (FL142, FL143); so is a
    step's compensation (FL144). Each can run (FL145, FL146) and can start with the document
    it is given (FL147)."""
    for flow in state.flows.values():
        entry = state.flow_entries[flow.slug]
        named = flow.on_failure
        if named == flow.slug:
            state.findings.append(entry.doc.diagnostic(
                ("on_failure", "flow"), codes.FAILURE_HANDLER_IS_ITSELF,
                    f"flow `{flow.slug}` names itself as its failure handler",
                "name another flow: the handler runs when this flow has failed"))
        elif named is not None and not is_flow_or_alias(named, state):
            report_unknown(entry, ("on_failure", "flow"), named, state, codes.FAILURE_HANDLER_UNKNOWN)
        elif named is not None:
            _handler_can_run(flow, entry, state)
            _handler_takes_its_input(entry, ("on_failure", "flow"), named, FAILURE_DOCUMENT, state)
        for step in flow.steps:
            path = ("steps", step.slug, "compensate", "flow")
            if step.compensate is None:
                continue
            if not is_flow_or_alias(step.compensate, state):
                report_unknown(entry, path, step.compensate, state, codes.COMPENSATION_UNKNOWN)
                continue
            _compensation_can_run(flow, step, entry, state)
            _handler_takes_its_input(entry, path, step.compensate, COMPENSATION_DOCUMENT, state)


# the fields of the input a failure handler's run and a compensation's run start with
FAILURE_DOCUMENT = ("run_id", "flow", "status", "error", "failed_step", "step_error", "outputs", "input")


COMPENSATION_DOCUMENT = ("run_id", "flow", "step", "input", "output")


def _can_fail_its_run(flow: Flow, step: Step) -> bool:
    """Whether ``step`` may fail its run: out of attempts (or its wait or child run given up)
    with ``when_exhausted: fail``, its condition unmet with ``when_unmet: fail``, or an output
    that a map step after it cannot map."""
    has_condition = step.condition_if is not None or step.condition_unless is not None
    return (step.when_exhausted == "fail" or (has_condition and step.when_unmet == "fail")
            or any(s.type == "map" and step.slug in s.needs for s in flow.steps))


def _handler_can_run(flow: Flow, entry: Entry, state: Analysis) -> None:
    """A flow whose runs can never fail never starts its failure handler, unless a
    cancelled run starts it too."""
    if flow.on_failure_on_cancel or flow.deadline is not None \
            or any(_can_fail_its_run(flow, step) for step in flow.steps):
        return
    state.findings.append(entry.doc.diagnostic(
        ("on_failure", "flow"), codes.FAILURE_HANDLER_NEVER_RUNS,
        f"flow `{flow.slug}` names a failure handler, but its runs can never fail: every step "
        "gives up with `when_exhausted: skip` or `skip-cascade`, and the flow has no deadline",
        "remove `on_failure:`, add `on_cancel: true` to handle cancelled runs, or let a step "
        "fail the run (`when_exhausted: fail`)"))


def _compensation_can_run(flow: Flow, step: Step, entry: Entry, state: Analysis) -> None:
    """A compensation runs when its step completed and the run then fails: some step that
    may still run after it (one it does not depend on) must be able to fail the run, or the
    flow's deadline pass while it runs."""
    before = toposort.ancestors(step.slug, {s.slug: list(s.needs) for s in flow.steps})
    later = [s for s in flow.steps if s.slug != step.slug and s.slug not in before]
    if (later and flow.deadline is not None) or any(_can_fail_its_run(flow, s) for s in later):
        return
    if later:
        why = (f"the steps that may still run after it ({listing([s.slug for s in later])}) never "
               "fail the run and the flow has no deadline")
        help = ("remove `compensate:`, or let one of those steps fail the run (`when_exhausted: "
                "fail`)")
    else:
        why = ("every other step has completed or been skipped before it runs, so its completion "
               "completes the run")
        help = (f"remove `compensate:`: a failure of `{step.slug}` itself is not compensated (it did "
                "not complete); compensate the steps before it")
    state.findings.append(entry.doc.diagnostic(
        ("steps", step.slug, "compensate", "flow"), codes.COMPENSATION_NEVER_RUNS,
        f"compensation of step `{step.slug}` can never run: it runs when the run fails after "
        f"`{step.slug}` completed, and {why}", help))


def _handler_takes_its_input(entry: Entry, path: tuple[str | int, ...], name: str,
                             fields: tuple[str, ...], state: Analysis) -> None:
    """The failure handler or compensation (an alias: its active version) accepts an object
    with ``fields``: its root step does not map the input, and its input_schema neither
    requires another field nor closes the object to one of these."""
    flow = state.flows.get(state.aliases[name].active) if name in state.aliases else state.flows.get(name)
    if flow is None:
        return  # its own findings are reported where it is declared
    what = "failure handler" if path[0] == "on_failure" else "compensation"
    problem = _refuses_fields(flow, fields)
    if problem is not None:
        state.findings.append(entry.doc.diagnostic(
            path, codes.HANDLER_REFUSES_ITS_INPUT,
                f"{what} `{name}` cannot start: flow `{flow.slug}` {problem}",
            f"a {what}'s run starts with an object of " + ", ".join(f"`{f}`" for f in fields)
            + f": make `{flow.slug}` accept it, or name another flow"))


def _refuses_fields(flow: Flow, fields: tuple[str, ...]) -> str | None:
    """Why ``flow`` refuses every object with exactly ``fields``, None when it may accept one."""
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None:
        return f"maps its run input in step `{root_map.slug}`, so its input must be a list"
    contract = flow.input_schema
    if not isinstance(contract, Mapping):
        return None
    types = contracts.types_of(contract)
    if types is not None and "object" not in types:
        return f"takes only input of type {contracts.declared_types(contract)}"
    missing = [name for name in contract.get("required", []) if name not in fields]
    if missing:
        return "requires " + ", ".join(f"`{name}`" for name in missing) + " in its input"
    if contract.get("additionalProperties") is False:
        extra = [name for name in fields if name not in contract.get("properties", {})]
        if extra:
            return ("accepts no field " + ", ".join(f"`{name}`" for name in extra)
                    + " in its input (its input_schema has additionalProperties: false)")
    return None
