"""``flowlane demo`` from a fresh copy of the repository, on its own embedded database."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from flowlane.core import db
from tests.cli_support import REPO, run_flowlane

pytestmark = pytest.mark.slow


def test_demo_in_a_fresh_copy(reachable_tmp_path: Path) -> None:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    copy = reachable_tmp_path / "clone"
    for name in tracked.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    try:
        result = run_flowlane("demo", cwd=copy, root=copy, timeout=600)
    finally:
        db.EmbeddedDatabase.stop_at(copy / ".flowlane" / "pgdata")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Traceback" not in result.stderr
    for flow in ("hello_world", "diamond", "thumbnails", "community_threads -> community_threads_v2",
                 "community_threads_v1", "forum_digest"):
        assert any(
            line.startswith("run ") and flow in line and line.endswith(": completed")
            for line in out.splitlines()
        ), out
    assert '"greeting": "Hello, flowlane!"' in out
    # one worker serves the shared queue for two flows and both versions of one of them
    assert ("classify_threads (deployment classify): community_threads_v1, community_threads_v2, "
            "forum_digest") in out
    assert '"summarise": {"posts": 2, "questions": 1}' in out
    assert f"compiled SQL: {(copy / 'sql' / 'flows').as_posix()}/*.sql" in out
    assert (copy / "sql" / "flows" / "hello_world.sql").is_file()


def test_demo_exits_1_when_a_run_failed(
    tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlane.app.demo import run_demo

    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "f.yaml").write_text(
        "kind: flow\nslug: demo_fails\ndefaults: {max_attempts: 1, timeout: 5}\n"
        "steps:\n  a:\n    handler: demo_fail_handlers:fail\n"
    )
    (tmp_path / "demo_fail_handlers.py").write_text(
        "def fail(input, ctx):\n    raise RuntimeError('on purpose')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_demo(["flows"], dsn=dsn, timeout=60) == 1
    out = capsys.readouterr().out
    assert "demo_fails: failed" in out and "on purpose" in out
