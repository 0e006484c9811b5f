"""The compiler commands end to end through ``flowlane.cli.main`` (no database)."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
from pathlib import Path

import pytest

from flowlane.cli import main
from tests.cli_support import run_flowlane

HELLO = """kind: flow
slug: hello
steps:
  greet:
    handler: m:greet
  shout:
    needs: [greet]
    handler: m:shout
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "hello.yaml").write_text(HELLO)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_joined(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The exit status and what the command printed, stdout then stderr."""
    code, out, err = run(capsys, *argv)
    return code, out + err


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def commit_all(root: Path, message: str = "c") -> None:
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", message)


def test_validate_ok_and_error_exit_codes(project: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    assert run(capsys, "validate")[0] == 0
    (project / "flows" / "bad.yaml").write_text("kind: flow\nslug: bad\nsteps:\n  a:\n"
                                                "    handler: m:a\n    needs: [b]\n")
    code, out, _ = run(capsys, "validate")
    assert code == 1
    assert "flows/bad.yaml:6:13: error[FL030]: step `a` needs unknown step `b`" in out
    assert "help:" in out and "^" in out


def test_validate_json_and_sarif(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "flows" / "bad.yaml").write_text("kind: flow\nslug: bad\nsteps: {}\nextra: 1\n")
    code, out, _ = run(capsys, "validate", "--format", "json")
    assert code == 1
    found = json.loads(out)
    assert {d["code"] for d in found} == {"FL011", "FL013"}
    assert all({"path", "line", "col", "message", "help"} <= set(d) for d in found)
    code, out, _ = run(capsys, "validate", "--format", "sarif")
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0"
    results = sarif["runs"][0]["results"]
    assert {r["ruleId"] for r in results} == {"FL011", "FL013"}
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "flows/bad.yaml"


def test_validate_missing_path_is_a_finding(project: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    code, out, _ = run(capsys, "validate", "nowhere")
    assert code == 1 and "FL008" in out


def test_compile_writes_only_changed_files(project: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    code, out, _ = run(capsys, "compile")
    assert code == 0 and "2 written, 0 unchanged, 0 removed" in out
    sql = project / "sql" / "flows" / "hello.sql"
    stamp = sql.stat().st_mtime_ns
    _code, out, _ = run(capsys, "compile")
    assert "0 written, 2 unchanged" in out and sql.stat().st_mtime_ns == stamp
    (project / "flows" / "hello.yaml").write_text(HELLO.replace("m:shout", "m:yell"))
    code, out, _ = run(capsys, "compile")
    assert "0 written, 2 unchanged" in out  # handlers are not in the SQL
    (project / "flows" / "hello.yaml").write_text(HELLO + "defaults: {timeout: 9}\n")
    code, out, _ = run(capsys, "compile")
    assert "1 written, 1 unchanged" in out


def test_compile_with_errors_writes_nothing(project: Path, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    (project / "flows" / "bad.yaml").write_text("kind: flow\n")
    code, _, err = run(capsys, "compile")
    assert code == 1 and "nothing written" in err
    assert not (project / "sql").exists()


def test_compile_removes_sql_of_deleted_flows(project: Path, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    (project / "flows" / "two.yaml").write_text(HELLO.replace("hello", "two"))
    run(capsys, "compile")
    (project / "flows" / "two.yaml").unlink()
    code, out, _ = run(capsys, "compile")
    assert code == 0
    assert "1 removed" in out and not (project / "sql" / "flows" / "two.sql").exists()


def test_compile_and_check_leave_sql_they_did_not_write(project: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    # compile used to delete every *.sql in <out>/flows/ that matched no flow
    own = project / "sql" / "flows" / "handwritten.sql"
    own.parent.mkdir(parents=True)
    own.write_text("create table mine (id int);\n")
    code, out, _ = run(capsys, "compile")
    assert code == 0 and "0 removed" in out
    assert own.read_text() == "create table mine (id int);\n"
    code, out, _ = run(capsys, "check")
    assert code == 0 and "handwritten" not in out, out


def test_check_fails_on_stale_and_hand_edited_sql(project: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "compile")[0] == 0
    assert run(capsys, "check")[0] == 0
    sql = project / "sql" / "flows" / "hello.sql"
    sql.write_text(sql.read_text().replace("max_attempts => 3", "max_attempts => 4"))
    code, out, _ = run(capsys, "check")
    assert code == 1
    # the diagnostics format (docs/diagnostics.md): headline, the diff, a help line
    assert out.startswith("sql/flows/hello.sql:")
    assert ": error[FL090]: stale or hand-edited\n--- a/sql/flows/hello.sql (working tree)\n" in out
    assert "\nhelp: run `flowlane compile` and commit the SQL\n\n1 error in 1 file(s)\n" in out
    assert "-  max_attempts => 4," in out and "+  max_attempts => 3," in out
    code, out, _ = run(capsys, "check", "--format", "sarif")
    assert code == 1
    result = json.loads(out)["runs"][0]["results"][0]
    assert result["ruleId"] == "FL090"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "sql/flows/hello.sql"
    sql.unlink()
    code, out, _ = run(capsys, "check")
    assert code == 1 and "missing" in out


def test_check_requires_a_new_version_for_shape_changes(project: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    git(project, "init", "-q")
    run(capsys, "compile")
    commit_all(project)
    # an option-only change passes
    (project / "flows" / "hello.yaml").write_text(HELLO + "defaults: {max_attempts: 5}\n")
    run(capsys, "compile")
    code, out, _ = run(capsys, "check")
    assert code == 0, out
    # a structural change to a committed concrete slug is refused
    (project / "flows" / "hello.yaml").write_text(HELLO.replace("    needs: [greet]\n", ""))
    run(capsys, "compile")
    code, out, _ = run(capsys, "check")
    assert code == 1
    assert out.startswith("flows/hello.yaml:2:7: error[FL091]: NEW_VERSION_REQUIRED: flow `hello`")
    assert "\n2 | slug: hello\n  |       ^\n" in out
    assert "\nhelp: declare a new version `hello_v2`" in out
    assert "step 1 (shout): needs is [\"greet\"] in the base, [] in the YAML" in out
    assert "`hello_v2`" in out
    code, out, _ = run(capsys, "check", "--format", "json")
    assert code == 1
    assert [(d["path"], d["line"], d["code"]) for d in json.loads(out)] == [
        ("flows/hello.yaml", 2, "FL091")]
    # against an explicit base that predates the flow, it is a new flow
    commit_all(project, "second")
    (project / "flows" / "hello.yaml").write_text(HELLO.replace("m:greet", "m:g") +
                                                  "queues: per-step\n")
    run(capsys, "compile")
    assert run(capsys, "check", "--base", "HEAD")[0] == 1
    code, _, err = run(capsys, "check", "--base", "no_such_rev")
    assert code == 2 and "git revision `no_such_rev` not found" in err


def test_check_names_an_inserted_step_and_moves_the_alias_the_project_has(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git(project, "init", "-q")
    flow = HELLO.replace("slug: hello", "slug: hello_v1")
    (project / "flows" / "hello.yaml").write_text(
        flow + "---\nkind: alias\nslug: hello\nactive: hello_v1\n")
    run(capsys, "compile")
    commit_all(project)
    inserted = flow.replace("  shout:\n    needs: [greet]\n",
                            "  check:\n    needs: [greet]\n    handler: m:check\n"
                            "  shout:\n    needs: [check]\n")
    (project / "flows" / "hello.yaml").write_text(
        inserted + "---\nkind: alias\nslug: hello\nactive: hello_v1\n")
    run(capsys, "compile")
    code, out, _ = run(capsys, "check", "--base", "HEAD")
    assert code == 1 and "NEW_VERSION_REQUIRED: flow `hello_v1`" in out
    detail = [line.strip() for line in out.splitlines() if line.startswith("  step")]
    assert detail == ["step `check` added in the YAML (position 1)",
                      'step `shout`: needs is ["greet"] in the base, ["check"] in the YAML']
    assert ("\nhelp: declare a new version `hello_v2` (copy the flow, change the copy) and "
            "move alias `hello` to it (`active: hello_v2`, `draining: [hello_v1]`); keep "
            "`hello_v1` unchanged\n") in out


def test_check_outside_git_notes_the_skipped_version_check(project: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    run(capsys, "compile")
    code, _, err = run(capsys, "check")
    assert code == 0 and "skipped the immutability check" in err


def test_graph_mermaid_and_dot(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "graph", "hello")
    assert code == 0
    assert out.splitlines()[:4] == ["---", "title: hello", "---", "flowchart TD"]
    assert 'subgraph q0["queue: hello"]' in out and "s_greet --> s_shout" in out
    code, out, _ = run(capsys, "graph", "hello", "--format", "dot")
    assert out.startswith('digraph "hello" {') and '"greet" -> "shout";' in out
    code, _, err = run(capsys, "graph", "nope")
    assert code == 1 and "no flow or alias `nope`" in err  # an unknown name: a failure


def test_types_module_is_valid_python(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, _ = run(capsys, "types", "--out", "names.py")
    assert code == 0
    namespace = runpy.run_path(str(project / "names.py"))
    assert str(namespace["HelloStepSlug"]) == "typing.Literal['greet', 'shout']"
    assert str(namespace["AliasSlug"]) == "typing.Never"


def test_schema_command_prints_the_shipped_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "schema")
    assert code == 0 and json.loads(out)["$schema"].endswith("2020-12/schema")


def test_no_traceback_for_bad_input_but_debug_shows_one(project: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    (project / "flows" / "hello.yaml").write_text("kind: [\n")
    code, _, err = run(capsys, "graph", "hello")
    assert code == 1 and "Traceback" not in err and "FL001" in err
    from flowlane import errors

    with pytest.raises(errors.CompileError):
        main(["--debug", "graph", "hello"])


def test_usage_error_exit_code_two(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--format", "xml"])
    assert exc.value.code == 2


def test_broken_files_cause_no_follow_on_unknown_flow_findings(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flows = project / "flows"
    (flows / "a.yaml").write_text("kind: flow\nslug: a\nsteps:\n  x: {handler: m:x, timeout: 1}\n")
    (flows / "b.yaml").write_text("kind: alias\nslug: al\nactive: a\n---\n"
                                  "kind: worker\nqueue: a\nflows: [a, b]\n")
    (flows / "c.yaml").write_text("kind: flow\nslug: b\nsteps: [\n")
    code, out, _ = run(capsys, "validate", "--format", "json")
    assert code == 1
    assert sorted((d["path"], d["code"]) for d in json.loads(out)) == [
        ("flows/a.yaml", "FL013"), ("flows/c.yaml", "FL001")]


def test_unwritable_output_is_an_error_not_a_traceback(project: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    (project / "sql").write_text("a file where the directory should be")
    code, _, err = run(capsys, "compile")
    assert code == 1 and err.startswith("error: cannot write the compiled SQL to sql")
    code, _, err = run(capsys, "types", "--out", "sql/names.py")
    assert code == 1 and err.startswith("error: cannot write sql/names.py")


@pytest.mark.parametrize(("before", "after"), [("1", "true"), ("0", "false"), ("[1]", "[true]")])
def test_check_sees_a_number_changed_to_a_boolean(project: Path, capsys: pytest.CaptureFixture[str],
                                                  before: str, after: str) -> None:
    # Python says 1 == True; jsonb (and so the database) does not: this is a new shape
    flow = HELLO + "    if: {greet: {ok: %s}}\n"
    (project / "flows" / "hello.yaml").write_text(flow % before)
    git(project, "init", "-q")
    run(capsys, "compile")
    commit_all(project)
    (project / "flows" / "hello.yaml").write_text(flow % after)
    run(capsys, "compile")
    code, out, _ = run(capsys, "check")
    assert code == 1, out
    assert f'if is {{"greet": {{"ok": {before}}}}} in the base' in out


def test_check_accepts_the_same_number_spelled_differently(project: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    flow = HELLO + "    if: {greet: {n: %s}}\n"
    (project / "flows" / "hello.yaml").write_text(flow % "1000")
    git(project, "init", "-q")
    run(capsys, "compile")
    commit_all(project)
    (project / "flows" / "hello.yaml").write_text(flow % "1e3")
    run(capsys, "compile")
    code, out, _ = run(capsys, "check")
    assert code == 0, out


def test_a_fifo_among_the_flows_is_reported_not_read(project: Path) -> None:
    # reading a FIFO blocks until a writer comes: validate used to hang forever
    # (a subprocess with a timeout, so that a regression fails instead of hanging the suite)
    os.mkfifo(project / "flows" / "pipe.yaml")
    result = run_flowlane("validate", "flows", "/dev/null", cwd=project, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "flows/pipe.yaml:1:1: error[FL008]: not a regular file: flows/pipe.yaml" in result.stdout
    assert "error[FL008]: not a regular file: /dev/null" in result.stdout


def test_unreadable_paths_are_diagnostics_not_tracebacks(project: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # ENAMETOOLONG escaped Path.is_dir() and a symlink loop escaped Path.resolve()
    too_long = "a" * 5000
    code, out, _ = run(capsys, "validate", too_long)
    assert code == 1 and f"{too_long}:1:1: error[FL008]: cannot read (File name too long)" in out
    (project / "loop.yaml").symlink_to("loop.yaml")
    code, out, _ = run(capsys, "validate", "loop.yaml")
    assert code == 1 and "loop.yaml:1:1: error[FL008]: cannot read (Too many levels" in out
    (project / "flows" / "loop.yaml").symlink_to("loop.yaml")
    code, _, err = run(capsys, "graph", "hello")
    assert code == 1 and "flows/loop.yaml:1:1: error[FL008]: not a regular file" in err
    code, out, _ = run(capsys, "validate")
    assert code == 1 and "flows/loop.yaml:1:1: error[FL008]: not a regular file" in out

