"""Lint, type and layering checks are part of the suite: ruff, mypy and the import contracts
(``[tool.importlinter]`` in pyproject.toml) must stay clean."""

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


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")  # import-linter has no __main__
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text()
    command = readme.split("Install and run the whole test suite", 1)[1].split("```bash\n", 1)[1]
    command = command.split("\n", 1)[0]
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command
