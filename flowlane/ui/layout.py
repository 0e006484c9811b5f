"""A layered DAG layout with one lane per queue, drawn as SVG by ``templates/graph.svg``.

Layers are columns (a step sits one column right of its deepest need); lanes are bands,
one per queue in the order of ``flowlane graph``; steps of one lane and column stack.
Marks follow ``flowlane graph``: map steps are stacked boxes, conditional steps hexagons
with dashed incoming edges. No edge crosses a box: an edge to the next column curves through
the gap between the columns; a longer one runs along the gaps only, out of its source's
column, along the free band at a lane's edge (no box reaches it), into its target's column.
The page scales the drawing down to its width (``svg.graph`` in ``static/console.css``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flowlane.compiler import diagram
from flowlane.compiler.model import Flow

NODE_W = 180
NODE_H = 40
COL_GAP = 56
ROW_GAP = 14
LANE_PAD = 14
LABEL_W = 150
STACK = 5  # offset of the boxes behind a map step
MAX_TEXT = 24
SIDE_BY_SIDE = (0, -4, 4)  # offsets of the edges along one corridor: each band is 8 px or more


@dataclass(frozen=True)
class Node:
    slug: str
    label: str
    text: str
    queue: str
    x: int
    y: int
    kind: str  # "single" or "map"
    conditional: bool
    status: str | None

    @property
    def points(self) -> str:
        """The hexagon of a conditional step, at offset 0."""
        inset = 14
        x, y, w, h = self.x, self.y, NODE_W, NODE_H
        return " ".join(f"{px},{py}" for px, py in (
            (x + inset, y), (x + w - inset, y), (x + w, y + h // 2),
            (x + w - inset, y + h), (x + inset, y + h), (x, y + h // 2)))


@dataclass(frozen=True)
class Lane:
    queue: str
    y: int
    height: int


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str
    conditional: bool


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    lanes: tuple[Lane, ...]
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    node_w: int = NODE_W
    node_h: int = NODE_H
    stack: int = STACK


def layers(flow: Flow) -> dict[str, int]:
    """Column of each step: 0 for roots, else one more than its deepest need."""
    column: dict[str, int] = {}
    for step in flow.steps:  # step_index order is topological
        column[step.slug] = 1 + max((column[n] for n in step.needs), default=-1)
    return column


def layout(flow: Flow, statuses: Mapping[str, str | None] | None = None) -> Layout:
    statuses = statuses or {}
    column = layers(flow)
    columns = 1 + max(column.values(), default=0)
    width = LABEL_W + columns * (NODE_W + COL_GAP) + LANE_PAD
    lanes: list[Lane] = []
    nodes: dict[str, Node] = {}
    top = 0
    for queue, steps in diagram.lanes(flow):
        stacked: dict[int, int] = {}
        for step in steps:
            row = stacked.get(column[step.slug], 0)
            stacked[column[step.slug]] = row + 1
            text = diagram.label(step)
            nodes[step.slug] = Node(
                slug=step.slug, label=text,
                text=text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…",
                queue=queue,
                x=LABEL_W + column[step.slug] * (NODE_W + COL_GAP),
                y=top + LANE_PAD + STACK + row * (NODE_H + ROW_GAP + STACK),
                kind=step.type, conditional=diagram.is_conditional(step),
                status=statuses.get(step.slug),
            )
        rows = max(stacked.values())
        height = 2 * LANE_PAD + rows * (NODE_H + ROW_GAP + STACK) - ROW_GAP
        lanes.append(Lane(queue, top, height))
        top += height
    height = max(top, NODE_H)
    corridors = {y: 0 for y in _corridors(lanes, height)}  # each with the edges along it
    edges = tuple(
        _edge(nodes[need], nodes[step.slug], diagram.is_conditional(step), corridors)
        for step in flow.steps for need in sorted(step.needs)
    )
    return Layout(width, height, tuple(lanes), tuple(nodes.values()), edges)


def _corridors(lanes: list[Lane], height: int) -> list[int]:
    """The heights no box reaches: each lane's edge (the top and the bottom of the drawing
    inside it), where a lane's first row (with a map step's boxes behind it) starts
    LANE_PAD + STACK - 2 * STACK below the edge and its last row ends LANE_PAD above the next."""
    above = (LANE_PAD + STACK - 2 * STACK) // 2
    return [max(lane.y, above) for lane in lanes] + [height - LANE_PAD // 2]


def _edge(source: Node, target: Node, conditional: bool, corridors: dict[int, int]) -> Edge:
    x1, y1 = source.x + NODE_W, source.y + NODE_H // 2
    x2, y2 = target.x, target.y + NODE_H // 2
    if x2 - x1 <= COL_GAP:  # the next column: a curve inside the gap between the two
        bend = max((x2 - x1) // 2, 20)
        path = f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2 - 6},{y2}"
    else:  # boxes in between: down the gaps, along a corridor, down the gap before the target
        corridor = min(corridors, key=lambda c: (abs(y1 - c) + abs(c - y2), abs(y1 - c)))
        y = corridor + SIDE_BY_SIDE[corridors[corridor] % len(SIDE_BY_SIDE)]  # apart, in the band
        corridors[corridor] += 1
        out, into = x1 + COL_GAP // 2, x2 - COL_GAP // 2
        path = f"M{x1},{y1} H{out} V{y} H{into} V{y2} H{x2 - 6}"
    return Edge(source.slug, target.slug, path, conditional)
