"""The validated project: frozen dataclasses built only from documents that passed every check."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flowlane import defaults

StepType = Literal["single", "map", "wait"]
QueueMode = Literal["flow", "per-step", "explicit"]
Mode = Literal["skip", "skip-cascade", "fail"]


@dataclass(frozen=True)
class Location:
    """Where something was declared: display path and 1-based line and column."""

    path: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` started at once per value of the run input at ``key`` (a JSON
    pointer; None: one bucket)."""

    limit: int
    key: str | None = None
    when_full: str = "queue"  # a flow's: queue, replace_waiting or cancel_running

    def __str__(self) -> str:
        text = f"{self.limit} per {self.key}" if self.key else f"{self.limit}"
        return text if self.when_full == "queue" else f"{text}, when full {self.when_full}"


@dataclass(frozen=True)
class StepCache:
    """A step's tasks reuse a completed task's output for ``ttl`` seconds when their key is the
    same: the task's whole input, or the values at the ``key`` pointers into it."""

    ttl: int
    key: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return f"{self.ttl}s" if self.key is None else f"{self.ttl}s per {', '.join(self.key)}"


@dataclass(frozen=True)
class Step:
    """One step of a concrete flow, with its resolved queue. A wait step and a child-flow
    step (``flow``: a flow slug or alias) have neither a handler nor a queue."""

    slug: str
    index: int
    handler: str | None
    queue: str | None
    needs: tuple[str, ...] = ()
    type: StepType = "single"
    condition_if: Mapping[str, Any] | None = None
    condition_unless: Mapping[str, Any] | None = None
    when_unmet: Mode = "skip"
    when_exhausted: Mode = "fail"
    max_attempts: int | None = None
    base_delay: int | None = None
    timeout: int | None = None
    start_delay: int | None = None
    description: str | None = None
    output_schema: Mapping[str, Any] | None = None  # the contract's shape form
    flow: str | None = None
    concurrency: Concurrency | None = None
    compensate: str | None = None  # the flow or alias that undoes the step when its run fails
    cache: StepCache | None = None  # completed outputs reused for tasks with the same key
    location: Location | None = field(default=None, compare=False)
    handler_location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Debounce:
    """A flow's starts of one key collapse into one run that begins with the last input once
    ``period`` seconds pass without another start, or ``max_wait`` seconds after the first."""

    period: int
    key: str | None = None
    max_wait: int | None = None

    def __str__(self) -> str:
        text = f"{self.period}s per {self.key}" if self.key else f"{self.period}s"
        return text if self.max_wait is None else f"{text}, at most {self.max_wait}s"


@dataclass(frozen=True)
class Flow:
    """A concrete, immutable flow version; steps in ``step_index`` order."""

    slug: str
    queue_mode: QueueMode
    steps: tuple[Step, ...]
    max_attempts: int = defaults.MAX_ATTEMPTS
    base_delay: int = defaults.BASE_DELAY
    timeout: int = defaults.TIMEOUT
    retention: int | None = defaults.RETENTION  # seconds; None keeps finished runs for ever
    deadline: int | None = None  # seconds a run may take from its start
    dedup_key: str | None = None  # JSON pointer into the input: each run's idempotency key
    concurrency: Concurrency | None = None  # started runs at once, per key value
    priority: int | None = None  # claims on a queue take higher priorities first
    debounce: Debounce | None = None  # starts of one key collapse into one later run
    on_failure: str | None = None  # the flow or alias a failed run starts, with the failure as input
    on_failure_on_cancel: bool = False  # ... and a cancelled one
    description: str | None = None
    input_schema: Mapping[str, Any] | None = None  # the contract's shape form
    location: Location | None = field(default=None, compare=False)

    def step(self, slug: str) -> Step:
        for step in self.steps:
            if step.slug == slug:
                return step
        raise KeyError(slug)

    @property
    def queues(self) -> tuple[str, ...]:
        """Distinct queues this flow routes to, sorted."""
        return tuple(sorted({s.queue for s in self.steps if s.queue is not None}))

    @property
    def owned_queues(self) -> tuple[str, ...]:
        """Queues owned by this flow (default and per-step routing); explicit ones are shared."""
        return () if self.queue_mode == "explicit" else self.queues

    def steps_on(self, queue: str) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.queue == queue)

    @property
    def source(self) -> str:
        return self.location.path if self.location else ""


@dataclass(frozen=True)
class Alias:
    """A stable name: new runs start ``active``; ``draining`` versions may still run."""

    slug: str
    active: str
    draining: tuple[str, ...] = ()
    description: str | None = None
    location: Location | None = field(default=None, compare=False)

    @property
    def versions(self) -> tuple[str, ...]:
        return (self.active, *self.draining)


@dataclass(frozen=True)
class WorkerDoc:
    """A worker deployment polling one queue for the listed flows and aliases; limits it
    leaves out are the defaults every worker gets (``flowlane.defaults``)."""

    name: str
    queue: str
    flows: tuple[str, ...]
    max_concurrent: int = defaults.MAX_CONCURRENT
    batch_size: int = defaults.BATCH_SIZE
    description: str | None = None
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Schedule:
    """Runs of ``flow`` started on a cron expression (its fields' values) or every
    ``every`` seconds; exactly one of the two is set."""

    name: str
    flow: str
    cron: str | None = None
    cron_fields: tuple[tuple[int, ...] | None, ...] | None = None  # minutes hours days months weekdays
    every: int | None = None
    timezone: str = "UTC"
    input: Any = field(default_factory=dict)
    overlap: Literal["skip", "allow"] = "skip"
    catch_up: Literal["latest", "none", "all"] = "latest"
    description: str | None = None
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Trigger:
    """Runs of ``flow`` started when rows of ``table`` change (``events``); ``when`` and
    ``unless`` are containment patterns on the event ``{op, old, new}``, ``input`` maps run
    input fields to JSON pointers into it (None: the row), ``key`` points at its idempotency key."""

    name: str
    flow: str
    table: str
    events: tuple[str, ...]
    when: Mapping[str, Any] | None = None
    unless: Mapping[str, Any] | None = None
    input: Mapping[str, str] | None = None
    key: str | None = None
    on_refused: Literal["fail", "record"] = "fail"
    description: str | None = None
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Webhook:
    """An HTTP endpoint (``/<name>``) whose verified deliveries start runs of ``flow`` or, with
    ``signal_step``, signal that wait step of the run ``signal_run`` points at; ``input`` maps
    run input fields to JSON pointers into the body (None: the body). Runtime configuration,
    read by the webhook server: nothing of it is compiled to SQL."""

    name: str
    scheme: Literal["standard", "github"]
    secret_env: str
    flow: str
    input: Mapping[str, str] | None = None
    signal_step: str | None = None
    signal_run: str | None = None
    max_body: int = 1048576
    description: str | None = None
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class QueueLimits:
    """A ``kind: queue`` document: a queue's limits across all workers (None: no such limit);
    ``rate_limit`` starts per ``rate_per`` seconds; ``archive`` False: the messages of its
    ended tasks are deleted instead of archived."""

    name: str
    concurrency: int | None = None
    rate_limit: int | None = None
    rate_per: int | None = None
    archive: bool = True
    description: str | None = None
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class HandlerRef:
    """A (flow, step) pair, its queue and the ``module:callable`` that runs it."""

    flow_slug: str
    step_slug: str
    queue: str
    handler: str
    location: Location | None = field(default=None, compare=False)
    output_schema: Mapping[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Project:
    """Every flow, alias and worker document of a project, validated.

    Built only by the compiler: ``flowlane.load_project("flows/")`` returns one or raises
    :class:`flowlane.errors.CompileError` (with ``.diagnostics``) unless every document
    is valid.
    """

    flows: tuple[Flow, ...] = ()
    aliases: tuple[Alias, ...] = ()
    workers: tuple[WorkerDoc, ...] = ()
    schedules: tuple[Schedule, ...] = ()
    queue_limits: tuple[QueueLimits, ...] = ()  # sorted by name
    triggers: tuple[Trigger, ...] = ()  # sorted by name
    webhooks: tuple[Webhook, ...] = ()  # sorted by name

    def flow(self, slug: str) -> Flow:
        """The concrete flow named ``slug`` (exact match)."""
        for flow in self.flows:
            if flow.slug == slug:
                return flow
        raise KeyError(slug)

    def alias(self, slug: str) -> Alias:
        for alias in self.aliases:
            if alias.slug == slug:
                return alias
        raise KeyError(slug)

    def has_flow(self, slug: str) -> bool:
        return any(f.slug == slug for f in self.flows)

    def has_alias(self, slug: str) -> bool:
        return any(a.slug == slug for a in self.aliases)

    def resolve(self, name: str) -> Flow:
        """A concrete flow for a flow slug or the active version of an alias."""
        if self.has_alias(name):
            return self.flow(self.alias(name).active)
        return self.flow(name)

    def versions(self, name: str) -> tuple[Flow, ...]:
        """The concrete flows a name stands for: an alias = active + draining."""
        if self.has_alias(name):
            return tuple(self.flow(slug) for slug in self.alias(name).versions)
        return (self.flow(name),)

    @property
    def queues(self) -> tuple[str, ...]:
        return tuple(sorted({q for f in self.flows for q in f.queues}))

    def workers_on(self, queue: str) -> tuple[WorkerDoc, ...]:
        return tuple(w for w in self.workers if w.queue == queue)

    def handlers(self, queue: str | None = None, flows: Iterable[str] | None = None
                 ) -> tuple[HandlerRef, ...]:
        """Handler references, optionally only those routed to ``queue`` by ``flows``
        (flow slugs or aliases; an alias = its active and draining versions)."""
        chosen = self.flows if flows is None else _unique(
            f for name in flows for f in self.versions(name)
        )
        return tuple(
            HandlerRef(f.slug, s.slug, s.queue, s.handler, s.handler_location, s.output_schema)
            for f in chosen
            for s in f.steps
            if s.queue is not None and s.handler is not None
            and (queue is None or s.queue == queue)
        )

    def routed_pairs(self, queue: str, flows: Iterable[str] | None = None
                     ) -> frozenset[tuple[str, str]]:
        """The (flow_slug, step_slug) pairs routed to ``queue``."""
        return frozenset((h.flow_slug, h.step_slug) for h in self.handlers(queue, flows))


def _unique(flows: Iterable[Flow]) -> tuple[Flow, ...]:
    seen: dict[str, Flow] = {}
    for flow in flows:
        seen.setdefault(flow.slug, flow)
    return tuple(seen.values())
