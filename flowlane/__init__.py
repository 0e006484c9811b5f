"""flowlane: declarative YAML workflows compiled to SQL, run on PostgreSQL + PGMQ."""

from __future__ import annotations

from flowlane.compiler.model import Project

__all__ = ["Project"]
