"""``flowlane init``: scaffold a project that validates, compiles and serves at once.

Writes ``flows/hello.yaml`` (with the editor modeline), ``handlers.py``, a test of the flow
(``tests/test_hello.py``, run by flowlane's pytest plugin), the
JSON Schema the modeline points at, editor settings mapping ``flows/**/*.yaml`` to it
(VS Code, Helix), ``.gitignore`` entries for ``.flowlane/`` and ``.venv/``,
a CI workflow (``.github/workflows/flowlane.yml``) that installs ``requirements.txt``
(written with flowlane as it is installed here, PEP 610) and runs the tests, and the compiled
SQL.
Existing files are never overwritten.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from flowlane import errors
from flowlane.compiler import api, schema

SCHEMA_FILE = "flowlane.schema.json"
CI_WORKFLOW = ".github/workflows/flowlane.yml"
# target path -> packaged template
FILES = {
    "flows/hello.yaml": "hello.yaml",
    "handlers.py": "handlers.py",
    "tests/test_hello.py": "test_hello.py",
    CI_WORKFLOW: "flowlane.yml",
    # editors: the schema for every document of every flow file (a modeline covers one)
    ".vscode/settings.json": "vscode-settings.json",
    ".helix/languages.toml": "helix-languages.toml",
}
# the development database's directory and the virtual environment README creates
IGNORED = (".flowlane/", ".venv/")


@dataclass
class InitResult:
    written: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def init(root: Path) -> InitResult:
    """Scaffold ``root`` (created if needed); report what was written and what was kept."""
    result = InitResult()
    try:
        root.mkdir(parents=True, exist_ok=True)
        templates = resources.files("flowlane.app.scaffold") / "files"
        for target, template in FILES.items():
            _write(root, target, (templates / template).read_text("utf-8"), result)
        _write(root, SCHEMA_FILE, schema.schema_text(), result)
        _write(root, "requirements.txt", flowlane_requirement(), result)
        _ignore(root, result)
    except OSError as exc:
        raise errors.FlowlaneError(f"cannot scaffold {root}: {exc.strerror or exc}") from exc
    with contextlib.chdir(root):  # compiled headers name files relative to this project
        compiled = api.compile_paths(["flows"], "sql")
    if compiled.diagnostics:  # only when the user's existing flows/ has errors
        result.kept.append("sql/ (flows/ has errors: run `flowlane validate`)")
    elif compiled.summary.written:
        result.written.append("sql/")
    return result


def _write(root: Path, relative: str, text: str, result: InitResult) -> None:
    target = root / relative
    if target.exists():
        result.kept.append(relative)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    result.written.append(relative)


def _ignore(root: Path, result: InitResult) -> None:
    gitignore = root / ".gitignore"
    text = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
    present = {line.strip().rstrip("/") for line in text.splitlines()}
    missing = [entry for entry in IGNORED if entry.rstrip("/") not in present]
    if not missing:
        result.kept.append(".gitignore")
        return
    separator = "" if not text or text.endswith("\n") else "\n"
    gitignore.write_text(text + separator + "".join(f"{entry}\n" for entry in missing), encoding="utf-8")
    result.written.append(".gitignore")


def flowlane_requirement() -> str:
    """requirements.txt for flowlane as it is installed here: the wheel or repository URL it
    came from (``direct_url.json``), else the version from an index."""
    from importlib import metadata

    try:
        dist = metadata.distribution("flowlane")
    except metadata.PackageNotFoundError:
        return "# add flowlane as you install it (a wheel URL, a git URL, a version)\n"
    recorded = dist.read_text("direct_url.json")
    if not recorded:
        return f"flowlane=={dist.version}\n"
    source = json.loads(recorded)
    url = source["url"]
    vcs = source.get("vcs_info")
    if vcs:
        return f"flowlane @ {vcs['vcs']}+{url}@{vcs.get('commit_id', '')}\n".replace("@\n", "\n")
    if url.startswith("file:"):
        return (f"# flowlane was installed from {url}, which CI cannot reach: replace the next\n"
                "# line with a requirement it can install (a wheel URL, a git URL, a version)\n"
                f"flowlane @ {url}\n")
    return f"flowlane @ {url}\n"
