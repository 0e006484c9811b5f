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


def show_many(rev: str, files: list[Path]) -> dict[Path, str | None]:
    """The text of every file at ``rev`` (None where absent), read by one ``git cat-file``."""
    if not files:
        return {}
    top = toplevel(files[0])
    if top is None:
        return dict.fromkeys(files)
    inside = [f for f in files if f.resolve().is_relative_to(top.resolve())]
    if not inside:
        return dict.fromkeys(files)
    specs = [f"{rev}:{f.resolve().relative_to(top.resolve()).as_posix()}" for f in inside]
    try:
        result = subprocess.run(["git", "cat-file", "--batch"], cwd=top, check=False,
                                input="".join(f"{s}\n" for s in specs).encode(),
                                capture_output=True)
    except OSError as exc:
        raise errors.UsageError("git is not available") from exc
    found = dict(zip(inside, _parse_batch(result.stdout, len(specs)), strict=True))
    return {f: found.get(f) for f in files}


def _parse_batch(output: bytes, count: int) -> list[str | None]:
    texts: list[str | None] = []
    position = 0
    for _ in range(count):
        end = output.index(b"\n", position)
        header = output[position:end].split()
        position = end + 1
        if len(header) != 3 or header[1] != b"blob":
            texts.append(None)  # "<spec> missing" or not a file
            continue
        size = int(header[2])
        texts.append(output[position:position + size].decode("utf-8", errors="replace"))
        position += size + 1
    return texts
