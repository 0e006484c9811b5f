"""``flowlane prune``: delete finished runs older than their flow's retention."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flowlane import errors
from flowlane.cli.common import add_dsn_argument, add_format, json_errors
from flowlane.runtime.inputs import read_seconds


def configure(subparsers: Any) -> None:
    prune = subparsers.add_parser(
        "prune",
        help="delete finished runs older than their flow's retention",
        description="Delete finished (completed, failed, cancelled) runs that ended longer ago "
        "than their flow's `retention` (default 30d), with their steps, tasks, attempts and "
        "queue messages, in batches of one short transaction each. Workers prune the same way "
        "on their maintenance tick; this command prunes now.",
    )
    prune.add_argument("--flow", help="only this flow (an alias: every version it names)")
    prune.add_argument("--older-than", metavar="DURATION",
                       help="runs that ended longer ago than this (seconds or 30d, 12h, 90m, 45s), "
                       "in place of every flow's retention, `forever` included")
    prune.add_argument("--dry-run", action="store_true",
                       help="say what would be deleted, per flow; delete nothing")
    add_dsn_argument(prune)
    add_format(prune)
    prune.set_defaults(func=cmd_prune)


def _seconds(text: str | None) -> int | None:
    if text is None:
        return None
    seconds = read_seconds(text)
    if seconds is None:
        raise errors.UsageError(f"--older-than: `{text}` is not a duration",
                                hint="write seconds or a number with s, m, h or d: --older-than 7d")
    return seconds


@json_errors
def cmd_prune(args: argparse.Namespace) -> int:
    from flowlane.app import retention

    older_than = _seconds(args.older_than)
    if args.dry_run:
        rows = retention.prunable(args.dsn, flow=args.flow, older_than=older_than)
        if args.format == "json":
            print(json.dumps([{**r, "oldest_ended_at": r["oldest_ended_at"].isoformat()} for r in rows]))
        for row in rows if args.format == "text" else ():
            print(f"{row['flow_slug']}: {row['runs']} run(s) to prune, the oldest ended "
                  f"{row['oldest_ended_at']:%Y-%m-%d %H:%M:%S%z}")
        if not rows and args.format == "text":
            print("nothing to prune")
        return 0

    def progress(batch: retention.Pruned) -> None:
        if args.format == "text":
            print(f"pruned {batch.runs} run(s)", file=sys.stderr, flush=True)

    total = retention.prune(args.dsn, flow=args.flow, older_than=older_than, on_batch=progress)
    if args.format == "json":
        print(json.dumps(vars(total)))
    else:
        print(f"pruned {total.runs} run(s), {total.steps} step state(s), {total.tasks} task(s), "
              f"{total.attempts} attempt(s), {total.messages} queue message(s)")
    return 0
