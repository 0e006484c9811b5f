"""Read committed files from git (``check --base REV``). No git library: the git CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

from flowlane import errors


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)
    except OSError as exc:
        raise errors.UsageError("git is not available", hint="install git or pass no --base") \
            from exc


def _existing_dir(path: Path) -> Path:
    path = path.resolve()
    while not path.is_dir():
        path = path.parent
    return path


def toplevel(path: Path) -> Path | None:
    result = _git(["rev-parse", "--show-toplevel"], _existing_dir(path))
    if result.returncode != 0:
        return None
    return Path(result.stdout.decode().strip())


def revision_exists(rev: str, path: Path) -> bool:
    result = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], _existing_dir(path))
    return result.returncode == 0


def show(rev: str, file: Path) -> str | None:
    """The text of ``file`` at ``rev``, or None when it did not exist there."""
    top = toplevel(file)
    if top is None:
        return None
    relative = file.resolve().relative_to(top.resolve()).as_posix()
    result = _git(["show", f"{rev}:{relative}"], top)
    if result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", errors="replace")
