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
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NoReturn, cast

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


class _Choices:
    """What an argument accepts (its choices, or a parser's commands), remembering the value
    it refused: argparse asks ``value in choices``, and a refusal is its error."""

    def __init__(self, choices: Iterable[Any]) -> None:
        self.choices = choices
        self.refused: Any = None

    def __contains__(self, value: object) -> bool:
        accepted = value in self.choices
        if not accepted:
            self.refused = value
        return accepted

    def __iter__(self) -> Iterator[Any]:
        return iter(self.choices)

    def __len__(self) -> int:
        return len(list(self.choices))


class Parser(argparse.ArgumentParser):
    """argparse that suggests the closest command, choice or option for a misspelled one. It
    keeps what its arguments accept as they are added, through argparse's public methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[str] = []  # every option string (--dsn, -h, ...)
        self.commands: dict[str, Parser] = {}  # its sub-commands, by name
        self._choices: list[_Choices] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return self._known(super().add_argument(*args, **self._watched(kwargs)))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        return self._watch(super().add_argument_group(*args, **kwargs))

    def add_mutually_exclusive_group(self, **kwargs: Any) -> Any:
        return self._watch(super().add_mutually_exclusive_group(**kwargs))

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.commands = cast("dict[str, Parser]", action.choices)  # filled by add_parser
        action.choices = self._watched({"choices": action.choices})["choices"]
        return action

    def error(self, message: str) -> NoReturn:
        refusing = next((c for c in self._choices if c.refused is not None), None)
        if refusing is not None:
            message += _did_you_mean(str(refusing.refused), [str(choice) for choice in refusing])
        super().error(message)

    def refuse_unknown(self, extra: list[str]) -> NoReturn:
        """Unknown arguments: this command's usage, and the closest of its options."""
        hints = "".join(_did_you_mean(arg.partition("=")[0], self.options) for arg in extra
                        if arg.startswith("-"))
        self.error(f"unrecognized arguments: {' '.join(extra)}{hints}")

    def _watched(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.get("choices") is None:
            return kwargs
        self._choices.append(_Choices(kwargs["choices"]))
        return {**kwargs, "choices": self._choices[-1]}

    def _known(self, action: argparse.Action) -> argparse.Action:
        self.options.extend(action.option_strings)
        return action

    def _watch(self, group: Any) -> Any:
        """A group's arguments are this parser's: keep what they accept too."""
        add = group.add_argument

        def add_argument(*args: Any, **kwargs: Any) -> argparse.Action:
            return self._known(add(*args, **self._watched(kwargs)))

        setattr(group, "add_argument", add_argument)  # noqa: B010
        return group


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
        command = parser.commands.get(getattr(args, "command", None) or "", parser)
        nested = command.commands.get(_nested_command(args) or "")
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


def _nested_command(args: argparse.Namespace) -> str | None:
    """The sub-command of a command group (``db migrate``, ``queue adopt``), if any."""
    return next((value for key, value in vars(args).items()
                 if key.endswith("_command") and isinstance(value, str)), None)
