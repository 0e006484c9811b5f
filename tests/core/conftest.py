from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine, assert_invariants, run_state_violations


def _passed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return request.node.get_closest_marker("no_invariants") is None and (
        report is None or report.passed)


@pytest.fixture
def db_factory(
    db_factory: Callable[..., str], request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    """Every database a core test makes is checked for run-state consistency after the test
    (whatever the fixture it came through: engine, conn, dsn, a migration version)."""
    made: list[str] = []

    def make(version: str | None = None, **options: Any) -> str:
        made.append(db_factory(version, **options))
        return made[-1]

    yield make
    if _passed(request):
        for dsn in made:
            with psycopg.connect(dsn, autocommit=True) as connection:
                violations = run_state_violations(connection)
            assert violations == {}, f"run-state invariant violated: {violations}"


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
