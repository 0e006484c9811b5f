"""Name rules: slugs for flows, steps and aliases; queue and deployment names;
the names the compiler derives (version slugs, per-step queues).

The JSON Schema's name definitions are generated from the constants here
(:func:`schema_definitions`; tests/compiler/test_names.py compares them with the shipped
file), and tests/core/test_name_parity.py proves that the SQL Core's ``is_valid_slug``,
``is_valid_queue_name`` and ``is_valid_deployment_name`` agree with both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flowlane.compiler.model import Alias, Flow

SLUG_MAX = 128
QUEUE_MAX = 47  # the PGMQ limit on queue names
DEPLOYMENT_MAX = 128
RESERVED_SLUG = "run"  # in any case: the engine's name for the run input
# (first character, following characters) as regular-expression character classes
SLUG_CHARS = ("a-zA-Z", "a-zA-Z0-9_")
QUEUE_CHARS = ("a-z", "a-z0-9_")
DEPLOYMENT_CHARS = ("A-Za-z0-9", "A-Za-z0-9_.-")
_SLUG = re.compile(rf"[{SLUG_CHARS[0]}][{SLUG_CHARS[1]}]*\Z")
_QUEUE = re.compile(rf"[{QUEUE_CHARS[0]}][{QUEUE_CHARS[1]}]*\Z")
_END = r"(?![\s\S])"  # the end of the text (``$`` would also match before a final newline)


def _pattern(chars: tuple[str, str], *, underscores: bool) -> str:
    """A JSON Schema pattern; ``underscores``: no ``__`` anywhere, no trailing ``_``."""
    first, rest = chars
    if underscores:
        return f"^[{first}](?!.*__)[{rest}]*(?<!_){_END}"
    return f"^[{first}][{rest}]*{_END}"


def schema_definitions() -> dict[str, dict[str, Any]]:
    """The name rules as the JSON Schema states them: ``slug``, ``queue`` (``$defs``) and
    ``deployment`` (a worker's ``name``), without their descriptions and examples."""
    reserved = "".join(f"[{c}{c.upper()}]" for c in RESERVED_SLUG)
    return {
        "slug": {"type": "string", "minLength": 1, "maxLength": SLUG_MAX,
                 "pattern": _pattern(SLUG_CHARS, underscores=True),
                 "not": {"pattern": f"^{reserved}{_END}"}},
        "queue": {"type": "string", "minLength": 1, "maxLength": QUEUE_MAX,
                  "pattern": _pattern(QUEUE_CHARS, underscores=True)},
        "deployment": {"type": "string", "minLength": 1, "maxLength": DEPLOYMENT_MAX,
                       "pattern": _pattern(DEPLOYMENT_CHARS, underscores=False)},
    }


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
    if value.lower() == RESERVED_SLUG:
        return NameProblem(f"{what} `{value}` is reserved",
                           f"choose another name than `{RESERVED_SLUG}`")
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


def alias_may_take_flow_name(alias: str, flow_slug: str, versions: Iterable[str]) -> bool:
    """Flow and alias slugs share one case-insensitive namespace, except that an alias may
    take the name of a flow it lists as a version (active or draining), spelled the same:
    the alias adopts the name, so a project that started with a bare concrete slug puts its
    next version behind an alias of that name without renaming its callers. The SQL Core's
    ``_alias_may_take_flow_name`` is the same rule (tests/core/test_name_parity.py)."""
    return alias == flow_slug and flow_slug in tuple(versions)


def next_version_slug(slug: str, taken: Iterable[str] = (), max_length: int = SLUG_MAX) -> str:
    """``foo_v2`` -> ``foo_v3``; ``foo`` -> ``foo_v2``; skipping slugs already taken; the
    stem is shortened when the suggestion would exceed ``max_length``."""
    used = {s.lower() for s in taken}
    stem, _, number = slug.rpartition("_v")
    if stem and number.isdigit():
        base, n = stem, int(number) + 1
    else:
        base, n = slug, 2

    def candidate() -> str:
        suffix = f"_v{n}"
        return base[: max_length - len(suffix)].rstrip("_") + suffix

    while candidate().lower() in used:
        n += 1
    return candidate()


def version_slug_limit(queue_mode: str) -> int:
    """How long a flow's version slug may be: with ``queues: flow`` it is also the queue name."""
    return QUEUE_MAX if queue_mode == "flow" else SLUG_MAX


def suggest_version(flow: Flow, taken: Iterable[str] = ()) -> str:
    """The next version slug for ``flow``, short enough to be its own default queue name."""
    return next_version_slug(flow.slug, taken, version_slug_limit(flow.queue_mode))


def alias_advice(flow_slug: str, version: str, aliases: Iterable[Alias]) -> str:
    """How callers reach ``version``, a new version of ``flow_slug``: an alias of the project
    whose active version is ``flow_slug`` moves to it; without one, an alias named
    ``flow_slug`` takes over the bare name (``alias_may_take_flow_name``)."""
    mover = next((a for a in aliases if a.active == flow_slug), None)
    if mover is not None:
        draining = ", ".join([flow_slug, *(d for d in mover.draining if d != version)])
        return (f"move alias `{mover.slug}` to it (`active: {version}`, "
                f"`draining: [{draining}]`)")
    return (f"move an alias to it (callers of a bare `{flow_slug}` keep that name: an alias "
            f"`{flow_slug}` with `active: {version}`, `draining: [{flow_slug}]`)")


def per_step_queue(flow_slug: str, step_slug: str, index: int) -> str | None:
    """``lower(flow__step)`` if it fits, else ``lower(flow__<index>)``, else None."""
    for candidate in (f"{flow_slug}__{step_slug}", f"{flow_slug}__{index}"):
        if len(candidate) <= QUEUE_MAX:
            return candidate.lower()
    return None


def _short(value: str) -> str:
    return value if len(value) <= 60 else value[:57] + "..."
