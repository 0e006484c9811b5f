from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowlane import errors
from flowlane.core import embedded, migrator


@pytest.mark.slow
def test_clone_has_pgmq_and_migrations(conn: psycopg.Connection[Any]) -> None:
    assert conn.execute("select count(*) from pgmq.list_queues()").fetchone() == (0,)
    versions = [r[0] for r in conn.execute("select version from flowlane.schema_migrations")]
    assert versions == [m.version for m in migrator.discover()]


@pytest.mark.slow
def test_each_test_gets_its_own_database(dsn: str, db_factory: Any) -> None:
    other = db_factory()
    assert other != dsn
    with psycopg.connect(dsn, autocommit=True) as a, psycopg.connect(other, autocommit=True) as b:
        a.execute("select pgmq.create('only_here')")
        assert b.execute("select count(*) from pgmq.list_queues()").fetchone() == (0,)


@pytest.mark.slow
def test_the_server_runs_the_programs_of_the_chosen_bin_dir(conn: psycopg.Connection[Any]) -> None:
    """FLOWLANE_PG_BINDIR (e.g. Debian's PostgreSQL 15) or the wheel's: the tests' server is
    the one asked for, so a run on another version really exercises that version (with
    FLOWLANE_TEST_DSN, point FLOWLANE_PG_BINDIR at that server's programs)."""
    banner = subprocess.run([embedded.program("postgres"), "--version"], capture_output=True,
                            text=True, check=True).stdout  # "postgres (PostgreSQL) 15.18 ..."
    version = conn.execute("show server_version").fetchone()
    assert version is not None and version[0].split()[0] in banner.split()


def test_a_bin_dir_without_postgresql_is_refused_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(embedded.BIN_DIR_VARIABLE, str(tmp_path))
    with pytest.raises(errors.DatabaseUnavailable, match="holds no pg_ctl") as caught:
        embedded.bin_dir()
    assert "/usr/lib/postgresql/15/bin" in (caught.value.hint or "")
