"""Name rules: slugs for flows, steps and aliases; canonical queue names."""

from __future__ import annotations

import re
from dataclasses import dataclass

SLUG_MAX = 128
QUEUE_MAX = 47  # the PGMQ limit on queue names
_SLUG = re.compile(r"[a-zA-Z][a-zA-Z0-9_]*\Z")
_QUEUE = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class NameProblem:
    """Why a name is invalid, and what to write instead."""

    message: str
    help: str


def slug_problem(value: str, what: str = "slug") -> NameProblem | None:
    """The first rule ``value`` breaks as a flow/step/alias slug, else None."""
    rules = "letters, digits and `_`, starting with a letter"
    if not 1 <= len(value) <= SLUG_MAX:
        return NameProblem(f"{what} `{_short(value)}` must be 1..{SLUG_MAX} characters long",
                           f"use a shorter {what}")
    if not _SLUG.match(value):
        return NameProblem(f"{what} `{_short(value)}` is not a valid slug", f"use {rules}")
    if "__" in value:
        return NameProblem(f"{what} `{value}` contains `__`",
                           "`__` is reserved for generated queue names; use a single `_`")
    if value.endswith("_"):
        return NameProblem(f"{what} `{value}` ends with `_`", "remove the trailing `_`")
    if value.lower() == "run":
        return NameProblem(f"{what} `{value}` is reserved", "choose another name than `run`")
    return None


def queue_problem(value: str) -> NameProblem | None:
    """The first rule ``value`` breaks as an explicit (canonical) queue name, else None."""
    canonical = canonical_queue(value)
    suggestion = (
        f"write it as `{canonical}`" if canonical and canonical != value else
        "use lower-case letters, digits and `_`, starting with a letter"
    )
    if not value:
        return NameProblem("queue name is empty", suggestion)
    if not _QUEUE.match(value):
        return NameProblem(f"queue name `{_short(value)}` is not canonical", suggestion)
    if "__" in value:
        return NameProblem(f"queue name `{value}` contains `__`",
                           f"`__` is reserved for generated per-step queues; {suggestion}")
    if value.endswith("_"):
        return NameProblem(f"queue name `{value}` ends with `_`", suggestion)
    if len(value) > QUEUE_MAX:
        return NameProblem(f"queue name `{_short(value)}` is {len(value)} characters long, "
                           f"the PGMQ limit is {QUEUE_MAX}", "use a shorter queue name")
    return None


def canonical_queue(value: str) -> str:
    """The canonical spelling a hint suggests (never applied silently)."""
    text = re.sub(r"[^a-z0-9_]+", "_", value.strip().lower())
    text = re.sub(r"_+", "_", text).strip("_")
    if text and not text[0].isalpha():
        text = f"q_{text}"
    return text


def _short(value: str) -> str:
    return value if len(value) <= 60 else value[:57] + "..."
