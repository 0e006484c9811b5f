"""The compiled format (docs/compiled-format.md): render the project to SQL files with the
Jinja2 templates (package data) and read such files back.

Every file starts with a machine-readable header line::

    -- flowlane-compiled: {"format":2,"kind":"flow","shape_sha256":"...","slug":"orders"}

Readers accept the current format and every older one (:data:`FORMAT` 1 is the header-less
layout of releases before the versioned header), so ``check --base`` compares with SQL that an
older flowlane committed. Only this module knows the templates' layout.
"""

from __future__ import annotations

import functools
import itertools
import json
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import jinja2

from flowlane import defaults
from flowlane.compiler import caching, sqltext
from flowlane.compiler import shape as shapes
from flowlane.compiler.model import Flow, Mode, Project, Step, StepType
from flowlane.compiler.sqltext import Sql

FORMAT = 2
ALIASES_FILE = "aliases.sql"
SCHEDULES_FILE = "schedules.sql"  # written only for a project with schedules
QUEUES_FILE = "queues.sql"  # written only for a project with queue documents
TRIGGERS_FILE = "triggers.sql"  # written only for a project with triggers
FLOWS_DIR = "flows"
HEADER_PREFIX = "-- flowlane-compiled: "
HEADER_LIMIT = 4096  # bytes read to recognise a file: its header line is far shorter
_BEGIN, _COMMIT = "begin;", "commit;"  # the transaction lines every template writes
# format 1: "-- flowlane compiled flow <slug> from <source>; ..." then "-- shape sha256: <hex>"
_FORMAT1_FLOW = re.compile(r"-- flowlane compiled flow (?P<slug>\S+) from ")
_FORMAT1_ALIASES = "-- flowlane compiled aliases;"
_FORMAT1_SHA = re.compile(r"^-- shape sha256: (?P<sha>[0-9a-f]{64})$", re.MULTILINE)
# the shape argument of ensure_flow_shape (every format); the last call is the flow's shape
_SHAPE_ARGUMENT = re.compile(r"\bshape => (?P<literal>E?'(?:[^']|'')*')::jsonb")

Kind = Literal["flow", "aliases", "schedules", "queues", "triggers"]


@dataclass(frozen=True)
class Header:
    """What a compiled file declares about itself."""

    format: int
    kind: Kind
    slug: str | None = None  # the flow slug (flow files)
    shape_sha256: str | None = None  # the digest of the flow's canonical shape text

    def line(self) -> str:
        fields: dict[str, Any] = {"format": self.format, "kind": self.kind}
        if self.kind == "flow":
            fields.update(slug=self.slug, shape_sha256=self.shape_sha256)
        return HEADER_PREFIX + json.dumps(fields, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class CompiledFile:
    """A compiled file read back: its header and, for a flow, the shape it ensures."""

    header: Header
    shape: dict[str, Any] | None = None  # None: missing, unreadable or not matching the digest


def _only_sql(value: Any) -> Any:
    # every {{ expression }} must come out of a quoting filter
    if not isinstance(value, sqltext.Sql):
        raise TypeError(f"template value {value!r} was not passed through a SQL filter")
    return value


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("flowlane.compiler", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # SQL, not HTML: quoting is explicit through the filters
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_only_sql,
        auto_reload=False,  # package data: no stat of the template file per rendered flow
    )
    env.filters.update(
        lit=sqltext.literal,
        jsonb=sqltext.jsonb,
        text_array=sqltext.text_array,
        int_array=sqltext.int_array,
        comment=sqltext.comment,
    )
    return env


def flow_path(slug: str) -> str:
    return f"{FLOWS_DIR}/{slug}.sql"


class QuotedStep(NamedTuple):
    """The arguments of one step's ``add_step`` call, each already a SQL literal.

    Steps are the bulk of every flow file: quoting their values here, with the same
    :mod:`sqltext` functions the templates' filters are, spares the template a filter call
    per value. An optional argument is None for a step without it (the template leaves the
    argument out); the others are never None.
    """

    slug: Sql
    deps_slugs: Sql
    max_attempts: Sql
    base_delay: Sql
    timeout: Sql
    start_delay: Sql
    step_type: Sql
    required_input_pattern: Sql
    forbidden_input_pattern: Sql
    when_unmet: Sql
    when_exhausted: Sql
    queue_name: Sql
    child_flow: Sql | None
    concurrency_limit: Sql | None
    concurrency_key: Sql | None
    compensate: Sql | None
    cache_ttl: Sql | None
    cache_key: Sql | None
    cache_fingerprint: Sql | None


_NULL = sqltext.literal(None)
# the literals of the model's closed vocabularies (step types, condition and failure modes)
_WORDS = {word: sqltext.literal(word) for word in (*get_args(StepType), *get_args(Mode))}


def quoted_step(step: Step) -> QuotedStep:
    # the same sqltext functions as the filters; None and the closed words need no call
    literal = sqltext.literal
    return QuotedStep(
        slug=literal(step.slug),
        deps_slugs=sqltext.text_array(sorted(step.needs)),
        max_attempts=_NULL if step.max_attempts is None else literal(step.max_attempts),
        base_delay=_NULL if step.base_delay is None else literal(step.base_delay),
        timeout=_NULL if step.timeout is None else literal(step.timeout),
        start_delay=_NULL if step.start_delay is None else literal(step.start_delay),
        step_type=_WORDS[step.type],
        required_input_pattern=(_NULL if step.condition_if is None
                                else sqltext.jsonb(step.condition_if)),
        forbidden_input_pattern=(_NULL if step.condition_unless is None
                                 else sqltext.jsonb(step.condition_unless)),
        when_unmet=_WORDS[step.when_unmet],
        when_exhausted=_WORDS[step.when_exhausted],
        queue_name=_NULL if step.queue is None else literal(step.queue),
        child_flow=None if step.flow is None else literal(step.flow),
        concurrency_limit=None if step.concurrency is None else literal(step.concurrency.limit),
        concurrency_key=(None if step.concurrency is None or step.concurrency.key is None
                         else literal(step.concurrency.key)),
        compensate=None if step.compensate is None else literal(step.compensate),
        cache_ttl=None if step.cache is None else literal(step.cache.ttl),
        cache_key=(None if step.cache is None or step.cache.key is None
                   else sqltext.text_array(step.cache.key)),
        cache_fingerprint=None if step.cache is None else literal(caching.fingerprint(step)),
    )


_HOLE = "\x00"  # marks a hole in a rendered pattern: no SQL literal or comment holds a NUL
_NONE = type(None)
_Pattern = tuple[str, Callable[[QuotedStep], tuple[Sql, ...]]]


class StepCalls:
    """The ``add_step`` calls of a flow's steps, in the words of ``add_step.sql.j2``.

    The template is rendered once per set of arguments present (a step without a child flow,
    one with it, ...) with a numbered hole for each argument; the text around the holes
    becomes a ``%``-format pattern, and each step is one ``%`` of its quoted arguments (a
    template render per step costs several times more). Only :class:`Sql` values fill the
    holes (as the template's ``finalize`` allows only them), so nothing unquoted reaches the
    SQL.
    """

    def __init__(self, template: jinja2.Template) -> None:
        self.template = template
        self.patterns: dict[tuple[type, ...], _Pattern] = {}

    def render(self, flow_slug: Sql, steps: Iterable[QuotedStep]) -> Sql:
        """The calls of ``steps`` of the flow whose slug literal is ``flow_slug``."""
        slug = flow_slug.replace("%", "%%")
        flow_patterns: dict[tuple[type, ...], _Pattern] = {}  # the slug filled in
        calls = []
        for step in steps:
            kinds = tuple(map(type, step))  # the arguments present, and proof they are Sql
            found = flow_patterns.get(kinds)
            if found is None:
                pattern, pick = self.patterns.get(kinds) or self._pattern(kinds)
                found = flow_patterns[kinds] = (pattern.replace(_HOLE, slug), pick)
            calls.append(found[0] % found[1](step))
        return Sql("".join(calls))

    def _pattern(self, kinds: tuple[type, ...]) -> _Pattern:
        """The pattern (the flow slug's holes left in) and what picks its arguments."""
        for name, kind in zip(QuotedStep._fields, kinds, strict=True):
            if kind is not _NONE and not issubclass(kind, Sql):
                raise TypeError(f"template value for {name} ({kind.__name__}) was not passed "
                                "through a SQL filter")
        holes = QuotedStep._make(None if kind is _NONE else Sql(f"{_HOLE}{number}{_HOLE}")
                                 for number, kind in enumerate(kinds))
        text = self.template.render(flow_slug=Sql(f"{_HOLE}slug{_HOLE}"), step=holes)
        parts = text.replace("%", "%%").split(_HOLE)  # SQL text and hole names, in turn
        order = [int(name) for name in parts[1::2] if name != "slug"]
        texts = [_HOLE if name == "slug" else "%s" for name in parts[1::2]]
        pattern = "".join(itertools.chain.from_iterable(
            itertools.zip_longest(parts[0::2], texts, fillvalue="")))
        self.patterns[kinds] = found = (pattern, operator.itemgetter(*order))
        return found


@functools.cache
def step_calls() -> StepCalls:
    return StepCalls(environment().get_template("add_step.sql.j2"))



def render_flow(flow: Flow) -> str:
    # one canonical text of the shape gives its digest and its literal
    canonical = shapes.canonical_text(shapes.flow_shape(flow))
    header = Header(FORMAT, "flow", flow.slug, shapes.text_sha256(canonical))
    flow_slug = sqltext.literal(flow.slug)
    return environment().get_template("flow.sql.j2").render(
        header=sqltext.comment(header.line()), flow=flow, flow_slug=flow_slug,
        steps=step_calls().render(flow_slug, map(quoted_step, flow.steps)),
        shape=sqltext.jsonb_literal(canonical), source=flow.source,
        default_retention=defaults.RETENTION,
    )


def render_aliases(project: Project) -> str:
    aliases = sorted(project.aliases, key=lambda a: a.slug)
    header = Header(FORMAT, "aliases")
    return environment().get_template("aliases.sql.j2").render(
        header=sqltext.comment(header.line()), aliases=aliases
    )


def render_schedules(project: Project) -> str:
    header = Header(FORMAT, "schedules")
    return environment().get_template("schedules.sql.j2").render(
        header=sqltext.comment(header.line()), schedules=project.schedules
    )


def render_queues(project: Project) -> str:
    header = Header(FORMAT, "queues")
    return environment().get_template("queues.sql.j2").render(
        header=sqltext.comment(header.line()), queues=project.queue_limits
    )


def render_triggers(project: Project) -> str:
    header = Header(FORMAT, "triggers")
    return environment().get_template("triggers.sql.j2").render(
        header=sqltext.comment(header.line()), triggers=project.triggers
    )


def render_project(project: Project) -> dict[str, str]:
    """Relative output path -> file text; the same project always gives the same bytes."""
    files = {flow_path(f.slug): render_flow(f) for f in sorted(project.flows, key=lambda f: f.slug)}
    files[ALIASES_FILE] = render_aliases(project)
    if project.schedules:
        files[SCHEDULES_FILE] = render_schedules(project)
    if project.queue_limits:
        files[QUEUES_FILE] = render_queues(project)
    if project.triggers:
        files[TRIGGERS_FILE] = render_triggers(project)
    return files


def read_header(first_line: str) -> Header | None:
    """The header of a compiled file from its first line (any format); None for other SQL."""
    line = first_line.rstrip("\r\n")
    if line.startswith(HEADER_PREFIX):
        return _parse_header(line.removeprefix(HEADER_PREFIX))
    legacy = _FORMAT1_FLOW.match(line)
    if legacy is not None:
        return Header(1, "flow", legacy["slug"])
    if line.startswith(_FORMAT1_ALIASES):
        return Header(1, "aliases")
    return None


def _parse_header(text: str) -> Header | None:
    try:
        fields = json.loads(text)
    except ValueError:
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("format"), int):
        return None
    kind, slug, sha = fields.get("kind"), fields.get("slug"), fields.get("shape_sha256")
    if kind in ("aliases", "schedules", "queues", "triggers"):
        return Header(fields["format"], kind)
    if kind == "flow" and isinstance(slug, str) and isinstance(sha, str):
        return Header(fields["format"], "flow", slug, sha)
    return None


def read(text: str) -> CompiledFile | None:
    """A compiled file read back (any format), or None when ``text`` is not one."""
    header = read_header(text.split("\n", 1)[0])
    if header is None or header.kind != "flow":
        return None if header is None else CompiledFile(header)
    if header.format == 1:
        found = _FORMAT1_SHA.search(text)
        header = Header(1, "flow", header.slug, found["sha"] if found else None)
    return CompiledFile(header, _shape(text, header.shape_sha256))


def _shape(text: str, digest: str | None) -> dict[str, Any] | None:
    """The shape of the file's last ``ensure_flow_shape`` call, if it matches the header's
    digest (a file edited by hand after compiling has no trustworthy shape)."""
    literals = [m["literal"] for m in _SHAPE_ARGUMENT.finditer(text)]
    if not literals:
        return None
    try:
        value = json.loads(sqltext.unquote(literals[-1]))
    except ValueError:
        return None
    if not isinstance(value, dict) or shapes.shape_sha256(value) != digest:
        return None
    return value


def is_compiled_flow(first_bytes: bytes) -> bool:
    """Whether a file starting with ``first_bytes`` is a flow file that compile wrote (any
    format): compile owns these and removes them when their flow is gone."""
    first_line = first_bytes.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    header = read_header(first_line)
    return header is not None and header.kind == "flow"


def statements(text: str) -> str:
    """A compiled file without its ``begin;``/``commit;`` lines, for callers that run several
    files in one transaction of their own."""
    return "\n".join(line for line in text.split("\n") if line not in (_BEGIN, _COMMIT))
