"""Where the project is: found like git finds a repository.

Every command, run from any subdirectory, uses the nearest directory upward
(starting with the current one) that holds a ``flows/`` directory, a
``pyproject.toml`` or a ``.flowlane/`` directory. ``FLOWLANE_PROJECT_DIR``
names the root explicitly. Without any marker, the current directory is the
root. The root holds the embedded database (``.flowlane/``), the flow YAML
(``flows/``) and the compiled SQL (``sql/``); paths given on the command line
stay relative to the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "FLOWLANE_PROJECT_DIR"
FLOWS_DIRNAME = "flows"
SQL_DIRNAME = "sql"
STATE_DIRNAME = ".flowlane"


def _is_root(directory: Path) -> bool:
    return (
        (directory / FLOWS_DIRNAME).is_dir()
        or (directory / "pyproject.toml").is_file()
        or (directory / STATE_DIRNAME).is_dir()
    )


def find_root(start: Path | None = None) -> Path:
    """The project root for ``start`` (default: the current directory)."""
    if start is None:
        explicit = os.environ.get(ENV_VAR)
        if explicit:
            return Path(explicit).resolve()
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if _is_root(directory):
            return directory
    return here


def relative(path: Path) -> str:
    """``path`` as the user would type it from the current directory."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def flows_dir() -> str:
    """The default PATHS: the project's ``flows/``."""
    return relative(find_root() / FLOWS_DIRNAME)


def sql_dir() -> str:
    """The default ``--out``: the project's ``sql/``."""
    return relative(find_root() / SQL_DIRNAME)


def repository_root(root: Path | None = None) -> Path:
    """The version-control checkout holding the project (the nearest directory upward with
    ``.git``), else the project root: what code scanning resolves file locations against."""
    project = (root or find_root()).resolve()
    for directory in (project, *project.parents):
        if (directory / ".git").exists():
            return directory
    return project
