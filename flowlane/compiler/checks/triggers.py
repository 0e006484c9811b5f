"""Trigger documents: flows started by changes of a table's rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowlane.compiler import codes
from flowlane.compiler.checks.shared import Analysis, Entry, check_mapped_fields, named_once, start_target
from flowlane.compiler.loader import unstorable
from flowlane.compiler.model import Flow, Trigger


def build_triggers(entries: list[Entry], state: Analysis) -> list[Trigger]:
    return named_once(entries, state, _build_trigger, codes.DUPLICATE_TRIGGER,
                      "trigger name `{name}` is already used",
                      "give each trigger a distinct `name`")


def _build_trigger(entry: Entry, state: Analysis) -> Trigger | None:
    data = entry.data
    before = len(state.findings)
    events = tuple(sorted(set(data["events"])))
    target = start_target(entry, state, codes.TRIGGER_UNKNOWN_FLOW, "trigger")
    for keyword in ("when", "unless"):
        if keyword in data:
            bad = unstorable(data[keyword])
            if bad is not None:
                state.findings.append(entry.doc.diagnostic((keyword,), codes.UNSTORABLE_CONDITION,
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


def _check_event_pointer(entry: Entry, path: tuple[str | int, ...], pointer: str,
                         events: tuple[str, ...], state: Analysis) -> None:
    """A pointer into `old` or `new` finds a value for at least one of the trigger's events."""
    row = pointer.split("/")[1]
    if row == "op" or any(row in _EVENT_ROWS[event] for event in events):
        return
    state.findings.append(entry.doc.diagnostic(
        path, codes.TRIGGER_POINTER_NEVER_FOUND,
            f"trigger `{entry.slug}`: `{pointer}` points into the {row} row, which "
        f"{' and '.join(events)} events do not have",
        "an insert has only `/new`, a delete only `/old`, an update both"))


def _check_trigger_input(entry: Entry, flow: Flow, state: Analysis) -> None:
    """What the flow's input contract decides from the input's field names alone: required
    fields the mapping does not give, fields a closed object does not allow, a root map's list."""
    mapping = entry.data.get("input")
    path: tuple[str | int, ...] = ("input",) if mapping is not None else ("flow",)
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None:
        state.findings.append(entry.doc.diagnostic(
            path, codes.TRIGGER_INPUT_REFUSED,
                f"trigger `{entry.slug}`: flow `{flow.slug}` maps its run input in step "
            f"`{root_map.slug}`, so the input must be a list; a trigger's input is an object",
            "start a flow whose root step is not a map"))
        return
    contract = flow.input_schema
    if mapping is None or not isinstance(contract, Mapping):
        return  # the row's columns are known only to the database: set_trigger's start checks
    check_mapped_fields(entry, flow, mapping, contract, codes.TRIGGER_INPUT_REFUSED, state)
