"""The compiler's checks that a failure handler and a compensation can run and can start:
what it refuses is in the golden cases; here, what it must let through."""

from __future__ import annotations

from flowlane.compiler import api

UNDO = "---\nkind: flow\nslug: undo\nsteps:\n  u: {handler: m:u}\n"


def _codes(flow: str, more: str = UNDO) -> list[str]:
    return [d.code for d in api.validate_text(flow + more)]


def test_a_compensation_runs_when_a_step_beside_it_can_still_fail() -> None:
    flow = ("kind: flow\nslug: f\nsteps:\n"
            "  a: {handler: m:a, compensate: {flow: undo}}\n"
            "  b: {handler: m:b}\n")
    assert _codes(flow) == []


def test_a_compensation_runs_when_the_deadline_can_pass_after_its_step() -> None:
    flow = ("kind: flow\nslug: f\ndefaults: {deadline: 1h}\nsteps:\n"
            "  a: {handler: m:a, compensate: {flow: undo}}\n"
            "  b: {needs: [a], handler: m:b, when_exhausted: skip}\n")
    assert _codes(flow) == []


def test_a_deadline_does_not_help_the_step_every_other_step_leads_to() -> None:
    flow = ("kind: flow\nslug: f\ndefaults: {deadline: 1h}\nsteps:\n"
            "  a: {handler: m:a}\n"
            "  b: {needs: [a], handler: m:b, compensate: {flow: undo}}\n")
    assert _codes(flow) == ["FL145"]


def test_an_unmet_condition_that_fails_or_a_map_that_cannot_map_can_fail_the_run() -> None:
    unmet = ("kind: flow\nslug: f\non_failure: {flow: undo}\nsteps:\n"
             "  a: {handler: m:a, when_exhausted: skip, compensate: {flow: undo}}\n"
             "  b: {needs: [a], handler: m:b, when_exhausted: skip, if: {a: {go: true}}, "
             "when_unmet: fail}\n")
    mapped = ("kind: flow\nslug: f\non_failure: {flow: undo}\nsteps:\n"
              "  a: {handler: m:a, when_exhausted: skip, compensate: {flow: undo}}\n"
              "  b: {needs: [a], handler: m:b, when_exhausted: skip}\n"
              "  c: {needs: [b], type: map, handler: m:c, when_exhausted: skip}\n")
    assert _codes(unmet) == []
    assert _codes(mapped) == []


def test_a_failure_handler_of_a_flow_that_never_fails_may_handle_its_cancelled_runs() -> None:
    flow = ("kind: flow\nslug: f\non_failure: {flow: undo, on_cancel: true}\nsteps:\n"
            "  a: {handler: m:a, when_exhausted: skip}\n")
    assert _codes(flow) == []
    assert _codes(flow.replace(", on_cancel: true", "")) == ["FL146"]


def test_a_handler_whose_contract_takes_the_document_starts_through_its_alias() -> None:
    flow = ("kind: flow\nslug: f\non_failure: {flow: report}\nsteps:\n"
            "  a: {handler: m:a, compensate: {flow: report}}\n"
            "  b: {needs: [a], handler: m:b}\n")
    handler = ("---\nkind: flow\nslug: report_v1\n"
               "input_schema: {type: object, required: [run_id, flow],\n"
               "  properties: {run_id: {type: string}}}\n"
               "steps:\n  r: {handler: m:r}\n---\nkind: alias\nslug: report\nactive: report_v1\n")
    assert _codes(flow, handler) == []
    closed = handler.replace("type: object,", "type: object, additionalProperties: false,")
    assert _codes(flow, closed) == ["FL147", "FL147"]
