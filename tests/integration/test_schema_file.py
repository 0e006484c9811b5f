"""``flowlane/core/schema.sql`` is the schema the migrations build, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane.core import schema_dump
from tests.conftest import Cluster

PG_DUMP_SAMPLE = """--
-- PostgreSQL database dump
--

\\restrict 4fJxQ2

-- Dumped from database version 18.0
-- Dumped by pg_dump version 18.0

SET statement_timeout = 0;
SELECT pg_catalog.set_config('search_path', '', false);

--
-- Name: runs; Type: TABLE; Schema: flowlane; Owner: -
--

CREATE TABLE flowlane.runs (
    run_id uuid NOT NULL
);



--
-- PostgreSQL database dump complete
--

\\unrestrict 4fJxQ2
"""


def test_normalize_keeps_the_schema_and_drops_what_varies_between_servers() -> None:
    assert schema_dump.normalize(PG_DUMP_SAMPLE) == (
        schema_dump.HEADER + "\n-- TABLE runs\n\nCREATE TABLE flowlane.runs (\n    run_id uuid NOT NULL\n);\n"
    )


def test_the_committed_schema_matches_a_database_built_from_the_migrations(dsn: str) -> None:
    built = schema_dump.dump(dsn)
    committed = schema_dump.SCHEMA_FILE.read_text(encoding="utf-8")
    assert built == committed, (
        f"{schema_dump.SCHEMA_FILE.name} is stale against the migrations: run `{schema_dump.REGENERATE}`"
    )
    assert "CREATE FUNCTION flowlane.add_step(" in committed


def test_check_fails_on_a_stale_file_and_write_fixes_it(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    committed = schema_dump.SCHEMA_FILE.read_text(encoding="utf-8")
    stale = tmp_path / "schema.sql"
    stale.write_text(schema_dump.HEADER + "\n-- a migration ago\n", encoding="utf-8")
    monkeypatch.setattr(schema_dump, "SCHEMA_FILE", stale)
    assert schema_dump.main(["--check", "--dsn", cluster.admin_dsn]) == 1
    assert schema_dump.REGENERATE in capsys.readouterr().err
    assert schema_dump.main(["--write", "--dsn", cluster.admin_dsn]) == 0
    assert stale.read_text(encoding="utf-8") == committed
    assert schema_dump.main(["--check", "--dsn", cluster.admin_dsn]) == 0
