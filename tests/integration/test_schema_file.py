"""``schema_dump.normalize``: what two databases are compared by (tests/integration/test_engine_source.py)."""

from __future__ import annotations

from flowlane.core import schema_dump

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
