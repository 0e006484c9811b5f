"""Which queue a worker polls and which (flow, step) pairs it must serve.

``--flow F`` (one queue per flow: inferred), ``--flow F --step S`` (per-step
queues: the step is required), ``--queue Q`` (any routing; the registry comes
from the ``kind: worker`` documents for Q, else every step routed to Q), or
``--name D`` alone (the queue and registry of the ``kind: worker`` document D).
"""

from __future__ import annotations

from dataclasses import dataclass

from flowlane import errors
from flowlane.compiler.model import HandlerRef, Project, WorkerDoc


@dataclass(frozen=True)
class Selection:
    queue: str
    handlers: tuple[HandlerRef, ...]
    deployment: WorkerDoc | None = None

    @property
    def flows(self) -> list[str]:
        return sorted({h.flow_slug for h in self.handlers})

    @property
    def default_name(self) -> str:
        return self.deployment.name if self.deployment else self.queue


def select(
    project: Project,
    *,
    queue: str | None = None,
    flow: str | None = None,
    step: str | None = None,
    flows: list[str] | None = None,
    name: str | None = None,
) -> Selection:
    if queue is not None:
        if flow is not None or step is not None:
            raise errors.UsageError(
                "--queue cannot be combined with --flow/--step",
                hint="use --flows to narrow the flows served from the queue",
            )
        return _by_queue(project, queue, flows)
    if flow is None:
        named = [w for w in project.workers if name is not None and w.name == name]
        if named and step is None:  # `--name D` alone: the `kind: worker` document named D
            return _by_queue(project, named[0].queue, flows, named[0])
        documents = sorted(w.name for w in project.workers)
        if name is not None and not named:
            raise errors.UsageError(
                f"no `kind: worker` document is named {name!r}",
                hint=f"worker documents: {', '.join(documents) or '(none)'}; "
                "or select the queue with --queue Q, --flow F or --flow F --step S",
            )
        raise errors.UsageError(
            "a worker needs --queue Q, --flow F, --flow F --step S, or --name of a worker document"
        )
    return _by_flow(project, flow, step)


def _by_flow(project: Project, name: str, step_slug: str | None) -> Selection:
    try:
        flow = project.resolve(name)
    except KeyError:
        raise errors.UsageError(
            f"unknown flow {name!r}",
            hint=f"known flows: {', '.join(sorted(f.slug for f in project.flows)) or '(none)'}"
            + (f"; aliases: {', '.join(sorted(a.slug for a in project.aliases))}"
               if project.aliases else ""),
        ) from None
    _refuse_split_alias(project, name)
    slug = flow.slug
    if flow.queue_mode == "flow":
        if step_slug is not None:
            raise errors.UsageError(
                f"flow {slug} runs every step on its queue {flow.queues[0]}; --step is not allowed",
                hint=f"run `flowlane worker --flow {slug}`",
            )
        # an alias: every version (all route to this queue), so draining runs finish
        return Selection(flow.queues[0], project.handlers(flows=[name]))
    if flow.queue_mode == "per-step":
        if step_slug is None:
            raise errors.UsageError(
                f"flow {slug} uses per-step queues; --step is required",
                hint="start one worker per step: "
                + ", ".join(f"--flow {slug} --step {s.slug}" for s in flow.steps),
            )
        try:
            step = flow.step(step_slug)
        except KeyError:
            raise errors.UsageError(
                f"flow {slug} has no step {step_slug!r}",
                hint=f"steps: {', '.join(s.slug for s in flow.steps)}",
            ) from None
        if step.queue is None:
            raise errors.UsageError(
                f"step {step_slug} of flow {slug} is a wait step: no worker serves it",
                hint="a signal completes it: flowlane signal RUN_ID " + step_slug,
            )
        handlers = project.handlers(step.queue, [slug])
        return Selection(step.queue, tuple(h for h in handlers if h.step_slug == step.slug))
    raise errors.UsageError(
        f"flow {slug} routes its steps to explicit queues; select one with --queue",
        hint="queues: " + ", ".join(flow.queues),
    )


def _refuse_split_alias(project: Project, name: str) -> None:
    """``--flow ALIAS`` names one queue only when every version routes the same way;
    otherwise serving the active version's queue would strand the draining ones."""
    if not project.has_alias(name):
        return
    versions = project.versions(name)
    if len({f.queues for f in versions}) == 1:
        return
    queues = sorted({q for f in versions for q in f.queues})
    raise errors.UsageError(
        f"the versions of alias {name} route their steps to different queues: "
        + "; ".join(f"{f.slug}: {', '.join(f.queues)}" for f in versions),
        hint="start one worker per queue: "
        + ", ".join(f"`flowlane worker --queue {q} --flows {name}`" for q in queues),
    )


def _by_queue(
    project: Project,
    queue: str,
    names: list[str] | None,
    deployment: WorkerDoc | None = None,
) -> Selection:
    if deployment is None:
        deployments = project.workers_on(queue)
        deployment = deployments[0] if len(deployments) == 1 and names is None else None
    if names is None and deployment is not None:
        names = list(deployment.flows)
    chosen = None if names is None else [_known(project, name) for name in names]
    handlers = project.handlers(queue, chosen)
    if not handlers:
        raise errors.UsageError(
            f"no step of {'the project' if names is None else ', '.join(names)} "
            f"is routed to queue {queue!r}",
            hint=f"queues in this project: {', '.join(project.queues) or '(none)'}",
        )
    return Selection(queue, handlers, deployment)


def _known(project: Project, name: str) -> str:
    """A flow slug or alias as the project spells it (names given on the command line
    match case-insensitively)."""
    if project.has_flow(name) or project.has_alias(name):
        return name
    folded = {s.lower(): s for s in [*(f.slug for f in project.flows),
                                     *(a.slug for a in project.aliases)]}
    if name.lower() not in folded:
        raise errors.UsageError(
            f"unknown flow or alias {name!r}",
            hint=f"flows and aliases: {', '.join(sorted(folded.values())) or '(none)'}",
        )
    return folded[name.lower()]
