from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine


@pytest.fixture
def engine(conn: psycopg.Connection[Any]) -> Engine:
    """An Engine on a fresh database migrated to head."""
    return Engine(conn)


@pytest.fixture
def engine_0001(db_factory: Callable[..., str]) -> Iterator[Engine]:
    """An Engine on a fresh database migrated only to 0001."""
    with psycopg.connect(db_factory("0001"), autocommit=True) as connection:
        yield Engine(connection)
