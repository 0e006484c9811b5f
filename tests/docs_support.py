"""The docs read as data by the tests that hold them to the code: what a page states, never
where its lines wrap or how its tables' columns are padded."""

from __future__ import annotations

import re
from itertools import takewhile
from pathlib import Path

CELL_BORDER = re.compile(r"(?<!\\)\|")  # `\|` inside a cell is text
RULE_CELL = re.compile(r":?-+:?")


def prose(path: Path) -> str:
    """The page with every run of whitespace one space: where lines wrap is no part of it."""
    return " ".join(path.read_text(encoding="utf-8").split())


def _is_row(line: str) -> bool:
    return line.lstrip().startswith("|")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in CELL_BORDER.split(line.strip().strip("|"))]


def table(text: str, first_column: str) -> list[dict[str, str]]:
    """The rows of the first Markdown table in ``text`` whose heading starts with the column
    ``first_column``, each ``column heading -> cell`` (cells stripped, ``\\|`` kept as written)."""
    lines = text.splitlines()
    for at, line in enumerate(lines[:-1]):
        rule = _cells(lines[at + 1])
        if _is_row(line) and _cells(line)[0] == first_column and all(map(RULE_CELL.fullmatch, rule)):
            heading = _cells(line)
            body = takewhile(_is_row, lines[at + 2:])
            return [dict(zip(heading, _cells(row), strict=True)) for row in body]
    raise AssertionError(f"no table with the first column {first_column!r}")
