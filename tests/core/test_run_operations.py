"""0007: attempt history, cancel_run, retry_run, run-finished notifications."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from flowlane.core import migrator
from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow


def _attempts(engine: Engine, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return engine.rows(
        "select * from flowlane.task_attempts where run_id = %s order by id", (run_id,)
    )


def _fail_detailed(engine: Engine, task: dict[str, Any], message: str, kind: str, tb: str) -> Any:
    return engine.row(
        "select * from flowlane.fail_task_detailed(%s, %s, %s, %s, %s, %s, %s, %s)",
        (task["run_id"], task["step_slug"], task["task_index"], message, engine.worker_id,
         task["attempt"], kind, tb),
    )


def test_every_failed_attempt_is_kept_with_type_and_traceback(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 3, "base_delay": 0})])
    run_id = engine.start("f", {})
    for attempt in (1, 2, 3):
        engine.make_visible("f")
        [task] = engine.claim("f")
        _fail_detailed(engine, task, f"ValueError: bad {attempt}", "ValueError", f"tb {attempt}")
    rows = _attempts(engine, run_id)
    assert [(r["attempt"], r["outcome"], r["error_type"], r["error_message"], r["traceback"])
            for r in rows] == [
        (1, "retry", "ValueError", "ValueError: bad 1", "tb 1"),
        (2, "retry", "ValueError", "ValueError: bad 2", "tb 2"),
        (3, "failed", "ValueError", "ValueError: bad 3", "tb 3"),
    ]
    assert all(r["worker_id"] == engine.worker_id for r in rows)
    assert engine.run(run_id)["status"] == "failed"


def test_plain_fail_task_and_fenced_calls(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 2, "base_delay": 0})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.fail(task, "first")
    engine.fail(task, "late duplicate")  # fenced no-op: no second history row
    rows = _attempts(engine, run_id)
    assert [(r["attempt"], r["error_type"], r["error_message"]) for r in rows] == [
        (1, None, "first")
    ]


def test_traceback_is_bounded(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    _fail_detailed(engine, task, "x" * 10_000, "E" * 500, "t" * 50_000)
    [row] = _attempts(engine, run_id)
    assert (len(row["error_message"]), len(row["traceback"]), len(row["error_type"])) == (
        4000, 16000, 200)


def test_stall_is_an_attempt_in_the_history(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 5})])
    run_id = engine.start("f", {})
    engine.claim("f")
    engine.backdate(run_id, "a", 60)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    [row] = _attempts(engine, run_id)
    assert row["outcome"] == "stalled" and row["error_type"] == "Stalled"
    assert "no result within 5 s" in row["error_message"]  # the timeout (0006 words it)


@pytest.mark.parametrize("mode", ["skip", "skip-cascade"])
def test_when_exhausted_skip_keeps_the_error(engine: Engine, mode: str) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1, "when_exhausted": mode}), ("b", ["a"], {})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.fail(task, "KeyError: 'x'")
    states = engine.states(run_id)
    assert states["a"]["status"] == "skipped" and states["a"]["error_message"] == "KeyError: 'x'"
    if mode == "skip-cascade":
        assert states["b"]["skip_reason"] == "dependency_skipped"
        assert states["b"]["error_message"] is None


def test_cancel_archives_messages_rejects_late_completion_and_starts_nothing(
    engine: Engine,
) -> None:
    engine.define("f", [("a", [], {}), ("b", [], {}), ("c", ["a"], {})])
    run_id = engine.start("f", {})
    claimed = {t["step_slug"]: t for t in engine.claim("f", qty=1)}
    assert set(claimed) == {"a"}
    run = engine.row("select * from flowlane.cancel_run(%s, %s)", (run_id, "wrong input"))
    assert run is not None
    assert (run["status"], run["cancel_reason"]) == ("cancelled", "wrong input")
    assert engine.queue_messages("f") == []
    assert {t["status"] for t in engine.tasks(run_id)} == {"cancelled"}
    late = engine.complete(claimed["a"], {"x": 1})
    assert late is not None and late["status"] == "cancelled" and late["output"] is None
    # every step ends: the one that was running and the ones that never started
    assert engine.statuses(run_id) == {"a": "cancelled", "b": "cancelled", "c": "cancelled"}
    assert engine.tasks(run_id, "c") == []
    again = engine.row("select * from flowlane.cancel_run(%s)", (run_id,))
    assert again is not None and again["cancelled_at"] == run["cancelled_at"]


def test_cancel_ends_a_started_map_step_with_its_tasks(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("m", ["a"], {"step_type": "map"}), ("z", ["m"], {})])
    run_id = engine.start("f", {})
    [a] = engine.claim("f", qty=1)
    engine.complete(a, [1, 2, 3])
    [first, *_] = engine.claim("f", qty=1)
    engine.complete(first, "done")
    run = engine.row("select * from flowlane.cancel_run(%s)", (run_id,))
    assert run is not None
    steps = {s["step_slug"]: s for s in engine.rows(
        "select * from flowlane.all_step_states where run_id = %s", (run_id,))}
    assert {slug: s["status"] for slug, s in steps.items()} == {
        "a": "completed", "m": "cancelled", "z": "cancelled"}
    assert steps["m"]["cancelled_at"] == run["cancelled_at"]  # an end time: durations stop
    assert steps["z"]["started_at"] is None  # it never started: the run ended first
    assert {t["task_index"]: t["status"] for t in engine.tasks(run_id, "m")} == {
        0: "completed", 1: "cancelled", 2: "cancelled"}


def test_cancel_refuses_finished_and_unknown_runs(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    engine.drive("f", lambda t: 1)
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="already completed"):
        engine.scalar("select flowlane.cancel_run(%s)", (run_id,))
    with pytest.raises(psycopg.errors.NoDataFound, match="no run"):
        engine.scalar("select flowlane.cancel_run(%s)", (uuid.uuid4(),))


def test_retry_resumes_failed_steps_with_fresh_budget(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {}),
            ("m", ["a"], {"step_type": "map", "max_attempts": 2, "base_delay": 0}),
            ("side", [], {}),
            ("z", ["m"], {}),
        ],
    )
    run_id = engine.start("f", {})
    [a] = [t for t in engine.claim("f", qty=1) if t["step_slug"] == "a"]
    engine.complete(a, [1, 2, 3])
    tasks = {(t["step_slug"], t["task_index"]): t for t in engine.claim("f")}
    engine.complete(tasks[("m", 0)], "m0")
    for _ in range(2):
        engine.fail(tasks[("m", 1)], "boom")
        engine.make_visible("f")
        tasks.update({(t["step_slug"], t["task_index"]): t for t in engine.claim("f")})
    assert engine.run(run_id)["status"] == "failed"
    assert engine.task(run_id, "side")["status"] == "cancelled"  # was running in parallel

    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
        engine.scalar("select flowlane.cancel_run(%s)", (run_id,))
    run = engine.row("select * from flowlane.retry_run(%s)", (run_id,))
    assert run is not None and run["status"] == "started" and run["retry_count"] == 1
    assert engine.task(run_id, "m", 0)["output"] == "m0"  # completed map task kept
    assert engine.task(run_id, "a")["output"] == [1, 2, 3]
    fresh = {(t["step_slug"], t["task_index"]): t for t in engine.claim("f")}
    assert set(fresh) == {("m", 1), ("m", 2), ("side", 0)}
    assert {t["attempt"] for t in fresh.values()} == {1}
    for task in fresh.values():
        engine.complete(task, f"{task['step_slug']}{task['task_index']}")
    engine.drive("f", lambda t: "z")
    final = engine.run(run_id)
    assert final["status"] == "completed"
    assert final["output"] == {"z": "z", "side": "side0"}
    assert engine.states(run_id)["m"]["output"] == ["m0", "m1", "m2"]
    # the failed attempts before the retry are still in the history
    history = _attempts(engine, run_id)
    assert [(h["step_slug"], h["attempt"], h["retry_round"]) for h in history] == [
        ("m", 1, 0), ("m", 2, 0)]


def test_retry_refuses_runs_that_are_not_failed(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is started"):
        engine.scalar("select flowlane.retry_run(%s)", (run_id,))
    engine.scalar("select flowlane.cancel_run(%s)", (run_id,))
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is cancelled"):
        engine.scalar("select flowlane.retry_run(%s)", (run_id,))


def test_retry_reevaluates_a_failed_condition(engine: Engine) -> None:
    engine.define(
        "f", [("a", [], {"required_input_pattern": {"go": True}, "when_unmet": "fail"})]
    )
    run_id = engine.start("f", {"go": False})
    assert engine.run(run_id)["status"] == "failed"
    run = engine.row("select * from flowlane.retry_run(%s)", (run_id,))
    assert run is not None and run["status"] == "failed"  # same input, same verdict


def test_finished_run_notifies(engine: Engine, dsn: str) -> None:
    engine.define("f", [("a", [], {})])
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("select flowlane.listen_run_finished()")
        run_id = engine.start("f", {})
        engine.drive("f", lambda t: 1)
        payloads = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert payloads == [str(run_id)]


def test_a_run_ended_while_nobody_listens_is_read_by_the_next_listener(
    engine: Engine, dsn: str
) -> None:
    """Nobody listening, the run's end notifies nobody; a session that starts listening
    meanwhile waits for that commit (lock_timeout makes the wait an error here), then
    reads the run as ended."""
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    with psycopg.connect(dsn, autocommit=True) as listener:
        with engine.conn.transaction():
            engine.complete(task, 1)
            assert engine.run(run_id)["status"] == "completed"
            listener.execute("set lock_timeout = '50ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                listener.execute("select flowlane.listen_run_finished()")
        listener.execute("select flowlane.listen_run_finished()")
        status = listener.execute(
            "select status from flowlane.runs where run_id = %s", (run_id,)
        ).fetchone()
        assert status == ("completed",)
        listener.execute("select flowlane.unlisten_run_finished()")
        assert listener.execute("select pg_listening_channels()").fetchall() == []


def test_the_upgrade_from_the_original_core_keeps_runs_and_lets_old_failures_be_retried(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"max_attempts": 1}), ("b", ["a"], {})])
        failed = engine.start("f", {})
        [task] = engine.claim("f")
        engine.fail(task, "before the upgrade")
        running = engine.start("f", {})
        [claimed] = engine.claim("f")
        assert [m.version for m in migrator.migrate(conn)] == [m.version for m in migrator.discover()][2:]

        assert engine.run(failed)["status"] == "failed"
        assert engine.run(running)["status"] == "started"
        assert _attempts(engine, failed) == []  # the attempt history starts with the upgrade
        engine.complete(claimed, "a")  # an in-flight claim completes across the upgrade
        engine.drive("f", lambda t: "b")
        assert engine.run(running)["status"] == "completed"

        run = engine.row("select * from flowlane.retry_run(%s)", (failed,))
        assert run is not None and run["status"] == "started"
        engine.drive("f", lambda t: t["step_slug"])
        assert engine.run(failed)["status"] == "completed"
        assert_invariants(engine)
