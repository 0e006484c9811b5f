"""Flow diagrams: Mermaid (default) or Graphviz dot, with queues as lanes."""

from __future__ import annotations

from collections.abc import Callable

from flowlane.compiler.model import Flow, Step

FORMATS = ("mermaid", "dot")


# the lane of the steps without a queue (wait and child-flow steps); no queue name can look
# like it
SIGNALS = "(no queue)"


def lane_title(lane: str) -> str:
    return "no queue: signals and child flows" if lane == SIGNALS else f"queue: {lane}"


def label(step: Step) -> str:
    """The step slug with its marks: map, wait, flow: CHILD, if, unless."""
    marks: list[str] = []
    if step.type in ("map", "wait"):
        marks.append(step.type)
    if step.flow is not None:
        marks.append(f"flow: {step.flow}")
    if step.condition_if is not None:
        marks.append("if")
    if step.condition_unless is not None:
        marks.append("unless")
    return step.slug + (f" ({', '.join(marks)})" if marks else "")


def lanes(flow: Flow) -> list[tuple[str, list[Step]]]:
    """The flow's queues in order of first use, each with its steps (one lane per queue);
    steps without a queue (wait and child-flow steps) in a lane of their own, :data:`SIGNALS`."""
    by_queue: dict[str, list[Step]] = {}
    for step in flow.steps:
        by_queue.setdefault(step.queue or SIGNALS, []).append(step)
    return list(by_queue.items())


def mermaid(flow: Flow, title: str | None = None) -> str:
    """A ``flowchart`` with one subgraph per queue; map steps as stacked boxes,
    conditional steps as hexagons, wait steps as stadiums, edges into conditional steps
    dotted."""
    lines = ["---", f"title: {title or flow.slug}", "---", "flowchart TD"]
    for index, (queue, steps) in enumerate(lanes(flow)):
        lines.append(f'  subgraph q{index}["{lane_title(queue)}"]')
        lines.extend(f"    {_mermaid_node(step)}" for step in steps)
        lines.append("  end")
    for step in flow.steps:
        arrow = "-.->" if is_conditional(step) else "-->"
        lines.extend(f"  s_{need} {arrow} s_{step.slug}" for need in sorted(step.needs))
    return "\n".join(lines) + "\n"


def is_conditional(step: Step) -> bool:
    """A step with an ``if`` or ``unless`` condition."""
    return step.condition_if is not None or step.condition_unless is not None


def _mermaid_node(step: Step) -> str:
    text = label(step)
    if is_conditional(step):
        return f's_{step.slug}{{{{"{text}"}}}}'
    if step.flow is not None:  # a linked box: the child flow's own diagram
        return f's_{step.slug}[/"{text}"/]'
    if step.type == "map":
        return f's_{step.slug}[["{text}"]]'
    if step.type == "wait":
        return f's_{step.slug}(["{text}"])'
    return f's_{step.slug}["{text}"]'


def dot(flow: Flow, title: str | None = None) -> str:
    """A ``digraph`` with one ``cluster`` per queue."""
    lines = [f'digraph "{flow.slug}" {{', f'  label="{title or flow.slug}";', "  labelloc=t;",
             "  rankdir=TB;", "  node [shape=box];"]
    for index, (queue, steps) in enumerate(lanes(flow)):
        lines.append(f'  subgraph "cluster_{index}" {{')
        lines.append(f'    label="{lane_title(queue)}";')
        lines.extend(f"    {_dot_node(step)}" for step in steps)
        lines.append("  }")
    for step in flow.steps:
        style = " [style=dashed]" if is_conditional(step) else ""
        lines.extend(f'  "{need}" -> "{step.slug}"{style};' for need in sorted(step.needs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_node(step: Step) -> str:
    attrs = [f'label="{label(step)}"']
    if step.type == "map" and step.flow is None:
        attrs.append("shape=box3d")
    if step.type == "wait":
        attrs.append("shape=oval, style=dashed")
    if step.flow is not None:
        attrs.append(f'shape=component, tooltip="flowlane graph {step.flow}"')
    if is_conditional(step):
        attrs.append("shape=hexagon")
    return f'"{step.slug}" [{", ".join(attrs)}];'


RENDERERS: dict[str, Callable[[Flow, str | None], str]] = {"mermaid": mermaid, "dot": dot}


def render(flow: Flow, fmt: str = "mermaid", title: str | None = None) -> str:
    """The diagram of ``flow``; ``title`` defaults to the flow slug."""
    return RENDERERS[fmt](flow, title)
