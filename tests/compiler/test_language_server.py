"""The real YAML language server (npm `yaml-language-server`, installed by
tools/install-editor-clients.sh) over LSP, configured as `flowlane init` configures editors:
on the examples and the golden invalid cases, its errors land on the lines where
`flowlane validate` reports what a JSON Schema can state; every document of a file is
checked; completion offers the keys of a step and no object examples."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowlane.compiler import api, schema
from tests.cli_support import REPO
from tests.compiler.lsp_client import LanguageServer

SCAFFOLD = REPO / "flowlane" / "app" / "scaffold" / "files"
GOLDEN = REPO / "tests" / "compiler" / "golden" / "invalid"
EXAMPLES = sorted((REPO / "flows").glob("*.yaml"))
# what the schema states (and so an editor reports); the rest needs the whole project
SCHEMA_CODES = {"FL003", "FL004", "FL010", "FL011", "FL012", "FL013", "FL014", "FL015",
                "FL020", "FL032", "FL033", "FL034", "FL036", "FL037", "FL038", "FL040", "FL070",
                "FL180", "FL181", "FL184", "FL185", "FL187"}
# YAML-level findings where editors follow YAML 1.2 and flowlane is stricter or locates
# differently: syntax errors, tabs, anchors and merge keys, tags, empty documents, encoding
YAML_LEVEL = {"FL001", "FL002", "FL005", "FL006", "FL007", "FL008"}
ERROR = 1  # LSP DiagnosticSeverity.Error

# a Node.js server process per module and a round trip per file: the full suite's, not the
# fast loop's (like the tests that start worker processes)
pytestmark = pytest.mark.slow


def settings(schema_uri: str) -> dict[str, object]:
    return {"yaml": {"validate": True, "completion": True, "hover": True,
                     "schemaStore": {"enable": False},
                     "schemas": {schema_uri: ["**/*.yaml", "*.yaml"]}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanguageServer]:
    published = tmp_path_factory.mktemp("schema") / schema.SCHEMA_FILE
    published.write_text(schema.schema_text())  # exactly what `flowlane schema` prints
    with LanguageServer(REPO, settings(published.as_uri())) as running:
        yield running


def _editor_lines(server: LanguageServer, path: Path, text: str | None = None) -> set[int]:
    return {d["range"]["start"]["line"] + 1 for d in server.diagnose(path, text)
            if d.get("severity", ERROR) == ERROR}


def _golden_cases() -> list[Path]:
    cases = []
    for path in sorted(GOLDEN.glob("*.yaml")):
        codes = {d.code for d in api.validate([path])}
        if not codes & YAML_LEVEL:
            cases.append(path)
    return cases


def test_the_comparison_covers_most_golden_cases() -> None:
    assert len(_golden_cases()) >= 50


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_clean_in_the_editor_and_the_cli(server: LanguageServer,
                                                      path: Path) -> None:
    assert api.validate([path]) == []
    assert _editor_lines(server, path) == set()


@pytest.mark.parametrize("path", _golden_cases(), ids=lambda p: p.stem)
def test_editor_errors_land_where_validate_reports_schema_findings(
        server: LanguageServer, path: Path) -> None:
    found = api.validate([path])
    expected = {d.line for d in found if d.code in SCHEMA_CODES}
    assert _editor_lines(server, path) == expected, [d.headline() for d in found]


MODELINE = "# yaml-language-server: $schema=../flowlane.schema.json"


def _every_document_broken() -> str:
    """The multi-document example with an unknown key in each of its six documents."""
    text = (REPO / "flows" / "community_threads.yaml").read_text()
    broken = text.replace("\nkind: ", "\nbogus_key: 1\nkind: ")
    assert broken.count("bogus_key") == text.count("\nkind: ") == 6
    return "\n".join(line for line in broken.splitlines() if "yaml-language-server" not in line)


def _project(tmp_path: Path, text: str, name: str = "community_threads.yaml") -> Path:
    (tmp_path / "flowlane.schema.json").write_text(schema.schema_text())
    path = tmp_path / "flows" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_every_document_is_checked_with_the_editor_settings_init_writes(
        tmp_path: Path) -> None:
    init_settings = json.loads((SCAFFOLD / "vscode-settings.json").read_text())
    path = _project(tmp_path, _every_document_broken())
    cli = {d.line for d in api.validate([path])}
    assert len(cli) == 6
    with LanguageServer(tmp_path, {"yaml": {"validate": True, "schemaStore": {"enable": False},
                                            "schemas": init_settings["yaml.schemas"]}}) as ls:
        assert _editor_lines(ls, path) == cli


@pytest.mark.parametrize("path", [*EXAMPLES, SCAFFOLD / "hello.yaml"], ids=lambda p: p.name)
def test_every_document_of_the_examples_carries_a_modeline(path: Path) -> None:
    documents = path.read_text().split("\n---\n")
    assert all(doc.startswith("# yaml-language-server: $schema=") for doc in documents)


def test_every_document_is_checked_with_a_modeline_on_each(tmp_path: Path) -> None:
    text = _every_document_broken()
    with LanguageServer(tmp_path, {"yaml": {"validate": True,
                                            "schemaStore": {"enable": False}}}) as bare:
        first_only = _project(tmp_path, f"{MODELINE}\n{text}")
        cli = {d.line for d in api.validate([first_only])}
        assert len(_editor_lines(bare, first_only)) == 1  # one modeline: one document
        every = _project(tmp_path, f"{MODELINE}\n" + text.replace("\n---\n",
                                                                   f"\n---\n{MODELINE}\n"),
                         "every.yaml")
        cli = {d.line for d in api.validate([every])}
        assert len(cli) == 6
        assert _editor_lines(bare, every) == cli


@pytest.mark.parametrize(("text", "line"), [
    ("kind: alias\nslug: a\nactive: a_v2\ndraining: [a_v1, a_v1]\n", 4),
    ("kind: flow\nslug: a\nsteps:\n  s:\n    handler: m:f\n    needs: [Not-a-slug]\n", 6),
])
def test_rules_only_editors_see_early(server: LanguageServer, tmp_path: Path, text: str,
                                      line: int) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(text)
    assert _editor_lines(server, path) == {line}
    assert line in {d.line for d in api.validate([path])}


def test_pattern_errors_read_as_sentences(server: LanguageServer, tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("kind: flow\nslug: 9lives\nsteps:\n  s:\n    handler: nope\n")
    messages = sorted(d["message"] for d in server.diagnose(path))
    slug = ("A slug is letters, digits and `_`, starting with a letter, with no `__` and no "
            "trailing `_` (e.g. `fetch_threads`).")
    assert messages == [slug, "Write the handler as `package.module:function`."]


def test_completion_offers_step_keys_and_no_objects(server: LanguageServer,
                                                    tmp_path: Path) -> None:
    text = "kind: flow\nslug: a\nsteps:\n  s:\n    handler: m:f\n    \n"
    path = tmp_path / "f.yaml"
    path.write_text(text)
    uri = server.open(path)
    labels = {item["label"] for item in server.complete(uri, 5, 4)}
    assert {"needs", "type", "if", "unless", "when_unmet", "timeout"} <= labels
    for line, col in ((5, 4), (2, 2)):
        for item in server.complete(uri, line, col):
            assert "[object Object]" not in str(item)
