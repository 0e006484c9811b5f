"""Golden files: valid YAML -> expected SQL; invalid YAML -> expected diagnostics text.

Each case is ``golden/valid/<case>.yaml`` + ``<case>.sql`` or
``golden/invalid/<case>.yaml`` + ``<case>.txt``. A case without its expected file
fails; ``python -m pytest tests/compiler/test_golden.py --update-golden`` writes
(or rewrites) the expected files, then read them and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane.compiler import analyze, api, codes, diagnostics, loader

GOLDEN = Path(__file__).parent / "golden"
VALID = sorted((GOLDEN / "valid").glob("*.yaml"))
INVALID = sorted((GOLDEN / "invalid").glob("*.yaml"))


def compile_case(case: Path) -> str:
    docs, findings = loader.load_file(case, case.name)
    project, more = analyze.analyze(docs)
    assert not findings and not more, diagnostics.format_text([*findings, *more])
    assert project is not None
    files = api.compile_project(project)
    return "".join(f"-- ==> {name} <==\n{text}" for name, text in sorted(files.items()))


def diagnose_case(case: Path) -> str:
    docs, findings = loader.load_file(case, case.name)
    _project, more = analyze.analyze(docs)
    return diagnostics.format_text(diagnostics.sort([*findings, *more]))


UPDATE_COMMAND = "python -m pytest tests/compiler/test_golden.py --update-golden"


def _compare(actual: str, expected_file: Path, update: bool) -> None:
    if update:
        expected_file.write_text(actual, encoding="utf-8")
    if not expected_file.exists():
        pytest.fail(
            f"{expected_file.parent.name}/{expected_file.name} is missing: write it with "
            f"`{UPDATE_COMMAND}`, read it, and commit it",
            pytrace=False,
        )
    assert actual == expected_file.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", VALID, ids=[c.stem for c in VALID])
def test_valid_case_compiles_to_expected_sql(case: Path, update_golden: bool) -> None:
    _compare(compile_case(case), case.with_suffix(".sql"), update_golden)


@pytest.mark.parametrize("case", INVALID, ids=[c.stem for c in INVALID])
def test_invalid_case_gives_expected_diagnostics(case: Path, update_golden: bool) -> None:
    text = diagnose_case(case)
    assert text, "an invalid case must produce diagnostics"
    _compare(text, case.with_suffix(".txt"), update_golden)


def test_invalid_cases_cover_every_code() -> None:
    seen: set[str] = set()
    for case in INVALID:
        docs, findings = loader.load_file(case, case.name)
        _project, more = analyze.analyze(docs)
        seen.update(d.code for d in [*findings, *more])
    assert len(INVALID) >= 40
    assert seen == set(codes.CODES) - codes.CHECK_CODES - codes.HANDLER_CODES


def test_every_finding_of_every_invalid_case_has_a_help_line() -> None:
    """The invalid cases cover every code (the test above): each finding says what to do."""
    without_help = []
    for case in INVALID:
        docs, findings = loader.load_file(case, case.name)
        _project, more = analyze.analyze(docs)
        without_help += [d.headline() for d in [*findings, *more] if not d.help]
    assert without_help == []


def test_every_named_code_is_a_code() -> None:
    named = {name: value for name, value in vars(codes).items()
             if name.isupper() and isinstance(value, str)}
    assert named
    assert set(named.values()) <= set(codes.CODES)


def test_a_missing_expected_file_fails_and_says_how_to_write_it(tmp_path: Path) -> None:
    missing = tmp_path / "new_case.sql"
    with pytest.raises(pytest.fail.Exception, match="--update-golden") as failure:
        _compare("select 1;\n", missing, update=False)
    assert "new_case.sql is missing" in str(failure.value)
    assert not missing.exists()


def test_a_broken_step_keeps_the_cycles_of_its_needs(tmp_path: Path) -> None:
    """A step with a schema error stands in with its needs only: findings about its needs
    are still reported, findings about its routing are not."""
    case = tmp_path / "flow.yaml"
    case.write_text("kind: flow\nslug: f\nqueues: {a: q}\nsteps:\n"
                    "  a: {handler: m:a, needs: [b]}\n"
                    "  b: {type: wait, timeot: 1h, needs: [a]}\n", encoding="utf-8")
    found = [d.code for d in analyze.analyze(loader.load_file(case, case.name)[0])[1]]
    assert sorted(found) == ["FL011", "FL031"]


def test_a_key_written_with_its_value_suggests_the_colon(tmp_path: Path) -> None:
    """``handler shop.x: y`` is one key with a space; its first word is a known key."""
    case = tmp_path / "flow.yaml"
    case.write_text("kind: flow\nslug: f\nsteps:\n  pack:\n    handler shop.shipping: pack\n"
                    "    type: wait\n", encoding="utf-8")
    found = analyze.analyze(loader.load_file(case, case.name)[0])[1]
    assert [(d.code, d.help) for d in found] == [
        ("FL011", "a colon is missing after `handler`: write `handler: ` and then its value")]
