"""The suite's layout (tests/README.md): a test's speed class is written in its own file, and a
test that needs a database without saying so fails instead of slowing the fast loop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

UNDECLARED = '''
import pytest

def test_without_a_database() -> None:
    assert True

def test_undeclared(dsn: str) -> None:
    raise AssertionError("never reached: the database is not made")

@pytest.mark.slow
def test_declared(dsn: str) -> None:
    raise AssertionError("deselected by the fast loop")
'''


def test_a_database_test_not_marked_slow_fails_in_the_fast_loop_before_any_database(tmp_path: Path) -> None:
    module = tmp_path / "test_new_feature.py"
    module.write_text(UNDECLARED)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "tests.conftest",
         "-o", "markers=slow", "--strict-markers", "-m", "not slow", "-q", str(module)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 1, result.stdout + result.stderr
    assert summary.startswith("1 passed, 1 deselected, 1 error"), result.stdout
    assert "test_new_feature.py::test_undeclared" in result.stdout
    assert "not marked slow: write `pytestmark = pytest.mark.slow`" in result.stdout
    assert "never reached" not in result.stdout


def test_no_conftest_decides_a_speed_class_the_test_file_does_not_show() -> None:
    inferring = [
        str(conftest.relative_to(REPO))
        for conftest in (REPO / "tests").rglob("conftest.py")
        if "add_marker" in conftest.read_text() or "pytest_collection_modifyitems" in conftest.read_text()
    ]
    assert inferring == []
