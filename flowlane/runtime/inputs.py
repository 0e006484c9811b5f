"""What a command line or an application gives as a run's input or a time: JSON text, a
JSON file, JSON Lines, a duration, a time. Each is parsed and size-checked here, once; a
bad one is a :class:`flowlane.errors.UsageError` that names where it came from."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from flowlane import errors
from flowlane.compiler import durations
from flowlane.runtime.limits import MAX_INPUT_BYTES

_TOO_LARGE_HINT = "pass a reference (a URL, a table key, a file path) instead of the data itself"
_INT_MAX = 2147483647  # what a SQL int holds


def read_input(text: str, option: str = "--input", what: str = "the run input") -> Any:
    """``text`` given as ``option`` (carrying ``what``): JSON text, ``@FILE`` or ``-``
    (stdin), size-checked before parsing."""
    if text == "-":
        source, raw = "stdin", sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    elif text.startswith("@"):
        source = text[1:]
        try:
            with open(source, "rb") as file:
                raw = file.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise errors.UsageError(
                f"cannot read {option} file {source}: {exc.strerror or exc}"
            ) from exc
    else:
        source, raw = option, text.encode("utf-8")
    if len(raw) > MAX_INPUT_BYTES:
        raise errors.UsageError(f"{what} from {source} is over the limit of {MAX_INPUT_BYTES} bytes",
                                hint=_TOO_LARGE_HINT)
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = option if source == option else f"the {option} from {source}"
        raise errors.UsageError(
            f"{where} is not valid JSON: {exc}",
            hint=f"""quote a JSON document for the shell, e.g. {option} '{{"name": "Ada"}}', """
            f"or pass a file: {option} @{option.removeprefix('--')}.json",
        ) from exc


def read_jsonl(lines: Iterable[bytes], source: str, numbers: list[int] | None = None
               ) -> Iterator[Any]:
    """The JSON value of every non-blank line; a usage error names the bad line. ``numbers``
    collects the line number of each value yielded."""
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if numbers is not None:
            numbers.append(number)
        if len(raw) > MAX_INPUT_BYTES:
            raise errors.UsageError(
                f"{source}:{number}: the run input is over the limit of {MAX_INPUT_BYTES} bytes",
                hint=_TOO_LARGE_HINT,
            )
        try:
            yield json.loads(raw.rstrip(b"\r\n").decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # one position: the file's line, the column within it (not the decoder's own line)
            where = (f"{source}:{number}:{exc.colno}: not valid JSON: {exc.msg}"
                     if isinstance(exc, json.JSONDecodeError)
                     else f"{source}:{number}: not valid UTF-8: {exc.reason}")
            raise errors.UsageError(
                f"{where}; no run was started",
                hint="--input-file takes JSON Lines: one JSON document per line",
            ) from exc


def read_seconds(text: str) -> int | None:
    """A number of seconds or a duration (``30s``, ``10m``, ``2h``, ``1d``) that a SQL int
    holds; None for anything else (the caller names the option)."""
    given = text.strip()
    try:
        seconds = durations.to_seconds(int(given) if given.isdigit() else given)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= _INT_MAX else None


def read_time(option: str, text: str) -> datetime:
    """An ISO 8601 time given as ``option``; without a zone it is local time."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise errors.UsageError(
            f"{option} {text!r} is not a time", hint="use ISO 8601, e.g. 2026-05-01T12:00:00+00:00"
        ) from None
    return moment if moment.tzinfo else moment.astimezone()
