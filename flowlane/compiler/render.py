"""Render the validated project to SQL files with Jinja2 templates (package data)."""

from __future__ import annotations

import functools
from typing import Any

import jinja2

from flowlane.compiler import shape as shapes
from flowlane.compiler import sqltext
from flowlane.compiler.model import Flow, Project

ALIASES_FILE = "aliases.sql"
FLOWS_DIR = "flows"


def _only_sql(value: Any) -> Any:
    # every {{ expression }} must come out of a quoting filter
    if not isinstance(value, sqltext.Sql):
        raise TypeError(f"template value {value!r} was not passed through a SQL filter")
    return value


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("flowlane", "templates"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # SQL, not HTML: quoting is explicit through the filters
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_only_sql,
    )
    env.filters.update(
        lit=sqltext.literal,
        jsonb=sqltext.jsonb,
        text_array=sqltext.text_array,
        comment=sqltext.comment,
    )
    return env


def flow_path(slug: str) -> str:
    return f"{FLOWS_DIR}/{slug}.sql"


def render_flow(flow: Flow) -> str:
    shape = shapes.flow_shape(flow)
    return environment().get_template("flow.sql.j2").render(
        flow=flow, shape=shape, sha256=shapes.shape_sha256(shape), source=flow.source
    )


def render_aliases(project: Project) -> str:
    aliases = sorted(project.aliases, key=lambda a: a.slug)
    return environment().get_template("aliases.sql.j2").render(aliases=aliases)


def render_project(project: Project) -> dict[str, str]:
    """Relative output path -> file text; the same project always gives the same bytes."""
    files = {flow_path(f.slug): render_flow(f) for f in sorted(project.flows, key=lambda f: f.slug)}
    files[ALIASES_FILE] = render_aliases(project)
    return files
