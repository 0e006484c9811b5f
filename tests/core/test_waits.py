"""Wait steps and signals through the public SQL functions: a signal after its step is
reached, before it, twice, to the wrong step, to a finished run; the wait timeout (driven by
the time given to flowlane.expire_waits, never by sleeping); retries; concurrent duplicates."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine
from tests.core.test_races import run_threads


def _approval(engine: Engine, **wait: Any) -> None:
    """prepare -> approve (wait) -> ship"""
    engine.define("approval", [
        ("prepare", [], {}),
        ("approve", ["prepare"], {"step_type": "wait", **wait}),
        ("ship", ["approve"], {}),
    ])


def _signal(engine: Engine, run_id: uuid.UUID, step: str, payload: Any = None) -> dict[str, Any]:
    row = engine.row("select * from flowlane.signal(%s, %s, %s)",
                     (run_id, step, Jsonb({} if payload is None else payload)))
    assert row is not None
    return row


def _refused(engine: Engine, run_id: Any, step: str, payload: Any, sqlstate: str) -> str:
    with pytest.raises(psycopg.Error) as info:
        _signal(engine, run_id, step, payload)
    assert info.value.sqlstate == sqlstate, info.value
    return str(info.value)


def _expire(engine: Engine, seconds_from_now: float) -> int:
    return int(engine.scalar(
        "select flowlane.expire_waits(now() + make_interval(secs => %s))", (seconds_from_now,)))


def _finish_prepare(engine: Engine, run_id: uuid.UUID) -> None:
    [task] = engine.claim("approval")
    assert (task["run_id"], task["step_slug"]) == (run_id, "prepare")
    engine.complete(task, {"order": 7})


def test_a_signal_to_a_waiting_step_completes_it_and_starts_its_dependents(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert engine.statuses(run_id)["approve"] == "started"
    assert engine.tasks(run_id, "approve") == []  # no task, no message: nothing for a worker

    signal = _signal(engine, run_id, "approve", {"approved": True, "by": "ana"})

    assert signal["applied_at"] is not None
    approve = engine.states(run_id)["approve"]
    assert (approve["status"], approve["output"]) == ("completed", {"approved": True, "by": "ana"})
    [ship] = engine.claim("approval")
    assert ship["step_slug"] == "ship"
    assert ship["input"] == {"approve": {"approved": True, "by": "ana"}}
    engine.complete(ship, "shipped")
    assert engine.run(run_id)["status"] == "completed"


def test_a_signal_before_its_step_is_kept_and_completes_the_step_when_it_starts(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    signal = _signal(engine, run_id, "approve", {"approved": False})
    assert signal["applied_at"] is None
    assert engine.statuses(run_id)["approve"] == "created"

    _finish_prepare(engine, run_id)

    assert engine.states(run_id)["approve"]["output"] == {"approved": False}
    applied = engine.row("select * from flowlane.signals where run_id = %s", (run_id,))
    assert applied is not None and applied["applied_at"] is not None
    [ship] = engine.claim("approval")
    assert ship["step_slug"] == "ship"


def test_a_wait_step_with_no_needs_waits_from_the_start_and_the_run_is_not_stuck(engine: Engine) -> None:
    engine.define("gate", [("hold", [], {"step_type": "wait"}), ("after", ["hold"], {})])
    run_id = engine.start("gate", {"x": 1})
    assert engine.statuses(run_id) == {"hold": "started", "after": "created"}
    assert engine.rows("select * from flowlane.stuck_runs()") == []
    _signal(engine, run_id, "hold", [1, 2])
    [task] = engine.claim("gate")
    assert task["input"] == {"hold": [1, 2]}


def test_a_second_signal_is_refused_and_changes_nothing(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _signal(engine, run_id, "approve", {"n": 1})  # kept
    message = _refused(engine, run_id, "approve", {"n": 2}, "55000")
    assert "already has a signal" in message and "kept until the step starts" in message
    _finish_prepare(engine, run_id)
    message = _refused(engine, run_id, "approve", {"n": 3}, "55000")
    assert "already has a signal" in message
    assert engine.states(run_id)["approve"]["output"] == {"n": 1}
    assert engine.scalar("select count(*) from flowlane.signals") == 1


def test_signals_to_the_wrong_step_or_run_are_refused(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    message = _refused(engine, run_id, "prepare", {}, "42809")
    assert "is not a wait step" in message and "approve" in message  # the hint lists them
    assert "has no step" in _refused(engine, run_id, "nope", {}, "P0002")
    assert "no run" in _refused(engine, uuid.uuid4(), "approve", {}, "P0002")
    with pytest.raises(psycopg.Error) as info:
        engine.row("select * from flowlane.signal(%s, 'approve', null)", (run_id,))
    assert info.value.sqlstate == "22004"
    assert engine.scalar("select count(*) from flowlane.signals") == 0
    assert engine.statuses(run_id)["approve"] == "created"


@pytest.mark.parametrize("end", ["cancel", "fail"])
def test_a_signal_to_a_finished_run_is_refused(engine: Engine, end: str) -> None:
    _approval(engine, timeout=60)
    run_id = engine.start("approval", {})
    if end == "cancel":
        _finish_prepare(engine, run_id)
        engine.conn.execute("select flowlane.cancel_run(%s)", (run_id,))
        assert engine.statuses(run_id)["approve"] == "cancelled"
    else:
        [task] = engine.claim("approval")
        engine.conn.execute("update flowlane.steps set opt_max_attempts = 1 where step_slug = 'prepare'")
        engine.fail(task, "boom")
    message = _refused(engine, run_id, "approve", {}, "55000")
    assert "a finished run takes no signal" in message
    assert engine.scalar("select count(*) from flowlane.signals") == 0
    assert _expire(engine, 3600) == 0  # a deadline left by the ended run ends nothing


def test_a_payload_for_a_step_a_map_maps_must_be_an_array(engine: Engine) -> None:
    engine.define("pick", [("choose", [], {"step_type": "wait"}),
                           ("each", ["choose"], {"step_type": "map"})])
    run_id = engine.start("pick", {})
    message = _refused(engine, run_id, "choose", {"a": 1}, "22023")
    assert "must be a JSON array" in message
    _signal(engine, run_id, "choose", ["x", "y"])
    tasks = engine.claim("pick")
    assert sorted(t["input"] for t in tasks) == ["x", "y"]


def test_a_condition_on_a_wait_step_skips_it_and_its_signal_is_refused(engine: Engine) -> None:
    engine.define("cond", [("hold", [], {"step_type": "wait",
                                         "required_input_pattern": Jsonb({"needs_ok": True})}),
                           ("tail", [], {})])
    run_id = engine.start("cond", {"needs_ok": False})
    assert engine.states(run_id)["hold"]["skip_reason"] == "condition_unmet"
    assert "already skipped" in _refused(engine, run_id, "hold", {}, "55000")


def test_the_wait_timeout_fails_the_run_and_retry_waits_again(engine: Engine) -> None:
    _approval(engine, timeout=60)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert _expire(engine, 30) == 0
    assert engine.run(run_id)["status"] == "started"

    assert _expire(engine, 61) == 1

    run = engine.run(run_id)
    assert (run["status"], run["error_message"]) == ("failed", "step approve: no signal within 60 s")
    assert engine.states(run_id)["approve"]["error_message"] == "no signal within 60 s"
    assert _expire(engine, 3600) == 0  # once

    engine.conn.execute("select flowlane.retry_run(%s)", (run_id,))
    assert engine.statuses(run_id)["approve"] == "started"
    assert _expire(engine, 30) == 0  # a new deadline, from the retry
    _signal(engine, run_id, "approve", {"ok": 1})
    [ship] = engine.claim("approval")
    engine.complete(ship, None)
    assert engine.run(run_id)["status"] == "completed"


@pytest.mark.parametrize(("mode", "ship", "refusal"), [
    ("skip", "started", "is already skipped"),
    ("skip-cascade", "skipped", "is completed: a finished run"),  # nothing was left to run
])
def test_the_wait_timeout_skips_as_when_exhausted_says(
    engine: Engine, mode: str, ship: str, refusal: str
) -> None:
    _approval(engine, timeout=5, when_exhausted=mode)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert _expire(engine, 6) == 1
    approve = engine.states(run_id)["approve"]
    assert (approve["status"], approve["skip_reason"]) == ("skipped", "wait_timeout")
    assert approve["error_message"] == "no signal within 5 s"
    assert engine.statuses(run_id)["ship"] == ship
    assert refusal in _refused(engine, run_id, "approve", {}, "55000")


def test_a_wait_without_timeout_waits_forever(engine: Engine) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    assert _expire(engine, 10 * 365 * 86400) == 0
    assert engine.statuses(run_id)["approve"] == "started"


def test_a_retried_run_waits_again_in_a_wait_step_its_failure_ended(engine: Engine) -> None:
    engine.define("par", [("hold", [], {"step_type": "wait"}),
                          ("work", [], {"max_attempts": 1})])
    run_id = engine.start("par", {})
    [work] = engine.claim("par")
    engine.fail(work, "boom")
    assert engine.statuses(run_id)["hold"] == "cancelled"
    engine.conn.execute("select flowlane.retry_run(%s)", (run_id,))
    assert engine.statuses(run_id)["hold"] == "started"
    _signal(engine, run_id, "hold", {})
    [work] = engine.claim("par")
    engine.complete(work, 1)
    assert engine.run(run_id)["status"] == "completed"


def test_wait_steps_have_no_queue_and_take_none(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error) as info:
        engine.add_step("f", "w", step_type="wait", queue_name="q")
    assert "queue_name must be null" in str(info.value)
    engine.add_step("f", "w", step_type="wait")
    shape = engine.scalar("select flowlane.get_flow_shape('f')")
    assert shape["steps"][0]["queue"] is None and shape["steps"][0]["type"] == "wait"
    assert engine.add_step("f", "w", step_type="wait")["queue_name"] is None  # applied twice
    assert engine.scalar("select count(*) from flowlane.queues") == 0


def test_32_concurrent_duplicate_signals_one_wins(engine: Engine, dsn: str) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    won: list[int] = []
    refused: list[str | None] = []
    lock = threading.Lock()

    def send(n: int, barrier: threading.Barrier) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            try:
                conn.execute("select flowlane.signal(%s, 'approve', %s)", (run_id, Jsonb({"n": n})))
            except psycopg.Error as exc:
                with lock:
                    refused.append(exc.sqlstate)
            else:
                with lock:
                    won.append(n)

    assert run_threads(32, send) == []
    assert len(won) == 1 and refused == ["55000"] * 31
    assert engine.states(run_id)["approve"]["output"] == {"n": won[0]}
    assert len(engine.tasks(run_id, "ship")) == 1


def test_a_signal_whose_backend_dies_before_commit_changes_nothing(engine: Engine, dsn: str) -> None:
    _approval(engine)
    run_id = engine.start("approval", {})
    _finish_prepare(engine, run_id)
    doomed = psycopg.connect(dsn)
    doomed.execute("select flowlane.signal(%s, 'approve', %s)", (run_id, Jsonb({"lost": True})))
    pid = doomed.info.backend_pid
    engine.conn.execute("select pg_terminate_backend(%s)", (pid,))
    with pytest.raises(psycopg.OperationalError):
        doomed.commit()
    doomed.close()
    assert engine.statuses(run_id)["approve"] == "started"
    _signal(engine, run_id, "approve", {"kept": True})
    assert engine.states(run_id)["approve"]["output"] == {"kept": True}
