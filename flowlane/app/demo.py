"""``flowlane demo``: the whole loop on the embedded database, in one command.

Compile ``flows/`` to ``sql/``, start the project's embedded PostgreSQL,
migrate, apply the compiled SQL (the only writer of definitions: the workers
only verify), start one run per entry point (every alias, every draining
version and every flow not behind an alias), serve every queue those runs
touch with one in-process worker (thread) each until the runs finish, then
print each output. The shipped examples put two flows and two versions of one
of them on the shared queue ``classify_threads``, served by one worker.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowlane import compiler, errors, project_root
from flowlane.app import deploy
from flowlane.compiler import compiled, diagnostics
from flowlane.compiler.model import Project
from flowlane.core import db, migrator
from flowlane.runtime.client import Client
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.limits import TERMINAL
from flowlane.runtime.run_state import RunState
from flowlane.runtime.worker import Worker

# sample inputs for the example flows shipped in flows/; any other flow gets {}
SAMPLE_INPUTS: dict[str, Any] = {
    "hello_world": {"name": "flowlane"},
    "diamond": {"numbers": [3, 4, 5, 6, 7]},
    "thumbnails": {"url": "https://example.com/cat.png"},
    "community_threads": {
        "threads": ["Is the API down?", "Great release, thanks", "How do I rotate keys?"],
        "urgent": True,
    },
    "community_threads_v1": {"threads": ["Started before the alias moved?"]},
    "forum_digest": {"posts": ["Release notes are out", "Does v2 support SSO?"]},
}


@dataclass(frozen=True)
class Started:
    name: str
    flow: str
    run_id: str


def run_demo(
    paths: Sequence[str], *, timeout: float = 120.0, dsn: str | None = None, out: str | None = None
) -> int:
    root = project_root.find_root()
    out = out or project_root.sql_dir()
    result = compiler.compile_paths(paths, out=out)
    if result.project is None:
        print(diagnostics.render(result.diagnostics, "text"))
        return 1
    print(f"1. {result.summary.line(out)}")

    target = (
        db.Target(dsn, "--dsn") if dsn else db.Target(db.EmbeddedDatabase(root).up(), "embedded")
    )
    where = "the embedded PostgreSQL in .flowlane/" if target.embedded else db.redact(target.dsn)
    print(f"2. database: {where}")
    with db.connect(target, autocommit=True) as conn:
        applied = migrator.migrate(conn)
        print(
            f"3. core migrations: {len(applied)} applied"
            if applied
            else "3. core migrations: up to date"
        )
    # the same path as `flowlane apply`: the reviewed files, all or nothing
    deployed = deploy.apply(paths, out, target.dsn)
    print(f"4. applied {len(deployed.files)} compiled file(s) from {out}/ in one transaction")

    project = result.project
    with Client(target.dsn) as client:
        started = [
            Started(
                name,
                project.resolve(name).slug,
                client.start(name, SAMPLE_INPUTS.get(name, {})).run_id,
            )
            for name in _entry_points(project)
        ]
    print(f"5. started {len(started)} run(s): " + ", ".join(s.name for s in started))

    queues = sorted({q for item in started for q in project.flow(item.flow).queues})
    workers = [
        Worker(
            project,
            WorkerConfig(
                queue=q,
                dsn=target.dsn,
                handle_signals=False,
                poll_interval=1.0,
                shutdown_timeout=5.0,
            ),
        )
        for q in queues
    ]
    print(f"6. serving {len(queues)} queue(s) with one in-process worker each:")
    for worker in workers:
        print(f"   {worker.queue} (deployment {worker.name}): {', '.join(worker.selection.flows)}")
    states = _serve_until_done(workers, target.dsn, started, timeout)

    print()
    ok = True
    for item in started:
        state = states.get(item.run_id)
        status = state.run.status if state else "unfinished"
        ok = ok and status == "completed"
        label = item.name if item.name == item.flow else f"{item.name} -> {item.flow}"
        print(f"run {item.run_id}  {label}: {status}")
        if state and state.run.output is not None:
            print("  output: " + json.dumps(state.run.output, ensure_ascii=False))
        elif state and state.run.error_message:
            print("  error: " + state.run.error_message)
    print()
    print(
        f"compiled SQL: {(Path(out).resolve() / compiled.FLOWS_DIR).as_posix()}/*.sql"
        f" and {(Path(out).resolve() / compiled.ALIASES_FILE).as_posix()}"
    )
    print("inspect: `flowlane runs`, `flowlane run RUN_ID`; stop the database: `flowlane db down`")
    return 0 if ok else 1


def _entry_points(project: Project) -> list[str]:
    """Every alias, every draining version (a run started before its alias moved), and
    every flow that no alias stands for; a flow whose name an alias adopted is started by
    that name no more."""
    aliases = {a.slug for a in project.aliases}
    behind_alias = {slug for alias in project.aliases for slug in alias.versions}
    draining = {slug for alias in project.aliases for slug in alias.draining}
    return sorted(aliases) + sorted(
        f.slug for f in project.flows
        if (f.slug not in behind_alias or f.slug in draining) and f.slug not in aliases
    )


def _serve_until_done(
    workers: list[Worker], dsn: str, started: list[Started], timeout: float
) -> dict[str, RunState]:
    logging.getLogger("flowlane").setLevel(logging.WARNING)
    failures: list[BaseException] = []

    def serve(worker: Worker) -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported below, after the other workers stop
            failures.append(exc)

    threads = [
        threading.Thread(target=serve, args=(w,), name=f"demo-{w.queue}", daemon=True)
        for w in workers
    ]
    for thread in threads:
        thread.start()
    states: dict[str, RunState] = {}
    deadline = time.monotonic() + timeout
    try:
        with Client(dsn) as client:
            while len(states) < len(started) and not failures and time.monotonic() < deadline:
                for item in started:
                    if item.run_id not in states:
                        state = client.get_run(item.run_id)
                        if state.run.status in TERMINAL:
                            states[item.run_id] = state
                time.sleep(0.05)
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(30)
    if failures:
        raise (
            failures[0]
            if isinstance(failures[0], errors.FlowlaneError)
            else errors.WorkerError(f"a demo worker failed: {failures[0]}")
        )
    return states
