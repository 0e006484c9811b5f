"""The previous flowlane release, for the tests that upgrade from it while its workers run.

The migration under test is the pending one (``migrator.pending()``), or at a release commit,
where nothing is pending, the newest released one. The previous release is the newest
release in ``released.json`` that does not ship it: its schema is the migrations it ships
(``migrate(to=...)`` its last one), and its code is its release commit: the last commit whose
``flowlane/__init__.py`` holds its version (the parent of the commit that moved the version
on), taken from git history (``git archive``).
"""

from __future__ import annotations

import subprocess
import tarfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from flowlane.core import migrator
from flowlane.core.queries import named_blocks
from tests.cli_support import REPO

MIGRATIONS = "flowlane/core/migrations"
VERSION_FILE = "flowlane/__init__.py"


@dataclass(frozen=True)
class PreviousRelease:
    name: str
    last_migration: str  # the version of its newest migration: ``migrate(to=...)`` gives its schema
    commit: str
    upgrade: migrator.Migration  # the migration that brings its schema to this checkout's

    def unpack(self, into: Path) -> Path:
        """Its ``flowlane`` package, from its commit, in ``into`` (a root for PYTHONPATH)."""
        archive = _git("archive", "--format=tar", self.commit, "flowlane").stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")
        return into

    def queries(self) -> dict[str, str]:
        """Its named queries (``flowlane/core/sql/*.sql``): what its workers send."""
        found: dict[str, str] = {}
        for name in _git("ls-tree", "--name-only", self.commit, "flowlane/core/sql/").stdout.decode().split():
            if name.endswith(".sql"):
                found.update(named_blocks(_git("show", f"{self.commit}:{name}").stdout.decode()))
        return found


def previous_release() -> PreviousRelease:
    upgrade = migrator.pending() or migrator.discover()[-1]
    shipped = {name: files for name, files in migrator.released().items() if upgrade.filename not in files}
    assert shipped, f"no release precedes {upgrade.filename}"
    name = _newest(shipped)
    commit = _release_commit(name)
    last = max(shipped[name])
    at_commit = sorted(n.rsplit("/", 1)[-1] for n in _git("ls-tree", "--name-only", commit, f"{MIGRATIONS}/")
                       .stdout.decode().split() if n.endswith(".sql"))
    assert at_commit[-1] == last, f"{commit} ships {at_commit[-1]}, not release {name}'s {last}"
    return PreviousRelease(name, last.split("_", 1)[0], commit, upgrade)


def _newest(manifest: dict[str, dict[str, str]]) -> str:
    """The release that shipped the newest migration."""
    return max(manifest, key=lambda release: max(manifest[release]))


def _release_commit(name: str) -> str:
    """The last commit at version ``name``: the parent of the newest commit that changed the
    version line away from it."""
    version_line = f'__version__ = "{name}"'
    changes = _git("log", "--format=%H", "-S", version_line, "--", VERSION_FILE).stdout.decode().split()
    assert changes, f"no commit ever held version {name}"
    moved_on = changes[0]
    assert version_line not in _git("show", f"{moved_on}:{VERSION_FILE}").stdout.decode(), (
        f"the version is still {name}: no later release to upgrade to")
    return _git("rev-parse", f"{moved_on}^").stdout.decode().strip()


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, check=True)
