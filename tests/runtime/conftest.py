"""Runtime test fixtures: a database with the test flows applied, worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster
from tests.runtime import rt_support


@pytest.fixture
def flows_dsn(request: pytest.FixtureRequest, cluster: Cluster, db_factory: Callable[..., str]) -> str:
    """A fresh database with every flow of tests/runtime/project applied: a copy of a template
    they were applied to once per session (``dsn`` itself when the test uses it too)."""
    if "dsn" in request.fixturenames:
        dsn: str = request.getfixturevalue("dsn")
        rt_support.apply_flows(dsn)
        return dsn
    return db_factory(template=cluster.prepared_template("rt_flows", rt_support.apply_flows))


@pytest.fixture
def spawn(flows_dsn: str, tmp_path: Path) -> Iterator[Callable[..., rt_support.WorkerProcess]]:
    """``spawn("--flow", "x")``: a ready worker process on ``flows_dsn``, stopped after the test."""
    started: list[rt_support.WorkerProcess] = []

    def make(*args: str, ready: bool = True) -> rt_support.WorkerProcess:
        worker = rt_support.WorkerProcess(flows_dsn, tmp_path, *args)
        started.append(worker)
        return worker.wait_ready() if ready else worker

    yield make
    for worker in started:
        worker.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in rt_support.REPORT:
        terminalreporter.write_line(line)
