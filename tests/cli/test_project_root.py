"""Project root discovery: every command, run from a subdirectory, uses the project's
flows/, sql/ and .flowlane/ (like git finds its repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane import project_root
from tests.cli_support import run_flowlane

FLOW = """\
kind: flow
slug: hello
steps:
  greet:
    handler: handlers:greet
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "hello.yaml").write_text(FLOW)
    (tmp_path / "etl" / "deep").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize("marker", ["flows", "pyproject.toml", ".flowlane"])
def test_nearest_marker_upward_is_the_root(tmp_path: Path, marker: str) -> None:
    if marker.endswith(".toml"):
        (tmp_path / marker).write_text("")
    else:
        (tmp_path / marker).mkdir()
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    assert project_root.find_root(inner) == tmp_path.resolve()


def test_a_nearer_marker_wins(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "sub" / "flows").mkdir(parents=True)
    assert project_root.find_root(tmp_path / "sub") == (tmp_path / "sub").resolve()


def test_compile_from_a_subdirectory_writes_the_projects_sql(project: Path) -> None:
    from_root = run_flowlane("compile", cwd=project)
    assert from_root.returncode == 0, from_root.stderr
    reference = (project / "sql" / "flows" / "hello.sql").read_bytes()
    (project / "sql" / "flows" / "hello.sql").unlink()

    result = run_flowlane("compile", cwd=project / "etl" / "deep")
    assert result.returncode == 0, result.stderr
    assert (project / "sql" / "flows" / "hello.sql").read_bytes() == reference
    assert not (project / "etl" / "deep" / "sql").exists()
    check = run_flowlane("check", cwd=project / "etl")
    assert check.returncode == 0, check.stdout + check.stderr


def test_validate_from_a_subdirectory_reads_the_projects_flows(project: Path) -> None:
    result = run_flowlane("validate", cwd=project / "etl")
    assert result.returncode == 0, result.stderr
    assert "ok: 1 flow(s)" in result.stdout


def test_database_commands_use_the_projects_flowlane_dir(project: Path) -> None:
    result = run_flowlane("db", "url", cwd=project / "etl" / "deep")
    assert result.returncode == 1
    assert f"{project.resolve() / '.flowlane' / 'pgdata'} is not running" in result.stderr
    assert not (project / "etl" / ".flowlane").exists()
    assert not (project / "etl" / "deep" / ".flowlane").exists()


def test_explicit_project_dir_wins(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    result = run_flowlane(
        "validate", cwd=elsewhere, env={"FLOWLANE_PROJECT_DIR": str(project)}
    )
    assert result.returncode == 0, result.stderr
    assert "ok: 1 flow(s)" in result.stdout
