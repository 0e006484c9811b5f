"""``flowlane`` command line: a thin shell over the public functions.

Each command group lives in its own module and registers its sub-commands in
``configure(subparsers)``. Commands return an exit code: 0 ok, 1 findings or
failure, 2 usage error, 3 a worker whose deployment is disabled (do not
restart it automatically), 4 a worker whose queue is now routed work its registry
does not serve (restart it with the current YAML). Every :class:`flowlane.errors.FlowlaneError` becomes
one ``error:`` line (plus ``hint:``) on stderr; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flowlane import errors
from flowlane.cli import compiler, db, fleet, runs, serve, ui, worker
from flowlane.cli.common import report_error

# in the order `flowlane --help` lists them
COMMAND_GROUPS = (db, compiler, worker, runs, serve, fleet, ui)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("flowlane")
    except metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowlane",
        description="Declarative YAML workflows compiled to SQL, run on PostgreSQL + PGMQ.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"flowlane {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for group in COMMAND_GROUPS:
        group.configure(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except errors.FlowlaneError as exc:
        if args.debug:
            raise
        report_error(exc)
        return exc.exit_code
    except OSError as exc:  # a file the command was pointed at (a wrapped one says more)
        if args.debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())
