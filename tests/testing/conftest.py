"""The plugin's harness on the suite's server: a template with examples/testing applied once
per session, a copy per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flowlane.testing.harness import FlowTest, TestServer, flow_test
from tests.conftest import Cluster

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "testing"


@pytest.fixture(scope="session")
def test_server(cluster: Cluster) -> Iterator[TestServer]:
    server = TestServer(cluster.admin_dsn)
    yield server
    server.close()


@pytest.fixture(scope="session")
def project_template(test_server: TestServer) -> str:
    return test_server.template(PROJECT)


@pytest.fixture
def flows(test_server: TestServer, project_template: str) -> Iterator[FlowTest]:
    with flow_test(test_server, project_template, PROJECT) as test:
        yield test
