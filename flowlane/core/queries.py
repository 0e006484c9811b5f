"""Named SQL queries shipped as package data.

Each ``flowlane/core/sql/*.sql`` file holds blocks that start with a
``-- name: <query_name>`` line; the text up to the next header is the query.
Parameters use psycopg's ``%(name)s`` style.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- name: (?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def named_blocks(text: str) -> list[tuple[str, str]]:
    """The (name, query) blocks of a file in this format, in their order."""
    headers = list(_HEADER.finditer(text))
    return [
        (header["name"], text[header.end() : following.start() if following else len(text)].strip())
        for header, following in zip(headers, [*headers[1:], None], strict=True)
    ]


@functools.cache
def _load() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in sorted(resources.files("flowlane.core.sql").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        for name, text in named_blocks(entry.read_text(encoding="utf-8")):
            if name in found:
                raise RuntimeError(f"query {name!r} is defined twice")
            found[name] = text
    return found


def query(name: str) -> LiteralString:
    """The text of a named query (we vouch for it: it is package data, never user input)."""
    return _load()[name]
