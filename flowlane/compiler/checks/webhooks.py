"""Webhook documents: flows started or signalled over HTTP."""

from __future__ import annotations

from collections.abc import Mapping

from flowlane.compiler import codes
from flowlane.compiler.checks.shared import Analysis, Entry, check_mapped_fields, named_once, start_target
from flowlane.compiler.model import Flow, Webhook


def build_webhooks(entries: list[Entry], state: Analysis) -> list[Webhook]:
    return named_once(entries, state, _build_webhook, codes.DUPLICATE_WEBHOOK,
                      "webhook name `{name}` is already used",
                      "give each webhook a distinct `name`: it is the webhook's path")


def _build_webhook(entry: Entry, state: Analysis) -> Webhook | None:
    data = entry.data
    before = len(state.findings)
    target = start_target(entry, state, codes.WEBHOOK_UNKNOWN_FLOW, "webhook")
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


def _check_signalled_step(entry: Entry, flow: Flow, step: str, state: Analysis) -> None:
    found = next((s for s in flow.steps if s.slug == step), None)
    if found is not None and found.type == "wait":
        return
    waits = [s.slug for s in flow.steps if s.type == "wait"]
    state.findings.append(entry.doc.diagnostic(
        ("signal", "step"), codes.WEBHOOK_SIGNALS_NO_WAIT_STEP,
            f"webhook `{entry.slug}` signals step `{step}` of flow `{flow.slug}`, "
        + ("which is not a wait step" if found is not None else "which has no such step"),
        "name one of its wait steps: " + ", ".join(f"`{w}`" for w in waits) if waits
        else f"flow `{flow.slug}` has no wait step (`type: wait`)"))


def _check_webhook_input(entry: Entry, flow: Flow, state: Analysis) -> None:
    """A mapped input is an object: a flow whose root step maps the input cannot take it, and
    its field names must fit the flow's contract (the values come with each delivery)."""
    mapping = entry.data.get("input")
    if mapping is None:
        return
    root_map = next((s for s in flow.steps if s.type == "map" and not s.needs), None)
    if root_map is not None:
        state.findings.append(entry.doc.diagnostic(
            ("input",), codes.WEBHOOK_INPUT_REFUSED,
                f"webhook `{entry.slug}`: flow `{flow.slug}` maps its run input in step "
            f"`{root_map.slug}`, so the input must be a list; a mapped `input` is an object",
            "leave out `input` to start the flow with the delivered body"))
    elif isinstance(flow.input_schema, Mapping):
        check_mapped_fields(entry, flow, mapping, flow.input_schema, codes.WEBHOOK_INPUT_REFUSED, state)
