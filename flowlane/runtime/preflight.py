"""Can serve's workers start from the project as it is on disk now? ``flowlane serve``
asks before it stops a running worker for a change (a handler or flow file edited, the
definitions changed), so that it never trades working workers for code that cannot start.

The check is the workers' own startup check, minus what only a registering worker does:
every worker's handlers are imported (the same selection and import paths) and every flow
of the project is compared with the database (the same read-only shape comparison). It runs
in a child process (``python -m flowlane.runtime.preflight JSON``), so that the handler
modules are imported fresh; it prints its :class:`Verdict` as JSON on stdout, and the
error, whole, on stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from flowlane import errors
from flowlane.compiler.model import Project
from flowlane.runtime.config import WorkerConfig

READY, UNAPPLIED, BROKEN = "ready", "unapplied", "broken"


@dataclass(frozen=True)
class Verdict:
    """``ready``; ``unapplied`` (the YAML of ``flows`` differs from the database); or
    ``broken`` (the project or a handler module does not load). ``message``: why, whole."""

    status: str
    flows: tuple[str, ...] = ()
    message: str = ""


def command(paths: Sequence[str], options: WorkerConfig) -> list[str]:
    """The command that checks the project under ``paths`` for workers given ``options``."""
    spec = {"paths": [os.path.abspath(p) for p in paths], "config": options.changed()}
    return [sys.executable, "-m", "flowlane.runtime.preflight", json.dumps(spec)]


def check(paths: Sequence[str], options: WorkerConfig) -> Verdict:
    """Load the project, import every worker's handlers, compare every flow with the
    database (``FLOWLANE_DSN``)."""
    from flowlane.compiler.api import load_project
    from flowlane.runtime.registry import HandlerRegistry
    from flowlane.runtime.serve import plan_workers
    from flowlane.runtime.worker import Worker

    try:
        project = load_project(list(paths))
        workers = [Worker(project, spec.config) for spec in plan_workers(project, options)]
        handlers = {(h.flow_slug, h.step_slug): h for w in workers for h in w.selection.handlers}
        import_paths = dict.fromkeys(p for w in workers for p in w.import_paths)
        HandlerRegistry.load(handlers.values(), import_paths)
        return asyncio.run(_compare(project, options))
    except errors.FlowlaneError as exc:
        return Verdict(BROKEN, message=exc.lines())


async def _compare(project: Project, options: WorkerConfig) -> Verdict:
    from flowlane.core import db
    from flowlane.runtime.startup import compare_flows
    from flowlane.runtime.store import Store

    store = Store(db.resolve(options.dsn).dsn, application_name="flowlane-serve-check")
    with db.wrap_errors("serve's check of the new code"):
        await store.open()
        try:
            missing, different = await compare_flows(store, project, [f.slug for f in project.flows])
        finally:
            await store.close()
    if options.compile:
        missing = []  # the workers create them
    if not missing and not different:
        return Verdict(READY)
    lines = [*different.values(), *(f"flow {slug}: missing from the database" for slug in missing)]
    return Verdict(UNAPPLIED, tuple(sorted({*missing, *different})), "\n".join(lines))


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[0])
    verdict = check(spec["paths"], WorkerConfig.from_options(**spec["config"]))
    if verdict.message:
        print(verdict.message, file=sys.stderr)
    print(json.dumps(asdict(verdict)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
