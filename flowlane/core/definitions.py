"""Running compiled flow SQL against a database, under the deploy lock.

Only :func:`create_flows` lives here: ``worker --compile`` on a development
database runs the very SQL that ``apply`` runs for a flow (rendered and split into
statements by :mod:`flowlane.compiler.compiled`), so a worker never writes a
definition any other way.
"""

from __future__ import annotations

from collections.abc import Iterable

from flowlane.compiler import compiled
from flowlane.compiler.model import Project
from flowlane.core import db
from flowlane.core.queries import query


def create_flows(project: Project, slugs: Iterable[str], dsn: str | None = None) -> tuple[str, ...]:
    """Create flows missing from a development database (``worker --compile``) by running
    the very SQL that ``apply`` runs for them, options included; aliases are left to
    ``apply``. Flows that exist meanwhile are verified by the same SQL, never changed in shape."""
    flows = [project.flow(slug) for slug in sorted(slugs)]
    target = db.resolve(dsn)
    with db.connect(target) as conn, conn.transaction():
        with db.wrap_errors("compile"):
            conn.execute(query("deploy_lock_timeout"))
            conn.execute(query("deploy_lock"))
        for flow in flows:
            with db.wrap_errors(f"compile flow {flow.slug}"):
                conn.execute(compiled.statements(compiled.render_flow(flow)))
    return tuple(f.slug for f in flows)
