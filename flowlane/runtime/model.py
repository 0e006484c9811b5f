"""The runtime's view of a project: what a worker needs and nothing more.

The compiler's :class:`flowlane.Project` is richer; :func:`from_project`
narrows it to these frozen records so the worker depends on a small, stable
surface (flows with their shape and routed steps, aliases, worker documents).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class HandlerRef:
    """``module:callable`` as written in YAML, with where it was written."""

    module: str
    attr: str
    source: str  # "path/to/file.yaml:LINE"

    @classmethod
    def parse(cls, text: str, source: str) -> HandlerRef:
        module, sep, attr = text.partition(":")
        if not sep:
            module, _, attr = text.rpartition(".")
        return cls(module.strip(), attr.strip(), source)

    def __str__(self) -> str:
        return f"{self.module}:{self.attr}"


@dataclass(frozen=True)
class StepSpec:
    flow_slug: str
    slug: str
    index: int
    queue: str
    handler: HandlerRef | None


@dataclass(frozen=True)
class FlowSpec:
    slug: str
    queue_mode: str  # flow | per-step | explicit
    shape: JSONDict
    steps: tuple[StepSpec, ...]
    source: str = ""

    def step(self, slug: str) -> StepSpec | None:
        return next((s for s in self.steps if s.slug == slug), None)

    @property
    def queues(self) -> list[str]:
        return sorted({s.queue for s in self.steps})


@dataclass(frozen=True)
class AliasSpec:
    slug: str
    active: str
    draining: tuple[str, ...] = ()

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.active, *self.draining)


@dataclass(frozen=True)
class WorkerSpec:
    """A ``kind: worker`` document."""

    name: str
    queue: str
    flows: tuple[str, ...]
    max_concurrent: int = 10
    batch_size: int = 10
    source: str = ""


@dataclass(frozen=True)
class RuntimeProject:
    flows: Mapping[str, FlowSpec]
    aliases: Mapping[str, AliasSpec] = field(default_factory=dict)
    workers: tuple[WorkerSpec, ...] = ()
    root: str = "."

    def resolve(self, name: str) -> list[str]:
        """Concrete slugs a name stands for: a flow itself, or an alias's active + draining."""
        if name in self.flows:
            return [name]
        alias = self.aliases.get(name)
        if alias is None:
            folded = {slug.lower(): slug for slug in [*self.flows, *self.aliases]}
            if name.lower() in folded:
                return self.resolve(folded[name.lower()])
            return []
        return [slug for slug in alias.targets if slug in self.flows]

    def active(self, name: str) -> str | None:
        if name in self.flows:
            return name
        alias = self.aliases.get(name)
        return alias.active if alias else None

    def steps_on(self, queue: str, flows: Iterable[str] | None = None) -> list[StepSpec]:
        chosen = self.flows if flows is None else {s: self.flows[s] for s in flows}
        return [step for flow in chosen.values() for step in flow.steps if step.queue == queue]

    def workers_for(self, queue: str) -> list[WorkerSpec]:
        return [w for w in self.workers if w.queue == queue]
