"""README's command table against the CLI's own parser: every command in exactly one row,
and every action of a command with actions (``db up``, ``queue adopt``) named in it."""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from flowlane.cli import Parser, build_parser
from flowlane.cli.worker import WORKER_ACTIONS
from tests.docs_support import table

README = Path(__file__).resolve().parents[2] / "README.md"


def _subcommands(parser: Parser) -> dict[str, Parser]:
    return dict(parser.commands)


def _actions(command: str, parser: Parser) -> set[str]:
    """The actions a command takes as its first word (none for most commands)."""
    nested = set(_subcommands(parser))
    choices = {str(choice) for action in parser._actions
               if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
               for choice in action.choices or ()}
    return nested | choices | (set(WORKER_ACTIONS) if command == "worker" else set())


def _table_rows() -> list[list[tuple[str, list[str]]]]:
    """Per row of the command table, ``(command, actions)`` of each command the row names."""
    rows = []
    for row in table(README.read_text(encoding="utf-8"), "command"):
        named = []
        for segment in re.findall(r"`([^`]+)`", row["command"]):
            words = segment.replace("\\|", "|").split()
            words = words[1:] if words[0] == "flowlane" else words
            named.append((words[0], words[1].split("|") if len(words) > 1 else []))
        rows.append(named)
    return rows


def test_every_command_is_in_exactly_one_row_of_the_readme_table() -> None:
    commands = _subcommands(build_parser())
    rows = _table_rows()
    assert len(rows) > 10
    for row in rows:
        assert {command for command, _ in row} <= set(commands), row
    per_row = Counter(command for row in rows for command in {command for command, _ in row})
    assert sorted(per_row.elements()) == sorted(commands), (
        f"missing: {sorted(set(commands) - set(per_row))}, "
        f"doubled: {sorted(c for c, n in per_row.items() if n > 1)}")


def test_every_action_of_a_command_is_named_in_its_row() -> None:
    commands = _subcommands(build_parser())
    named: dict[str, set[str]] = {}
    for row in _table_rows():
        for command, actions in row:
            named.setdefault(command, set()).update(actions)
    for command, parser in commands.items():
        expected = _actions(command, parser)
        assert expected <= named.get(command, set()), (command, sorted(expected))
