"""Retention: deleting finished runs older than their flow's ``retention``.

The SQL Core's ``prune_runs`` deletes one bounded batch (runs with their steps, tasks,
attempts and queue messages) per call; :func:`prune` calls it, one short transaction each,
until a batch finds nothing, so claims and completions never wait behind a long delete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from psycopg.rows import dict_row

from flowlane import errors
from flowlane.core import db
from flowlane.core.queries import query

Row = dict[str, Any]


@dataclass(frozen=True)
class Pruned:
    """What one batch, or a whole prune, deleted."""

    runs: int = 0
    steps: int = 0
    tasks: int = 0
    attempts: int = 0
    messages: int = 0

    @classmethod
    def from_row(cls, row: Row) -> Pruned:
        return cls(*(int(row[f"{f.name}_deleted"]) for f in fields(cls)))

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def prune(
    dsn: str | None = None,
    *,
    flow: str | None = None,
    older_than: int | None = None,
    on_batch: Callable[[Pruned], None] | None = None,
) -> Pruned:
    """Delete every prunable run, one committed batch at a time; ``flow`` is a flow or an
    alias (every version it names), ``older_than`` seconds replaces each flow's retention."""
    total = Pruned()
    with db.connect(db.resolve(dsn), autocommit=True) as conn, db.wrap_errors("prune"):
        flows = _flows(conn, flow)
        while True:
            with conn.cursor(row_factory=dict_row) as cur:
                cur.execute(query("retention_prune_batch"), {"flows": flows, "older_than": older_than})
                batch = Pruned.from_row(cur.fetchall()[0])
            if not batch.runs:
                return total
            total += batch
            if on_batch is not None:
                on_batch(batch)


def prunable(dsn: str | None = None, *, flow: str | None = None,
             older_than: int | None = None) -> list[Row]:
    """Per flow, the runs a prune would delete now and the oldest one's end (nothing deleted)."""
    with db.connect(db.resolve(dsn), autocommit=True) as conn, db.wrap_errors("prune --dry-run"):
        flows = _flows(conn, flow)
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query("retention_prunable"), {"flows": flows, "older_than": older_than})
            return cur.fetchall()


def _flows(conn: Any, flow: str | None) -> list[str] | None:
    if flow is None:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("client_flow_filter"), {"flow": flow})
        row = cur.fetchone()
    if row["flows"]:
        return list(row["flows"])
    raise errors.NotFound(f"no flow or alias `{flow}` in the database",
                            hint="`flowlane runs` and `flowlane plan` name the flows in the database")
