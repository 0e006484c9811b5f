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
import difflib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from flowlane import __version__, errors
from flowlane.cli import (
    compiler,
    db,
    fleet,
    manifests,
    retention,
    runs,
    schedules,
    serve,
    ui,
    webhooks,
    worker,
)
from flowlane.cli.common import report_error

# in the order `flowlane --help` lists them
COMMAND_GROUPS = (db, compiler, worker, runs, schedules, webhooks, retention, serve, fleet, ui, manifests)


class Parser(argparse.ArgumentParser):
    """argparse that suggests the closest command or option for a misspelled one."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            message += _did_you_mean(choice[1], re.findall(r"'([^']*)'", choice[2]))
        super().error(message)

    def refuse_unknown(self, extra: list[str]) -> NoReturn:
        """Unknown arguments: this command's usage, and the closest of its options."""
        options = [o for action in self._actions for o in action.option_strings]
        hints = "".join(_did_you_mean(arg.partition("=")[0], options) for arg in extra
                        if arg.startswith("-"))
        self.error(f"unrecognized arguments: {' '.join(extra)}{hints}")


def _did_you_mean(given: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(given, choices, n=3)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def build_parser() -> Parser:
    parser = Parser(
        prog="flowlane",
        description="Declarative YAML workflows compiled to SQL, run on PostgreSQL + PGMQ.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"flowlane {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for group in COMMAND_GROUPS:
        group.configure(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands = _commands(parser)
        command = commands.get(getattr(args, "command", None) or "", parser)
        nested = _commands(command).get(_nested_command(args) or "")
        (nested or command).refuse_unknown(extra)
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


def _commands(parser: argparse.ArgumentParser) -> dict[str, Parser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):  # sub-parsers are Parsers too
            return {name: sub for name, sub in action.choices.items() if isinstance(sub, Parser)}
    return {}


def _nested_command(args: argparse.Namespace) -> str | None:
    """The sub-command of a command group (``db migrate``, ``queue adopt``), if any."""
    return next((value for key, value in vars(args).items()
                 if key.endswith("_command") and isinstance(value, str)), None)
