"""Console fixtures: one seeded database per test module (the seed is read-mostly)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.ui import ui_support


@pytest.fixture(scope="module")
def seeded_db(cluster: Any) -> Iterator[tuple[str, ui_support.Seeded]]:
    dsn = cluster.clone()
    yield dsn, ui_support.seed(dsn)
    cluster.drop_database(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
