"""What every command group shares: the ``--dsn`` and ``--format`` options, the project's
flow paths, and how an error is printed."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable

from flowlane import errors, project_root


def add_dsn_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="PostgreSQL connection string (default: $FLOWLANE_DSN, then $DATABASE_URL, "
        "then the embedded database in .flowlane/, started on demand)",
    )


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["text", "json"], default="text")


def flow_paths(args: argparse.Namespace) -> list[str]:
    """The PATHS given, else the project's flows/ directory."""
    return list(args.paths) or [project_root.flows_dir()]


def report_error(exc: errors.FlowlaneError) -> None:
    print(f"error: {exc}", file=sys.stderr)
    detail = getattr(exc, "detail", None)
    if detail:
        print(f"detail: {detail}", file=sys.stderr)
    if exc.hint:
        print(f"hint: {exc.hint}", file=sys.stderr)


def json_errors(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """With ``--format json``, an error is also printed to stdout as one JSON object
    (``{"error": ..., "hint": ...}``), so that a caller parsing stdout always gets JSON;
    the ``error:`` line on stderr and the exit code stay as for text."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except errors.FlowlaneError as exc:
            if args.format == "json":
                print(json.dumps({"error": str(exc), "hint": exc.hint}))
            raise

    return run


def print_waiting(reasons: list[str]) -> None:
    """Why queued work waits, on stderr (stdout keeps the table or JSON a script reads)."""
    for reason in reasons:
        print(f"waiting: {reason}", file=sys.stderr)
