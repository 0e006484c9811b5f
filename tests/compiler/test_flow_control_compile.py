"""Flow control in the compiler: the new arguments appear only where written (every flow
without them compiles to the bytes it did), a queue's limits compile to one idempotent file,
and ``check --base`` reports changed limits and priorities as option changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowlane import errors
from flowlane.compiler import api, codes, compiled, schema
from flowlane.runtime import limits
from tests.compiler.test_cli import commit_all, git, run

FLOW = """kind: flow
slug: alerts
steps:
  deliver:
    handler: alerts.slack:deliver
"""
LIMITED = FLOW.replace("steps:\n", "concurrency: {limit: 1, key: /customer_id}\npriority: 5\nsteps:\n") + \
    "    concurrency: {limit: 2}\n"
QUEUE = "---\nkind: queue\nname: alerts\nconcurrency: 5\nrate_limit: {limit: 1, per: 1s}\n"


def _flow_file(text: str) -> str:
    return api.compile_project(api.project_from_text(text))[compiled.flow_path("alerts")]


def test_limits_add_arguments_and_nothing_else() -> None:
    plain, limited = _flow_file(FLOW), _flow_file(LIMITED)
    added = {line for line in limited.splitlines()} - set(plain.splitlines())
    assert added == {"  queue_mode => 'flow',", "  concurrency_limit => 1,",
                     "  concurrency_key => '/customer_id',", "  priority => 5",
                     "  queue_name => 'alerts',", "  concurrency_limit => 2"}
    assert "concurrency" not in plain and "priority" not in plain


def test_queue_file_only_for_a_project_with_queue_documents() -> None:
    assert compiled.QUEUES_FILE not in api.compile_project(api.project_from_text(FLOW))
    files = api.compile_project(api.project_from_text(FLOW + QUEUE))
    text = files[compiled.QUEUES_FILE]
    assert compiled.read_header(text.split("\n", 1)[0]) == compiled.Header(compiled.FORMAT, "queues")
    assert "select flowlane.keep_only_queue_limits(array['alerts']::text[]);" in text
    # the same project, the same bytes
    assert api.compile_project(api.project_from_text(FLOW + QUEUE)) == files


def test_priority_range_is_the_one_the_client_checks() -> None:
    stated = schema.published()["$defs"]["priority"]
    assert (stated["minimum"], stated["maximum"]) == (limits.MIN_PRIORITY, limits.MAX_PRIORITY)


def test_the_flow_shape_ignores_limits_and_priority() -> None:
    def header(text: str) -> dict[str, object]:
        loaded: dict[str, object] = json.loads(text.split("\n", 1)[0].removeprefix(
            compiled.HEADER_PREFIX))
        return loaded
    assert header(_flow_file(FLOW)) == header(_flow_file(LIMITED))


@pytest.fixture
def committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> Path:
    (tmp_path / "flows").mkdir()
    monkeypatch.chdir(tmp_path)
    git(tmp_path, "init", "-q")
    (tmp_path / "flows" / "alerts.yaml").write_text(LIMITED + QUEUE)
    assert run(capsys, "compile")[0] == 0
    commit_all(tmp_path)
    return tmp_path


def test_check_base_shows_limit_and_priority_changes_as_option_changes(
        committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    changed = (LIMITED.replace("limit: 1, key: /customer_id",
                               "limit: 3, key: /workspace, when_full: cancel_running")
               .replace("priority: 5\n", "").replace("{limit: 2}", "{limit: 2, key: /team}")
               + QUEUE.replace("concurrency: 5", "concurrency: 8")
               + "---\nkind: queue\nname: alerts_slow\nconcurrency: 1\n"
               + "---\n" + FLOW.replace("alerts", "alerts_slow"))
    (committed / "flows" / "alerts.yaml").write_text(changed)
    assert run(capsys, "compile")[0] == 0
    code, out, _ = run(capsys, "check")
    assert code == 0, out  # options: no new version needed
    assert out.splitlines()[:-1] == [
        "SAFE_OPTION_CHANGE flow alerts: concurrency_limit: 1 at HEAD, 3 in the YAML",
        "SAFE_OPTION_CHANGE flow alerts: concurrency_key: /customer_id at HEAD, /workspace in the YAML",
        "SAFE_OPTION_CHANGE flow alerts: concurrency_when_full: queue at HEAD, cancel_running in the YAML",
        "SAFE_OPTION_CHANGE flow alerts: priority: 5 at HEAD, none in the YAML",
        "SAFE_OPTION_CHANGE flow alerts step deliver: concurrency_key: none at HEAD, /team in the YAML",
        "SAFE_OPTION_CHANGE queue alerts: concurrency: 5 at HEAD, 8 in the YAML",
        "SAFE_OPTION_CHANGE queue alerts_slow: limits declared in the YAML, none at HEAD",
    ]


def test_check_base_says_what_happens_to_limits_no_longer_declared(
        committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (committed / "flows" / "alerts.yaml").write_text(LIMITED)
    (committed / "sql" / compiled.QUEUES_FILE).unlink()
    assert run(capsys, "compile")[0] == 0
    code, out, _ = run(capsys, "check")
    assert code == 0, out
    assert ("SAFE_OPTION_CHANGE queue alerts: limits at HEAD, none in the YAML (kept in the "
            "database by apply: the project has no queues file any more)") in out


def test_a_queues_archive_compiles_only_where_turned_off_and_is_an_option_change(
        committed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = api.compile_project(api.project_from_text(LIMITED + QUEUE))
    explicit = api.compile_project(api.project_from_text(LIMITED + QUEUE + "archive: true\n"))
    assert explicit == files and "archive" not in files[compiled.QUEUES_FILE]
    (committed / "flows" / "alerts.yaml").write_text(
        LIMITED + QUEUE + "archive: false\n"
        + "---\nkind: queue\nname: alerts_bulk\narchive: false\n"  # the archive alone: no limit
        + "---\n" + FLOW.replace("alerts", "alerts_bulk"))
    assert run(capsys, "compile")[0] == 0
    queues = (committed / "sql" / compiled.QUEUES_FILE).read_text()
    assert "  rate_per => 1,\n  archive => false\n);" in queues
    code, out, _ = run(capsys, "check")
    assert code == 0, out  # an option: no new version needed
    assert out.splitlines()[:-1] == [
        "SAFE_OPTION_CHANGE queue alerts: archive: true at HEAD, false in the YAML",
        "SAFE_OPTION_CHANGE queue alerts_bulk: limits declared in the YAML, none at HEAD",
    ]


def test_a_queue_document_with_neither_limit_nor_archive_declares_nothing() -> None:
    with pytest.raises(errors.CompileError) as raised:
        api.project_from_text(FLOW + "---\nkind: queue\nname: alerts\ndescription: nothing\n")
    assert [d.code for d in raised.value.diagnostics] == [codes.QUEUE_WITHOUT_LIMIT]
