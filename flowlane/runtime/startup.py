"""A worker's startup checks, before it claims anything: its deployment is enabled, every
flow it serves is in the database with the YAML's shape, it covers every (flow, step) the
database routes to its queue; then it registers (which checks the flag again, atomically).

Workers never write definitions: ``compile=True`` (development databases) creates missing
flows with the same SQL ``flowlane apply`` runs, and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from flowlane import errors
from flowlane.compiler.model import Project
from flowlane.compiler.shape import flow_shape
from flowlane.core import db, definitions
from flowlane.runtime import log
from flowlane.runtime.migration_hint import missing_core_hint
from flowlane.runtime.registry import source_line
from flowlane.runtime.store import Pairs, Store, UnservedPair


@dataclass(frozen=True)
class StartupChecks:
    """What one worker checks before it serves ``queue`` as deployment ``name``."""

    project: Project
    flows: Sequence[str]  # the concrete flows served
    queue: str
    name: str
    pairs: Pairs
    worker_id: str
    compile: bool
    notify: bool

    async def run(self, store: Store) -> None:
        with missing_core_hint(), db.wrap_errors("worker startup"):
            await self._refuse_if_disabled(store)  # first: a supervisor must see exit status 3
            await self._verify_flows(store)
            await self._check_coverage(store)
            if self.notify:
                await store.enable_notify(self.queue)
            await self._register(store)

    async def _verify_flows(self, store: Store) -> None:
        """Every flow served must be in the database with the YAML's shape."""
        missing, problems = await compare_flows(store, self.project, self.flows)
        if problems:
            raise errors.WorkerError(
                "the database holds flows whose shape differs from the YAML:\n  "
                + "\n  ".join(problems.values()),
                hint="a structural change needs a new flow slug (e.g. _v2) and an alias move; "
                "`flowlane plan` shows every difference",
            )
        if missing and len(await self._create_missing(store, missing)) < len(missing):
            await self._verify_flows(store)  # created meanwhile by another writer: check as found

    async def _create_missing(self, store: Store, missing: list[str]) -> tuple[str, ...]:
        if not self.compile:
            raise errors.WorkerError(
                "flows missing from the database: " + ", ".join(missing),
                hint="apply the reviewed SQL first: `flowlane compile`, review, `flowlane apply` "
                "(on a development database, `flowlane worker --compile` creates them)",
            )
        created = await asyncio.to_thread(definitions.create_flows, self.project, missing, store.dsn)
        log.event(logging.INFO, "flows_compiled", flows=",".join(created))
        return created

    async def _check_coverage(self, store: Store) -> None:
        gaps = await store.coverage(self.queue, self.pairs)
        if gaps:
            raise errors.WorkerError(
                f"this worker does not serve every (flow, step) routed to queue {self.queue}:\n  "
                + "\n  ".join(gap_line(g) for g in gaps),
                hint="serve them too (list the flows in the queue's `kind: worker` document or "
                "--flows), or start another deployment for them before this one",
            )

    async def _refuse_if_disabled(self, store: Store) -> None:
        found = await store.deployment(self.name)
        if found is not None and not found.enabled:
            raise self._disabled(found.reason or "no reason given")

    async def _register(self, store: Store) -> None:
        """Registration checks the flag again, atomically (it may change during startup)."""
        try:
            await store.register(self.worker_id, self.queue, self.name, self.name, self.pairs)
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:
            if "FLOWLANE_DEPLOYMENT_DISABLED" not in str(exc):
                raise
            raise self._disabled(_disabled_reason(exc)) from exc

    def _disabled(self, reason: str) -> errors.WorkerDisabled:
        return errors.WorkerDisabled(
            f"worker deployment {self.name} is disabled: {reason}",
            hint=f"after fixing the cause, run `flowlane worker enable {self.name}`",
        )


async def compare_flows(
    store: Store, project: Project, flows: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """The flows missing from the database, and one paragraph per flow whose shape there
    differs from the YAML's (read-only: the database's words for each difference)."""
    missing: list[str] = []
    problems: dict[str, str] = {}
    for slug in flows:
        flow = project.flow(slug)
        check = await store.verify_flow(slug, flow_shape(flow))
        if check.status == "missing":
            missing.append(slug)
        elif check.status == "mismatch":
            differences = check.differences or ("(no details)",)
            problems[slug] = (f"flow {slug} ({source_line(flow.location, slug)}):\n    "
                              + "\n    ".join(differences))
        else:
            log.event(logging.INFO, "flow_checked", flow=slug, status=check.status)
    return missing, problems


def gap_line(gap: UnservedPair) -> str:
    return f"{gap.flow_slug}.{gap.step_slug} (needed by: {', '.join(gap.sources)})"


def _disabled_reason(exc: psycopg.Error) -> str:
    message = exc.diag.message_primary or str(exc)
    return message.partition(" is disabled: ")[2] or message
