"""The pytest plugin in a project of its own: `flowlane init`'s test passes under it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_the_project_init_writes_passes_its_own_tests(tmp_path: Path, cluster: Cluster) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLOWLANE_TEST_DSN": cluster.admin_dsn,
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # the plugin by name, installed or not
    subprocess.run([sys.executable, "-m", "flowlane", "init", "proj"], cwd=tmp_path, env=env,
                   check=True, capture_output=True)
    project = tmp_path / "proj"
    tested = subprocess.run([sys.executable, "-m", "pytest", "-p", "flowlane.testing.plugin",
                             "-p", "no:cacheprovider", "-q"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout


def test_the_example_project_passes_its_tests(cluster: Cluster) -> None:
    """examples/testing/tests: retries, a signal, a deadline and a schedule on the test's clock."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLOWLANE_TEST_DSN": cluster.admin_dsn,
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    tested = subprocess.run([sys.executable, "-m", "pytest", "-p", "flowlane.testing.plugin",
                             "-p", "no:cacheprovider", "-q", "--durations=0"],
                            cwd=REPO / "examples" / "testing", env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "7 passed" in tested.stdout
