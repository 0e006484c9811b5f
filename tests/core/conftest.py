from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine, assert_invariants


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "no_invariants: the test breaks engine state on purpose; skip the final check"
    )


@pytest.fixture
def engine(conn: psycopg.Connection[Any], request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An Engine on a fresh database migrated to head; invariants are checked after the test."""
    engine = Engine(conn)
    yield engine
    if request.node.get_closest_marker("no_invariants") is None and not conn.closed:
        failed = getattr(request.node, "rep_call", None)
        if failed is None or failed.passed:
            assert_invariants(engine)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@pytest.fixture
def engine_0001(db_factory: Callable[..., str]) -> Iterator[Engine]:
    """An Engine on a fresh database migrated only to 0001."""
    with psycopg.connect(db_factory("0001"), autocommit=True) as connection:
        yield Engine(connection)
