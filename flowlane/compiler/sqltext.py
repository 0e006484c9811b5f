"""SQL literals for rendered flow SQL. Every value from YAML goes through :func:`quote`.

Rendered values are :class:`Sql` instances; the template environment refuses to
output anything else, so a value can never reach SQL without passing here.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from typing import Any


class Sql(str):
    """Text that is already safe SQL (a literal produced by this module)."""

    __slots__ = ()


def quote(value: str) -> Sql:
    """The one quoting function: a string literal that means the same under any
    ``standard_conforming_strings`` setting (backslashes force an ``E''`` literal
    with doubled backslashes; quotes are always doubled)."""
    if "\x00" in value:
        raise ValueError("PostgreSQL text cannot contain NUL characters")
    doubled = value.replace("'", "''")
    if "\\" in value:
        return Sql("E'" + doubled.replace("\\", "\\\\") + "'")
    return Sql("'" + doubled + "'")


def literal(value: Any) -> Sql:
    """``null``, ``true``/``false``, a decimal integer or a quoted string."""
    if value is None:
        return Sql("null")
    if type(value) is str:  # most values: checked first
        return quote(value)
    if isinstance(value, bool):
        return Sql("true" if value else "false")
    if isinstance(value, int):
        return Sql(str(int(value)))
    if isinstance(value, str):
        return quote(value)
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def jsonb(value: Any) -> Sql:
    """A jsonb literal: canonical JSON text, quoted, cast ``::jsonb`` (or ``null``)."""
    if value is None:
        return Sql("null")
    return jsonb_literal(json.dumps(value, sort_keys=True, separators=(",", ":"),
                                    ensure_ascii=False))


def jsonb_literal(canonical: str) -> Sql:
    """The jsonb literal of JSON text that is already canonical (what :func:`jsonb` writes)."""
    return Sql(f"{quote(_escape_invisible(canonical))}::jsonb")


_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cn"})


def _escape_invisible(text: str) -> str:
    """JSON ``\\uXXXX`` escapes for control, format and line-separator characters, so a
    rendered file has no invisible characters and no line breaks inside literals."""
    if text.isprintable():
        return text
    return "".join(_json_escape(ch) if unicodedata.category(ch) in _INVISIBLE else ch
                   for ch in text)


def _json_escape(ch: str) -> str:
    encoded = ch.encode("utf-16-be")
    units = [int.from_bytes(encoded[i : i + 2], "big") for i in range(0, len(encoded), 2)]
    return "".join(f"\\u{unit:04x}" for unit in units)


def text_array(values: Iterable[str]) -> Sql:
    """``array['a', 'b']::text[]`` (``array[]::text[]`` when empty)."""
    return Sql("array[" + ", ".join(quote(v) for v in values) + "]::text[]")


def int_array(values: Iterable[int] | None) -> Sql:
    """``array[0, 30]::int[]``, or ``null``."""
    if values is None:
        return Sql("null")
    return Sql("array[" + ", ".join(str(int(v)) for v in values) + "]::int[]")


_UNSAFE_IN_COMMENT = re.compile(r"[\x00-\x1f\x7f]")


def comment(value: str) -> Sql:
    """Text for a ``--`` comment line: control characters (newlines) replaced."""
    return Sql(_UNSAFE_IN_COMMENT.sub("?", value))


_LITERAL = re.compile(r"(E?)'((?:[^']|'')*)'")


def unquote(text: str) -> str:
    """The inverse of :func:`quote` for one literal (used to read committed SQL)."""
    match = _LITERAL.fullmatch(text.strip())
    if match is None:
        raise ValueError("not a SQL string literal")
    body = match.group(2).replace("''", "'")
    return body.replace("\\\\", "\\") if match.group(1) else body
