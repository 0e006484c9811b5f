"""``flowlane worker enable|disable|list``, ``queue list|adopt`` and ``rollout``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowlane import errors
from flowlane.cli.common import add_dsn_argument

WORKER_ACTIONS = ("enable", "disable", "list")


def configure(subparsers: Any) -> None:
    queue = subparsers.add_parser(
        "queue",
        help="the queue registry: list queues, adopt an existing PGMQ queue",
        description="`queue list`: every registered queue with its ownership, depth, oldest "
        "message age and live workers. `queue adopt NAME`: register an existing PGMQ queue as "
        "shared (only when it is empty or every message belongs to a flowlane task).",
    )
    queue.add_argument("action", choices=["list", "adopt"])
    queue.add_argument("name", nargs="?", metavar="NAME", help="with adopt: the PGMQ queue")
    add_dsn_argument(queue)
    queue.add_argument("--format", choices=["text", "json"], default="text")
    queue.set_defaults(func=cmd_queue)

    rollout = subparsers.add_parser(
        "rollout",
        help="apply the reviewed SQL behind a fence of disabled worker deployments",
        description="Disable the affected worker deployments (default: every deployment on a "
        "queue the project routes to), wait until their workers stop, apply the compiled SQL, "
        "then re-enable exactly the deployments that were enabled before. Run it again after "
        "an interruption: it resumes the unfinished rollout.",
    )
    rollout.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    rollout.add_argument("--out", help="compiled SQL directory (default: the project's sql/)")
    rollout.add_argument("--deployments", help="comma-separated deployment names")
    rollout.add_argument("--timeout", type=float, default=120.0,
                         help="seconds to wait for the workers to stop (default 120)")
    add_dsn_argument(rollout)
    rollout.set_defaults(func=cmd_rollout)


def add_worker_admin_arguments(worker: argparse.ArgumentParser) -> None:
    admin = worker.add_argument_group(
        "deployments: `flowlane worker list`, `flowlane worker enable NAME`, "
        "`flowlane worker disable NAME --reason TEXT`"
    )
    admin.add_argument("--reason", help="with `worker disable`: why (shown to operators)")
    admin.add_argument("--format", choices=["text", "json"], default="text",
                       help="with `worker list`: output format")


def run_worker_admin(args: argparse.Namespace) -> int:
    """``flowlane worker ACTION ...``: the first positional is the action."""
    action, *rest = args.paths
    from flowlane.app import fleet

    if action == "list":
        if rest:
            raise errors.UsageError(f"`worker list` takes no names, got {' '.join(rest)}")
        _print_fleet(fleet.fleet(args.dsn), args.format)
        return 0
    if len(rest) != 1:
        raise errors.UsageError(f"`worker {action}` takes one deployment name",
                                hint=f"flowlane worker {action} NAME (see `flowlane worker list`)")
    row = fleet.set_enabled(rest[0], action == "enable", args.reason, args.dsn)
    state = "enabled" if row["enabled"] else f"disabled ({row['reason'] or 'no reason given'})"
    print(f"worker deployment {row['deployment_name']} (queue {row['queue_name']}): {state}")
    return 0


def _print_fleet(found: Any, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps({"deployments": found.deployments, "draining": found.draining},
                         indent=2, default=str))
        return
    if not found.deployments:
        print("no worker deployments yet (one is recorded when its first worker starts)")
    for d in found.deployments:
        state = "enabled" if d["enabled"] else f"DISABLED: {d['reason'] or 'no reason given'}"
        live = sum(1 for w in d["workers"] if w["live"])
        stale = len(d["workers"]) - live
        print(f"{d['deployment_name']}  queue {d['queue_name']}  {state}  "
              f"{live} live worker(s)" + (f", {stale} stale" if stale else ""))
        for w in d["workers"]:
            pairs = ", ".join(f"{f}.{s}" for f, s in w["pairs"])
            flag = ("" if w["live"] else "  STALE (its started tasks wait for stalled recovery)") \
                + ("  deprecated" if w["deprecated"] else "")
            print(f"  worker {w['worker_id']}  heartbeat {w['heartbeat_age']}s ago{flag}  "
                  f"serves {pairs}")
    for v in found.draining:
        state = ("drained" if v["drained"] else
                 f"draining: {v['started_runs']} started run(s), {v['active_tasks']} task(s)")
        print(f"alias {v['alias']}: version {v['flow_slug']} {state}")


def cmd_queue(args: argparse.Namespace) -> int:
    from flowlane.app import fleet

    if args.action == "adopt":
        if not args.name:
            raise errors.UsageError("`queue adopt` needs the queue name",
                                    hint="flowlane queue adopt NAME")
        row = fleet.adopt_queue(args.name, args.dsn)
        print(f"queue {row['queue_name']} is registered as {row['ownership']} "
              f"(PGMQ spelling: {row['pgmq_queue_name']})")
        return 0
    if args.name:
        raise errors.UsageError("`queue list` takes no name")
    rows = fleet.queues(args.dsn)
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
        return 0
    print(f"{'QUEUE':<32}  {'OWNERSHIP':<22}  {'DEPTH':>6}  {'OLDEST':>8}  WORKERS")
    for r in rows:
        owner = f"owned by {r['owner_flow_slug']}" if r["ownership"] == "owned" else "shared"
        oldest = "-" if r["oldest_age"] is None else f"{r['oldest_age']}s"
        print(f"{r['queue_name']:<32}  {owner:<22}  {r['depth']:>6}  {oldest:>8}  "
              f"{r['live_workers']}")
    for r in rows:
        if r.get("concurrency") is not None or r.get("rate_limit") is not None:
            print(limits_line(r))
    waiting = fleet.waiting(args.dsn)
    print_waiting(waiting)
    for r in rows:  # a queue without queued work whose worker refused to start
        if not r["live_workers"] and not any(w.startswith(f"queue {r['queue_name']}:")
                                             for w in waiting):
            for line in fleet.refusal_lines(r["queue_name"], r["refusals"]):
                print(f"refused: {line}", file=sys.stderr)
    return 0


def print_waiting(reasons: list[str]) -> None:
    """Why queued work waits, on stderr (stdout keeps the table or JSON a script reads)."""
    for reason in reasons:
        print(f"waiting: {reason}", file=sys.stderr)


def limits_line(row: dict[str, Any]) -> str:
    """A queue's limits (``kind: queue``), how much of them is used, and what its queued
    tasks wait for while it holds claims back."""
    parts = []
    if row.get("concurrency") is not None:
        parts.append(f"concurrency {row['started']} of {row['concurrency']} started")
    if row.get("rate_limit") is not None:
        parts.append(f"rate limit {row['rate_limit']} per {row['rate_per']} s")
    line = f"limits {row['queue_name']}: " + ", ".join(parts)
    return line + (f"; waiting for: {row['waiting_for']}" if row.get("waiting_for") else "")


def cmd_rollout(args: argparse.Namespace) -> int:
    from flowlane.app import fleet

    names = ([n.strip() for n in args.deployments.split(",") if n.strip()]
             if args.deployments is not None else None)
    result = fleet.rollout(args.paths, args.out, args.dsn,
                           deployments=names, timeout=args.timeout, progress=print)
    print(result.applied.render(), end="")
    return 0
