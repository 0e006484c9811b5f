"""Running compiled flow SQL against a database, under the deploy lock.

The two writers of definitions share it: ``apply`` runs the reviewed files and
``worker --compile`` (:func:`create_flows`, development databases) runs the very
SQL ``apply`` runs for a missing flow, both under :func:`lock` and through
:func:`run_compiled` (statements split by :mod:`flowlane.compiler.compiled`), so a
worker never writes a definition any other way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from flowlane.compiler import compiled
from flowlane.compiler.model import Project
from flowlane.core import db
from flowlane.core.queries import query


def lock(conn: psycopg.Connection[Any], what: str) -> None:
    """Take the lock every writer of definitions holds (``apply``, ``worker --compile``),
    never queueing behind long locks."""
    with db.wrap_errors(what):
        conn.execute(query("deploy_lock_timeout"))
        conn.execute(query("deploy_lock"))


def run_compiled(conn: psycopg.Connection[Any], text: str, what: str) -> None:
    """Run one compiled file's statements in the caller's transaction."""
    with db.wrap_errors(what):
        conn.execute(compiled.statements(text))


def create_flows(project: Project, slugs: Iterable[str], dsn: str | None = None) -> tuple[str, ...]:
    """Create flows missing from a development database (``worker --compile``) by running
    the very SQL that ``apply`` runs for them, options included; aliases are left to
    ``apply``. A flow created by someone else before the lock is taken is left alone (its
    options too); returns the flows this call created."""
    target = db.resolve(dsn)
    with db.connect(target) as conn, conn.transaction():
        lock(conn, "compile")
        wanted = sorted(slugs)
        existing = {r[0] for r in conn.execute(query("deploy_existing_flows"), {"slugs": wanted})}
        flows = [project.flow(slug) for slug in wanted if slug not in existing]
        for flow in flows:
            run_compiled(conn, compiled.render_flow(flow), f"compile flow {flow.slug}")
    return tuple(f.slug for f in flows)
