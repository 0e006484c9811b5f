"""fail_task: retries with backoff, exhaustion modes, run failure, fencing, late callbacks."""

from __future__ import annotations

import uuid

import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("base_delay", "expected"), [(5, [10, 20, 40]), (1, [2, 4, 8]), (0, [0, 0, 0])]
)
def test_retry_backoff_read_from_message_vt(
    engine: Engine, base_delay: int, expected: list[int]
) -> None:
    engine.define("f", [("a", [], {"max_attempts": 4, "base_delay": base_delay})])
    run_id = engine.start("f", {})
    msg_ids = set()
    for attempt, delay in enumerate(expected, start=1):
        engine.make_visible("f")
        [task] = engine.claim("f")
        assert task["attempt"] == attempt
        msg_ids.add(task["msg_id"])
        row = engine.fail(task, f"err {attempt}")
        assert (
            row is not None
            and row["status"] == "queued"
            and row["error_message"] == f"err {attempt}"
        )
        assert row["started_at"] is None and row["attempts_count"] == attempt
        vt_in = engine.vt_in("f", task["msg_id"])
        assert delay - 2 < vt_in <= delay
        assert engine.run(run_id)["status"] == "started"
    assert len(msg_ids) == 1, "a retry reuses the same message"
    assert engine.scalar("select count(*) from pgmq.q_f") == 1


def test_step_base_delay_overrides_flow(engine: Engine) -> None:
    engine.define("f", [("a", [], {"base_delay": 3})], base_delay=100)
    engine.start("f", {})
    [task] = engine.claim("f")
    engine.fail(task)
    assert 4 < engine.vt_in("f", task["msg_id"]) <= 6


def test_exhausted_fail_fails_step_and_run_and_cancels_others(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"max_attempts": 2, "base_delay": 0}),
            ("b", [], {}),
            ("m", [], {}),
            ("c", ["a"], {}),
        ],
        max_attempts=3,
    )
    run_id = engine.start("f", {})
    claimed = {t["step_slug"]: t for t in engine.claim("f")}
    engine.fail(claimed["a"], "first")
    [retry] = engine.claim("f")
    assert retry["step_slug"] == "a" and retry["attempt"] == 2
    row = engine.fail(retry, "second")
    assert row is not None and row["status"] == "failed" and row["failed_at"] is not None
    run = engine.run(run_id)
    assert run["status"] == "failed" and "second" in run["error_message"]
    assert run["failed_at"] is not None and run["output"] is None
    state = engine.states(run_id)["a"]
    assert (state["status"], state["error_message"]) == ("failed", "second")
    assert {t["step_slug"]: t["status"] for t in engine.tasks(run_id)} == {
        "a": "failed",
        "b": "cancelled",
        "m": "cancelled",
    }
    assert engine.queue_messages("f") == []
    # the run's end ends every unfinished step; started_at tells which had begun
    ended = {slug: (s["status"], s["started_at"] is not None, s["cancelled_at"] is not None)
             for slug, s in engine.states(run_id).items() if slug != "a"}
    assert ended == {"b": ("cancelled", True, True), "m": ("cancelled", True, True),
                     "c": ("cancelled", False, True)}


def test_max_attempts_one_fails_at_once(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    assert engine.fail(task)["status"] == "failed"  # type: ignore[index]
    assert engine.run(run_id)["status"] == "failed"


def test_exhausted_skip_releases_dependents(engine: Engine) -> None:
    engine.define(
        "f",
        [("a", [], {"max_attempts": 1, "when_exhausted": "skip"}), ("b", ["a"], {}), ("c", [], {})],
    )
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.fail(tasks["a"], "nope")
    state = engine.states(run_id)["a"]
    assert (state["status"], state["skip_reason"]) == ("skipped", "handler_failed")
    assert engine.task(run_id, "a")["status"] == "failed"
    [b] = engine.claim("f")
    assert b["step_slug"] == "b" and b["input"] == {}
    engine.complete(b, "b-out")
    engine.complete(tasks["c"], "c-out")
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"b": "b-out", "c": "c-out"})


def test_exhausted_skip_cascade_skips_descendants(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"max_attempts": 1, "when_exhausted": "skip-cascade"}),
            ("b", ["a"], {}),
            ("c", ["b"], {}),
            ("d", [], {}),
            ("e", ["d", "c"], {}),
        ],
    )
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.fail(tasks["a"])
    states = engine.states(run_id)
    assert {k: (v["status"], v["skip_reason"]) for k, v in states.items() if k != "d"} == {
        "a": ("skipped", "handler_failed"),
        "b": ("skipped", "dependency_skipped"),
        "c": ("skipped", "dependency_skipped"),
        "e": ("skipped", "dependency_skipped"),
    }
    engine.complete(tasks["d"], 1)
    run = engine.run(run_id)
    assert (run["status"], run["output"], run["remaining_steps"]) == ("completed", {}, 0)


def test_exhausted_skip_on_map_skips_siblings_once(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("m", [], {"step_type": "map", "max_attempts": 1, "when_exhausted": "skip"}),
            ("after", ["m"], {}),
        ],
    )
    run_id = engine.start("f", [1, 2, 3])
    tasks = engine.claim("f")
    engine.fail(tasks[1])
    statuses = [t["status"] for t in engine.tasks(run_id, "m")]
    assert statuses == ["skipped", "failed", "skipped"]
    assert engine.queue_messages("f")[0]["message"]["step_slug"] == "after"
    # the other siblings report late: no double decrement, rows unchanged
    assert engine.fail(tasks[0])["status"] == "skipped"  # type: ignore[index]
    assert engine.complete(tasks[2], 3)["status"] == "skipped"  # type: ignore[index]
    assert engine.run(run_id)["remaining_steps"] == 1
    [after] = engine.claim("f")
    assert after["input"] == {}
    engine.complete(after, "ok")
    assert engine.run(run_id)["output"] == {"after": "ok"}


def test_failed_run_ignores_late_callbacks(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1}), ("b", [], {})])
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.fail(tasks["a"])
    before = engine.task(run_id, "b")
    assert before["status"] == "cancelled"
    rows = [
        engine.complete(tasks["b"], 1),
        engine.fail(tasks["b"]),
    ]
    for row in rows:
        assert row is not None and row["status"] == "cancelled" and row["output"] is None
    assert engine.task(run_id, "b") == before
    assert engine.run(run_id)["status"] == "failed"


def test_duplicate_completion_is_noop(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    first = engine.complete(task, {"v": 1})
    second = engine.complete(task, {"v": 2})
    assert first == second
    assert engine.states(run_id)["a"]["output"] == {"v": 1}
    assert engine.scalar("select count(*) from flowlane.step_tasks where step_slug = 'b'") == 1
    assert engine.fail(task)["status"] == "completed"  # type: ignore[index]


def test_late_complete_after_condition_skip(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {"required_input_pattern": {"a": 1}})])
    run_id = engine.start("f", {})
    [a] = engine.claim("f")
    engine.complete(a, 2)
    assert engine.statuses(run_id)["b"] == "skipped"
    assert engine.tasks(run_id, "b") == []
    # no task exists: nothing returned
    assert engine.complete_raw(run_id, "b", 0, 1, engine.worker_id, 1) is None


def test_fencing_rejects_stale_worker_and_attempt(engine: Engine) -> None:
    engine.define("f", [("a", [], {"base_delay": 0})])
    run_id = engine.start("f", {})
    [first] = engine.claim("f")
    engine.fail(first, "retry me")
    other = uuid.uuid4()
    [second] = engine.claim("f", worker_id=other)
    assert second["attempt"] == 2
    snapshot = engine.task(run_id, "a")
    # the original worker (attempt 1) lost its lease: rejected, no mutation
    stale = engine.complete_raw(run_id, "a", 0, "stale", engine.worker_id, 1)
    assert stale == snapshot
    stale = engine.complete_raw(run_id, "a", 0, "stale", other, 1)
    assert stale == snapshot
    stale_fail = engine.row(
        "select * from flowlane.fail_task(%s, 'a', 0, 'x', %s, 1)", (run_id, engine.worker_id)
    )
    assert stale_fail == snapshot
    assert engine.task(run_id, "a") == snapshot
    assert engine.run(run_id)["status"] == "started"
    # the owner succeeds
    done = engine.complete_raw(run_id, "a", 0, "fresh", other, 2)
    assert done is not None and done["status"] == "completed" and done["output"] == "fresh"
    assert engine.run(run_id)["output"] == {"a": "fresh"}


def test_fencing_after_stalled_requeue(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 5})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run_id, "a", 100)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    row = engine.complete(task, "too late")
    assert row is not None and row["status"] == "queued" and row["output"] is None
    [again] = engine.claim("f")
    assert again["attempt"] == 2
    assert engine.complete(again, "ok")["status"] == "completed"  # type: ignore[index]


def test_completing_queued_task_is_noop(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    row = engine.complete_raw(run_id, "a", 0, "never claimed", engine.worker_id, 1)
    assert row is not None and row["status"] == "queued"
    assert engine.run(run_id)["status"] == "started"
