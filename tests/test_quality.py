"""Lint and type checks are part of the suite: ruff and mypy must stay clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)


def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
