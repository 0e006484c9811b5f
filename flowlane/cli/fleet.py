"""``flowlane worker enable|disable|list``, ``queue list|adopt`` and ``rollout``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowlane import errors
from flowlane.cli.common import add_dsn_argument, print_waiting


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
        if r.get("concurrency") is not None or r.get("rate_limit") is not None or archive_off(r):
            print(limits_line(r))
    waiting = fleet.waiting(args.dsn)
    print_waiting(waiting)
    for r in rows:  # a queue without queued work whose worker refused to start
        if not r["live_workers"] and not any(w.startswith(f"queue {r['queue_name']}:")
                                             for w in waiting):
            for line in fleet.refusal_lines(r["queue_name"], r["refusals"]):
                print(f"refused: {line}", file=sys.stderr)
    return 0


def limits_line(row: dict[str, Any]) -> str:
    """A queue's limits and archive (``kind: queue``), how much of the limits is used, and
    what its queued tasks wait for while it holds claims back."""
    parts = []
    if row.get("concurrency") is not None:
        parts.append(f"concurrency {row['started']} of {row['concurrency']} started")
    if row.get("rate_limit") is not None:
        parts.append(f"rate limit {row['rate_limit']} per {row['rate_per']} s")
    if archive_off(row):
        parts.append("archive off (the messages of ended tasks are deleted)")
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


def archive_off(row: dict[str, Any]) -> bool:
    return row.get("archive_messages") is False
