from __future__ import annotations

from typing import Any

import psycopg


def test_clone_has_pgmq_and_migrations(conn: psycopg.Connection[Any]) -> None:
    assert conn.execute("select count(*) from pgmq.list_queues()").fetchone() == (0,)
    versions = [r[0] for r in conn.execute("select version from flowlane.schema_migrations")]
    from flowlane.core import migrator

    assert versions == [m.version for m in migrator.discover()]


def test_each_test_gets_its_own_database(dsn: str, db_factory: Any) -> None:
    other = db_factory()
    assert other != dsn
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(other, autocommit=True) as b:
        a.execute("select pgmq.create('only_here')")
        assert b.execute("select count(*) from pgmq.list_queues()").fetchone() == (0,)
