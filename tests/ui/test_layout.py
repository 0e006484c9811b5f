"""The console's DAG layout (no database): consistent with `flowlane graph` for every example flow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flowlane.compiler import diagram, load_project
from flowlane.compiler.model import Flow
from flowlane.ui import layout
from tests.ui import ui_support

REPO = Path(__file__).resolve().parents[2]
FLOWS = [*load_project([REPO / "flows"]).flows, *load_project([ui_support.PROJECT / "flows"]).flows]


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.slug)
def test_one_node_per_step_one_lane_per_queue_in_the_order_of_flowlane_graph(flow: Flow) -> None:
    drawn = layout.layout(flow)
    mermaid_lanes = re.findall(r'subgraph q\d+\["queue: ([a-z0-9_]+)"\]', diagram.mermaid(flow))
    assert [lane.queue for lane in drawn.lanes] == mermaid_lanes
    assert sorted(n.slug for n in drawn.nodes) == sorted(s.slug for s in flow.steps)
    assert len(drawn.edges) == sum(len(s.needs) for s in flow.steps)
    lanes = {lane.queue: lane for lane in drawn.lanes}
    column = layout.layers(flow)
    for node in drawn.nodes:
        step = flow.step(node.slug)
        lane = lanes[step.queue]
        assert lane.y <= node.y - layout.STACK and node.y + layout.NODE_H <= lane.y + lane.height
        assert node.label == diagram.label(step)
        assert all(column[need] < column[step.slug] for need in step.needs)  # edges point right
    boxes = [(n.x, n.y) for n in drawn.nodes]
    assert len(set(boxes)) == len(boxes)  # no two steps drawn on top of each other


def test_marks_statuses_and_long_names() -> None:
    flow = load_project([ui_support.PROJECT / "flows"]).flow("orders_v1")
    drawn = {n.slug: n for n in layout.layout(flow, {"fetch": "completed", "price": "failed"}).nodes}
    assert drawn["price"].kind == "map" and not drawn["price"].conditional
    assert drawn["notify"].conditional and drawn["notify"].label == "notify (if)"
    statuses = (drawn["fetch"].status, drawn["price"].status, drawn["report"].status)
    assert statuses == ("completed", "failed", None)
    assert layout.layers(flow) == {"fetch": 0, "price": 1, "audit": 1, "notify": 2, "report": 2}
    # price and audit share a column but not a lane; in one lane they would stack
    assert drawn["price"].x == drawn["audit"].x and drawn["price"].y != drawn["audit"].y
