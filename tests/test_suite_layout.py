"""The suite's layout (tests/README.md): a test's speed class is written in its own file, and a
test that needs a database without saying so fails instead of slowing the fast loop; the
tests that hold the docs to the code read them as data (tests/docs_support.py); the feature
index names modules that exist."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from flowlane.errors import WorkerExit
from tests.docs_support import CELL_BORDER, RULE_CELL, prose, table

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


def _padded(text: str) -> str:
    """``text`` with its table rules and cells padded as a Markdown formatter aligns them."""
    def pad(line: str) -> str:
        if not line.startswith("|"):
            return line
        cells = [cell.strip() for cell in CELL_BORDER.split(line.strip("|"))]
        cells = [" --- " if RULE_CELL.fullmatch(cell) else f"  {cell:<40}" for cell in cells]
        return "|" + "|".join(cells) + "|"
    return "\n".join(pad(line) for line in text.splitlines())


def test_the_docs_read_the_same_rewrapped_and_realigned(tmp_path: Path) -> None:
    runtime = (REPO / "docs" / "runtime.md").read_text(encoding="utf-8")
    paragraphs = runtime.split("\n\n")
    rewrapped = "\n\n".join(
        p if p.lstrip().startswith(("|", "#", "`")) else textwrap.fill(p, 60, break_on_hyphens=False)
        for p in paragraphs)
    assert rewrapped != runtime
    (tmp_path / "original.md").write_text(runtime, encoding="utf-8")
    (tmp_path / "rewrapped.md").write_text(rewrapped, encoding="utf-8")
    assert prose(tmp_path / "rewrapped.md") == prose(tmp_path / "original.md")
    exit_statuses = table(runtime, "status")
    assert len(exit_statuses) >= 5
    assert table(_padded(runtime), "status") == exit_statuses
    assert [row["status"] for row in exit_statuses] == [str(status.value) for status in WorkerExit]


def _expanded(pattern: str) -> list[str]:
    """``core/test_{units_,}pooler.py`` -> both names (a shell's brace expansion, one level)."""
    head, brace, rest = pattern.partition("{")
    if not brace:
        return [pattern]
    choices, _, tail = rest.partition("}")
    return [name for choice in choices.split(",") for name in _expanded(head + choice + tail)]


def test_every_module_the_feature_index_names_exists() -> None:
    rows = table((REPO / "tests" / "README.md").read_text(encoding="utf-8"), "feature")
    assert len(rows) > 10
    for row in rows:
        for pattern in re.findall(r"`([\w/{},*]+\.py)`", row["modules"]):
            for name in _expanded(pattern):
                assert list((REPO / "tests").glob(name)), (row["feature"], name)
