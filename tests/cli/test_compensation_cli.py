"""`flowlane run` shows a run's compensations, and `flowlane retry RUN --compensation`
resumes a stopped one (a real database; the tasks are claimed and answered through SQL)."""

from __future__ import annotations

import psycopg
import pytest

from flowlane.cli import main
from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_a_stopped_compensation_is_shown_and_resumed(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("undo", [("work", [], {"max_attempts": 1})])
        engine.define("f", [("a", [], {"compensate": "undo"}), ("b", ["a"], {"max_attempts": 1})])
        run_id = engine.start("f", {})
        (task,) = engine.claim("f")
        engine.complete(task, {"a": 1})
        (task,) = engine.claim("f")
        engine.fail(task, "no courier")
        (task,) = engine.claim("undo")
        engine.fail(task, "refund refused")
        undo_id = engine.scalar("select compensation_run_id from flowlane.compensations where run_id = %s",
                                (run_id,))

        code, out = _cli(capsys, "run", str(run_id), "--dsn", dsn)
        assert code == 0, out
        assert "undo      compensation stopped" in out
        assert f"  a                        failed     {undo_id}  undo" in out
        assert f"(stopped: `flowlane retry {run_id} --compensation` resumes it)" in out

        code, out = _cli(capsys, "retry", str(run_id), "--compensation", "--dsn", dsn)
        assert (code, out) == (0, f"run {run_id}: compensation running again\n")
        (task,) = engine.claim("undo")
        engine.complete(task, {})
        assert engine.run(run_id)["compensation"] == "completed"
        code, out = _cli(capsys, "retry", str(run_id), "--compensation", "--dsn", dsn)
        assert code != 0 and "has no stopped compensation (compensation: completed)" in out
