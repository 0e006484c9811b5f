"""The compiled format (docs/compiled-format.md): rendered files read back exactly, and files
written by the format-1 template (tests/compiler/format1, compiled at e4f5b78) still read by
``check --base``, orphan detection and the statements ``apply`` runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings

from flowlane.compiler import api, check, compiled, shape
from tests.compiler.strategies import flow_documents, to_yaml
from tests.compiler.test_cli import commit_all, git, run

FORMAT1 = Path(__file__).parent / "format1"
FORMAT1_FLOW = (FORMAT1 / "sql" / "flows" / "quoting.sql").read_text(encoding="utf-8")
FORMAT1_DIGEST = "be216b12118fbc51f2d324f415e1977e477df5048b62dc1802b95d331c5b4320"


@settings(max_examples=60, deadline=None)
@given(flow_documents())
def test_render_then_read_gives_back_the_header_and_the_shape(document: dict[str, Any]) -> None:
    project = api.project_from_text(to_yaml(document), "f.yaml")
    flow = project.flows[0]
    files = api.compile_project(project)
    text = files[compiled.flow_path(flow.slug)]
    found = compiled.read(text)
    expected_shape = shape.flow_shape(flow)
    assert found == compiled.CompiledFile(
        compiled.Header(compiled.FORMAT, "flow", flow.slug, shape.shape_sha256(expected_shape)),
        expected_shape)
    header_fields = json.loads(text.split("\n", 1)[0].removeprefix(compiled.HEADER_PREFIX))
    assert header_fields == {"format": 2, "kind": "flow", "slug": flow.slug,
                             "shape_sha256": shape.shape_sha256(expected_shape)}
    assert compiled.is_compiled_flow(text.encode()[:compiled.HEADER_LIMIT])
    aliases = compiled.read(files[compiled.ALIASES_FILE])
    assert aliases == compiled.CompiledFile(compiled.Header(compiled.FORMAT, "aliases"))
    assert not compiled.is_compiled_flow(files[compiled.ALIASES_FILE].encode())
    body = compiled.statements(text)
    assert "begin;" not in body.split("\n") and "commit;" not in body.split("\n")
    assert body.count("\n") == text.count("\n") - 2


def test_a_hand_edited_shape_no_longer_matches_its_digest() -> None:
    text = api.compile_project(api.project_from_text(
        "kind: flow\nslug: f\nsteps:\n  a:\n    handler: m:a\n"))["flows/f.sql"]
    edited = text.replace('"type":"single"', '"type":"map"')
    assert edited != text
    found = compiled.read(edited)
    assert found is not None and found.header.slug == "f" and found.shape is None


@pytest.mark.parametrize("first_line", [
    "-- my own SQL", "-- flowlane-compiled: not json", '-- flowlane-compiled: {"kind":"flow"}',
    '-- flowlane-compiled: {"format":2,"kind":"flow","slug":"f"}', "select 1;", "",
])
def test_other_sql_is_not_a_compiled_file(first_line: str) -> None:
    assert compiled.read(first_line + "\nselect 1;\n") is None
    assert not compiled.is_compiled_flow(first_line.encode())


def test_a_format_1_file_is_read_with_its_slug_digest_and_shape() -> None:
    found = compiled.read(FORMAT1_FLOW)
    project = api.load_project([FORMAT1 / "flows"])
    assert found == compiled.CompiledFile(compiled.Header(1, "flow", "quoting", FORMAT1_DIGEST),
                                          shape.flow_shape(project.flows[0]))
    aliases = (FORMAT1 / "sql" / "aliases.sql").read_text(encoding="utf-8")
    assert compiled.read(aliases) == compiled.CompiledFile(compiled.Header(1, "aliases"))
    # the current template renders the same statements, only the header differs
    current = api.compile_project(project)["flows/quoting.sql"]
    assert current.split("\n")[2:] == FORMAT1_FLOW.split("\n")[2:]
    assert current.split("\n")[:2] != FORMAT1_FLOW.split("\n")[:2]


@pytest.fixture
def format1_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(FORMAT1 / "flows", tmp_path / "flows")
    shutil.copytree(FORMAT1 / "sql", tmp_path / "sql")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_check_base_reads_a_committed_format_1_file(
    format1_project: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    git(format1_project, "init", "-q")
    commit_all(format1_project, "format 1")
    # the YAML is unchanged: the shape matches; only the header is stale
    code, out, _ = run(capsys, "check")
    assert code == 1 and "error[FL090]" in out and "NEW_VERSION_REQUIRED" not in out
    assert run(capsys, "compile")[0] == 0
    assert run(capsys, "check")[0] == 0
    # a structural change is measured against the shape in the format-1 file
    yaml_file = format1_project / "flows" / "quoting.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("  check:\n", "  check:\n    type: map\n"))
    assert run(capsys, "compile")[0] == 0
    code, out, _ = run(capsys, "check")
    assert code == 1 and "NEW_VERSION_REQUIRED: flow `quoting`" in out
    assert "step 0 (check): type is single in the base, map in the YAML" in out


def test_orphan_detection_owns_format_1_flow_files(format1_project: Path) -> None:
    out = format1_project / "sql"
    (out / "flows" / "mine.sql").write_text("-- hand-written, not flowlane's\nselect 1;\n")
    assert api.orphans({}, out) == ["flows/quoting.sql"]
    summary = api.write_output({"aliases.sql": compiled.render_aliases(
        api.project_from_text("kind: flow\nslug: other\nsteps:\n  a:\n    handler: m:a\n"))}, out)
    assert summary.removed == ("flows/quoting.sql",)
    assert not (out / "flows" / "quoting.sql").exists() and (out / "flows" / "mine.sql").exists()
    assert check.committed_shape(FORMAT1_FLOW) is not None


@pytest.mark.slow
def test_the_statements_of_a_format_1_file_apply_like_the_current_ones(
    conn: psycopg.Connection[Any],
) -> None:
    project = api.load_project([FORMAT1 / "flows"])
    with conn.transaction():
        conn.execute(compiled.statements(FORMAT1_FLOW))
    stored = conn.execute("select flowlane.get_flow_shape('quoting')").fetchone()
    assert stored is not None and stored[0] == shape.flow_shape(project.flows[0])
    # the current file runs on top of it: the same shape, nothing to change
    with conn.transaction():
        conn.execute(compiled.statements(compiled.render_flow(project.flows[0])))
    assert conn.execute("select count(*) from flowlane.steps where flow_slug = 'quoting'"
                        ).fetchone() == (1,)
