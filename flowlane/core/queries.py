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


@functools.cache
def _load() -> dict[str, str]:
    found: dict[str, str] = {}
    for entry in sorted(resources.files("flowlane.core.sql").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        headers = list(_HEADER.finditer(text))
        for header, following in zip(headers, [*headers[1:], None], strict=True):
            end = following.start() if following else len(text)
            name = header["name"]
            if name in found:
                raise RuntimeError(f"query {name!r} is defined twice")
            found[name] = text[header.end() : end].strip()
    return found


def query(name: str) -> LiteralString:
    """The text of a named query (we vouch for it: it is package data, never user input)."""
    return _load()[name]  # mypy treats LiteralString as str: no cast needed
