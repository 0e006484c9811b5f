"""An alias move reports whether the new version's input contract accepts every input the
old one accepted: ``check --base`` offline, ``plan`` against a database (text and markdown)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane.compiler import contracts
from tests.compiler.test_cli import commit_all, git, run

V1 = """
kind: flow
slug: orders_v1
input_schema:
  type: object
  required: [customer]
  properties:
    customer: {type: string}
    size: {type: number, minimum: 0}
    kind: {enum: [retail, wholesale]}
steps:
  a: {handler: m.h:a}
"""
ALIAS = "---\nkind: alias\nslug: orders\nactive: {active}\ndraining: [{draining}]\n"
COMPATIBLE = V1.replace("orders_v1", "orders_v2").replace("[retail, wholesale]", "[retail, wholesale, gift]")
BREAKING = (V1.replace("orders_v1", "orders_v3").replace("required: [customer]", "required: [customer, size]")
            .replace("type: number, minimum: 0", "type: integer, minimum: 1")
            .replace("[retail, wholesale]", "[retail]")
            .replace("  properties:\n", "  additionalProperties: false\n  properties:\n", 1))


def _write(project: Path, *documents: str) -> None:
    (project / "flows" / "hello.yaml").write_text("".join(documents))


@pytest.fixture
def moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    project = tmp_path
    (project / "flows").mkdir()
    monkeypatch.chdir(project)
    git(project, "init", "-q")
    _write(project, V1, ALIAS.format(active="orders_v1", draining="").replace("draining: []\n", ""))
    assert run(capsys, "compile")[0] == 0
    commit_all(project)
    return project


def test_check_base_reports_a_compatible_move(moved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(moved, V1, "---" + COMPATIBLE, ALIAS.format(active="orders_v2", draining="orders_v1"))
    run(capsys, "compile")
    code, out, _ = run(capsys, "check")
    assert code == 0, out
    assert "ALIAS_MOVE alias orders: orders_v1 -> orders_v2\n" in out
    assert "  input contract: orders_v2 accepts every input orders_v1 accepted (checked rule by rule" in out


def test_check_base_names_each_breaking_rule(moved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(moved, V1, "---" + BREAKING, ALIAS.format(active="orders_v3", draining="orders_v1"))
    run(capsys, "compile")
    code, out, _ = run(capsys, "check")
    assert code == 0, out  # a breaking contract is reported, the move itself is allowed
    assert "  input contract: BREAKING, orders_v3 may refuse inputs orders_v1 accepted:\n" in out
    for rule in ("field newly required: /size", "additional properties closed at /",
                 "type narrowed at /size: number -> integer", "bound tightened at /size: minimum 0 -> 1",
                 'enum shrunk at /kind: ["wholesale"] no longer accepted'):
        assert f"    {rule}\n" in out, out


@pytest.mark.slow
def test_plan_reports_the_contract_of_an_alias_move(dsn: str, moved: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "apply", "--dsn", dsn)[0] == 0
    _write(moved, V1, "---" + BREAKING, ALIAS.format(active="orders_v3", draining="orders_v1"))
    run(capsys, "compile")
    code, out, _ = run(capsys, "plan", "--dsn", dsn)
    assert code == 0, out
    assert "ALIAS_MOVE" in out and "BREAKING, orders_v3 may refuse inputs orders_v1 accepted" in out
    assert "field newly required: /size" in out
    code, out, _ = run(capsys, "plan", "--dsn", dsn, "--format", "markdown")
    assert code == 0 and "field newly required: /size" in out


@pytest.mark.parametrize(("old", "new", "expected"), [
    (None, {"type": "object"}, ["input_schema added: the old version accepted any input"]),
    ({"type": "object"}, None, []),
    ({"type": "integer"}, {"type": "number"}, []),
    ({"type": ["string", "null"]}, {"type": "string"}, ["type narrowed at /: string or null -> string"]),
    ({"maxLength": 5}, {"maxLength": 9}, []),
    ({"maxItems": 5}, {"maxItems": 3}, ["bound tightened at /: maxItems 5 -> 3"]),
    ({"items": {"type": "string"}}, {"items": {"type": "string", "minLength": 1}},
     ["bound tightened at /*: minLength none -> 1"]),
    ({"pattern": "^a"}, {"pattern": "^b"}, ["pattern changed at / (not compared: it may refuse old inputs)"]),
])
def test_breaking_rules(old: object, new: object, expected: list[str]) -> None:
    assert contracts.breaking_changes(old, new) == expected
