"""Run the ``flowlane`` CLI as a user does: a subprocess of this interpreter.

``tests/conftest.py`` removes ``FLOWLANE_DSN`` and ``DATABASE_URL`` from the
environment at import, so a subprocess never reaches a developer's database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli_env(root: Path = REPO, **extra: str) -> dict[str, str]:
    """The test environment with ``root`` importable as the flowlane checkout."""
    return {**os.environ, "PYTHONPATH": str(root), **extra}


def run_flowlane(
    *args: str,
    cwd: Path,
    root: Path = REPO,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python -m flowlane ARGS`` in ``cwd``; output captured, exit code not checked."""
    return subprocess.run(
        [sys.executable, "-m", "flowlane", *args],
        cwd=cwd,
        env={**cli_env(root), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
