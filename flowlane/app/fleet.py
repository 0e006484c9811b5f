"""Worker deployments, the queue registry and fenced rollouts, for operators.

A *deployment* is a named group of workers on one queue (a ``kind: worker``
document, or the queue name for ``--flow`` workers) with a persistent enabled
flag: a worker that meets work it cannot handle disables its deployment, and
no worker of a disabled deployment starts until ``enable``. A *rollout*
fences a deploy: it disables the affected deployments, waits until their live
workers stop, applies the reviewed SQL and re-enables exactly the deployments
that were enabled before it began (an interrupted rollout, run again, resumes
from its record).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flowlane import errors, project_root
from flowlane.app import deploy
from flowlane.compiler import api
from flowlane.compiler.model import Project
from flowlane.core import db
from flowlane.core.queries import query

Row = dict[str, Any]


def _rows(dsn: str | None, name: str, context: str, **params: Any) -> list[Row]:
    with (db.connect(db.resolve(dsn), autocommit=True) as conn, db.wrap_errors(context),
          conn.cursor(row_factory=dict_row) as cur):
        cur.execute(query(name), params)
        return cur.fetchall()


@dataclass(frozen=True)
class Fleet:
    """Deployments with their live workers, and the draining versions of every alias."""

    deployments: list[Row]
    draining: list[Row]


def fleet(dsn: str | None = None) -> Fleet:
    return Fleet(
        _rows(dsn, "fleet_deployments", "worker list"),
        _rows(dsn, "fleet_drain_status", "worker list"),
    )


def set_enabled(name: str, enabled: bool, reason: str | None = None, dsn: str | None = None) -> Row:
    action = "enable" if enabled else "disable"
    [row] = _rows(dsn, "fleet_set_enabled", f"worker {action} {name}",
                  deployment=name, enabled=enabled, reason=None if enabled else reason)
    return row


def queues(dsn: str | None = None) -> list[Row]:
    return _rows(dsn, "fleet_queues", "queue list")


def refuse_doubling(queues: Sequence[str], dsn: str) -> None:
    """Refuse to start a second set of workers beside live ones on the same queues (a
    ``serve`` already running, or one whose workers outlived it)."""
    rows = _rows(dsn, "fleet_live_workers_on_queues", "serve", queues=list(queues))
    if rows:
        found = "; ".join(f"{r['queue_name']}: {r['workers']} of deployment {r['deployment']} "
                          f"(heartbeat {r['heartbeat_age']}s ago)" for r in rows)
        raise errors.WorkerError(
            f"live workers already serve this project's queues: {found}",
            hint="another `flowlane serve` (or workers started by hand) is running: stop it "
            "first, or pass --beside-live-workers to run these workers beside them")


def waiting(dsn: str | None = None, run_id: str | None = None) -> list[str]:
    """Why queued work of started runs (of ``run_id``, or of every run) is not being done."""
    return waiting_reasons(_rows(dsn, "fleet_waiting_queues", "why runs wait",
                                 run_id=run_id))


def waiting_reasons(rows: list[Row]) -> list[str]:
    """One line per queue (``fleet_waiting_queues`` rows) that has no live worker or a
    disabled deployment, saying why (a worker that refused to start says its reason) and
    what to do."""
    reasons = []
    for row in rows:
        queue, tasks = row["queue_name"], f"{row['queued_tasks']} queued task(s)"
        for disabled in row["disabled"]:
            name, _, why = disabled.partition(": ")
            reasons.append(f"queue {queue}: {tasks}; worker deployment {name} is disabled "
                           f"({why}); `flowlane worker enable {name}` once its cause is fixed")
        if row["live_workers"] or row["disabled"]:
            continue
        refusals = refusal_lines(queue, row["refusals"])
        reasons.extend(f"queue {queue}: {tasks}; {line}" for line in refusals)
        if not refusals:
            reasons.append(f"queue {queue}: {tasks}; no live worker serves queue {queue}; "
                           f"`flowlane serve` or `flowlane worker --queue {queue}`")
    return reasons


def refusal_lines(queue: str, refusals: list[Row]) -> list[str]:
    """Each worker of ``queue`` that refused to start (``worker_refusals`` as the fleet
    queries give them), with its reason, when, and what to do. A reason of several lines
    (the differences of several flows) keeps them, each further line indented."""
    lines = []
    for refusal in refusals:
        name = refusal["deployment"]
        who = f"worker for queue {queue}" + (f" (deployment {name})" if name != queue else "")
        reason, hint = refusal["reason"], refusal["hint"]
        if "\n" in reason:  # a hint after several lines stands on its own
            reason, hint = reason.replace("\n", "\n    "), hint and f"\n    hint: {hint}"
        else:
            hint = hint and f"; {hint}"
        lines.append(f"{who} refused to start {ago(refusal['age'])}: {reason}{hint or ''}")
    return lines


def ago(seconds: float) -> str:
    """``12 s ago``, ``2 min ago``, ``3 h ago``, ``2 days ago``."""
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h ago"
    return f"{seconds // 86400:.0f} days ago"


def uncovered(project: Project, dsn: str | None = None) -> list[str]:
    """Per queue, the (flow, step) pairs the project routes there that its live workers do
    not serve (a new version, a new flow on a shared queue), and what will happen."""
    routed: dict[str, set[str]] = {}
    for flow in project.flows:
        for step in flow.steps:
            if step.queue is None:
                continue  # a wait step: no worker serves it
            routed.setdefault(step.queue, set()).add(f"{flow.slug}.{step.slug}")
    notes = []
    for row in _rows(dsn, "fleet_live_worker_pairs", "live workers"):
        served = {f"{flow}.{step}" for flow, step in row["pairs"]}
        missing = sorted(routed.get(row["queue_name"], set()) - served)
        if missing:
            notes.append(
                f"queue {row['queue_name']}: the live workers of deployment {row['deployment']} "
                f"do not serve {', '.join(missing)}; under `flowlane serve` they restart with the "
                "current YAML when the change is applied; other supervisors must restart them "
                "from it (or use `flowlane rollout`)")
    return notes


def adopt_queue(name: str, dsn: str | None = None) -> Row:
    [row] = _rows(dsn, "fleet_adopt_queue", f"queue adopt {name}", queue_name=name)
    return row


@dataclass(frozen=True)
class RolloutResult:
    rollout_id: int
    deployments: tuple[str, ...]
    reenabled: tuple[str, ...]
    applied: deploy.ApplyResult


Progress = Callable[[str], None]


def rollout(
    paths: Sequence[str | os.PathLike[str]] | None,
    out: str | os.PathLike[str] | None = None,
    dsn: str | None = None,
    *,
    deployments: Sequence[str] | None = None,
    timeout: float = 120.0,
    progress: Progress = lambda line: None,
) -> RolloutResult:
    """Disable the affected deployments, wait for their workers to stop, apply the
    reviewed SQL, re-enable the deployments that were enabled before."""
    out = out or project_root.sql_dir()  # as `apply`
    project = api.load_project(paths)
    deploy.refuse_stale(project, out)  # before anything is disabled
    target = db.resolve(dsn)
    with db.connect(target, autocommit=True) as conn, db.wrap_errors("rollout"):
        record = _begin(conn, deployments, list(project.queues))
        progress(f"rollout {record['rollout_id']}: disabled "
                 f"{', '.join(record['deployments']) or '(no deployments)'}; will re-enable "
                 f"{', '.join(record['previously_enabled']) or '(none)'}")
        _wait_stopped(conn, record["deployments"], timeout, progress)
    applied = deploy.apply(paths, out, target.dsn)
    progress(f"applied {len(applied.files)} file(s) while the deployments were disabled")
    with db.connect(target, autocommit=True) as conn, db.wrap_errors("rollout"):
        done = _one(conn, "fleet_finish_rollout", rollout_id=record["rollout_id"])
    progress(f"rollout {done['rollout_id']}: re-enabled "
             f"{', '.join(done['previously_enabled']) or '(none)'}")
    return RolloutResult(done["rollout_id"], tuple(done["deployments"]),
                         tuple(done["previously_enabled"]), applied)


def _one(conn: psycopg.Connection[Any], name: str, **params: Any) -> Row:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query(name), params).fetchone()
    assert row is not None
    return row


def _begin(conn: psycopg.Connection[Any], wanted: Sequence[str] | None,
           project_queues: list[str]) -> Row:
    if wanted is None:
        with conn.cursor(row_factory=dict_row) as cur:
            unfinished = cur.execute(query("fleet_unfinished_rollout")).fetchone()
            wanted = (unfinished["deployments"] if unfinished else
                      [r["deployment_name"] for r in
                       cur.execute(query("fleet_deployments_on_queues"),
                                   {"queues": project_queues}).fetchall()])
    return _one(conn, "fleet_begin_rollout", deployments=list(wanted))


def _wait_stopped(conn: psycopg.Connection[Any], deployments: list[str], timeout: float,
                  progress: Progress) -> None:
    deadline = time.monotonic() + timeout
    last: list[Row] | None = None
    while True:
        with conn.cursor(row_factory=dict_row) as cur:
            live = cur.execute(query("fleet_live_workers"),
                               {"deployments": deployments}).fetchall()
        if live != last:
            progress(f"waiting for {len(live)} worker(s) to stop" if live else
                     "every worker of these deployments has stopped")
            last = live
        if not live:
            return
        if time.monotonic() > deadline:
            raise errors.FlowlaneError(
                f"rollout: {len(live)} worker(s) still running after {timeout:g} s: "
                + ", ".join(f"{r['worker_id']} ({r['deployment_name']})" for r in live),
                hint="the deployments stay disabled; stop those workers, then run the same "
                "`flowlane rollout` again to finish")
        time.sleep(0.25)
