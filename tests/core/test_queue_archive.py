"""A queue's archive: the messages of ended tasks are archived (the default) or, where the
queue's `kind: queue` document turns the archive off (set_queue_limits' archive), deleted.
Every way a task's message ends is run with the archive on and off."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def archive_off(engine: Engine, queue: str) -> None:
    engine.scalar("select flowlane.set_queue_limits(%s, null, null, null, archive => false)", (queue,))


def define(engine: Engine, steps: list[tuple[str, list[str], dict[str, Any]]], archive: bool,
           **flow_options: Any) -> None:
    """Flow f on its own queue f, whose archive is on or off."""
    engine.define("f", steps, **flow_options)
    if not archive:
        archive_off(engine, "f")


def completed_one_at_a_time(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("a", [], {}), ("b", ["a"], {})], archive)
    run_id = engine.start("f", {})
    for _ in ("a", "b"):
        [task] = engine.claim("f")
        engine.complete(task, {"ok": True})
    return run_id


def completed_in_a_batch(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("m", [], {"step_type": "map"})], archive)
    run_id = engine.start("f", [1, 2, 3])
    tasks = engine.claim("f")
    results = [{"run_id": str(t["run_id"]), "step_slug": t["step_slug"], "task_index": t["task_index"],
                "attempt": t["attempt"], "output": t["task_index"], "worker_id": str(engine.worker_id)}
               for t in tasks]
    engine.scalar("select count(*) from flowlane.complete_tasks(%s)", (Jsonb(results),))
    return run_id


def failed_out_of_attempts(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("a", [], {"max_attempts": 1}), ("b", [], {})], archive)
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.fail(tasks["a"])  # the run fails: b is cancelled
    return run_id


def skipped(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("m", [], {"step_type": "map", "max_attempts": 1, "when_exhausted": "skip"})], archive)
    run_id = engine.start("f", [1, 2, 3])
    [task] = engine.claim("f", qty=1)
    engine.fail(task)  # its step is skipped: the two tasks still queued with it
    return run_id


def stalled_to_the_end(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("a", [], {"timeout": 10})], archive, max_attempts=1)
    run_id = engine.start("f", {})
    engine.claim("f")
    engine.backdate(run_id, "a", 100)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    return run_id


def cancelled(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("a", [], {}), ("b", [], {})], archive)
    run_id = engine.start("f", {})
    engine.claim("f", qty=1)  # one started, one queued
    engine.scalar("select flowlane.cancel_run(%s)", (run_id,))
    return run_id


def flow_deleted(engine: Engine, archive: bool) -> uuid.UUID:
    define(engine, [("a", [], {}), ("b", [], {})], archive)
    run_id = engine.start("f", {})
    engine.claim("f", qty=1)
    engine.scalar("select flowlane.delete_flow_and_data('f')")
    return run_id


ENDINGS: dict[str, tuple[Callable[[Engine, bool], uuid.UUID], str | None]] = {
    "completed one at a time": (completed_one_at_a_time, "completed"),
    "completed in a batch": (completed_in_a_batch, "completed"),
    "failed out of attempts": (failed_out_of_attempts, "failed"),
    "skipped": (skipped, "completed"),
    "stalled to the end": (stalled_to_the_end, "failed"),
    "cancelled": (cancelled, "cancelled"),
    "flow deleted": (flow_deleted, None),
}


def sent_message_ids(engine: Engine) -> list[int]:
    """Every message the queue was ever sent (its ids are a sequence: none is skipped here)."""
    last = engine.scalar("select last_value from pgmq.q_f_msg_id_seq")
    return list(range(1, int(last) + 1))


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("archive", [True, False], ids=["archive on", "archive off"])
def test_an_ended_tasks_message_is_archived_or_deleted_as_its_queue_says(
    engine: Engine, ending: str, archive: bool
) -> None:
    end, status = ENDINGS[ending]
    run_id = end(engine, archive)
    sent = sent_message_ids(engine)
    assert sent  # the run's tasks had messages
    assert engine.queue_messages("f") == []
    assert engine.archived_ids("f") == (sent if archive else [])
    if status is not None:
        assert engine.run(run_id)["status"] == status
        tasks = engine.tasks(run_id)
        # the queue identity of every task stays: its queue and its message's id
        assert all(t["queue_name"] == "f" and t["message_id"] is not None for t in tasks)
        assert sorted(t["message_id"] for t in tasks) == sent


def test_the_archive_is_what_the_last_applied_queue_file_says(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.define("g", [("a", [], {})])
    archived = "select queue_name from flowlane.queues where archive_messages order by 1"
    archive_off(engine, "f")
    archive_off(engine, "g")
    assert engine.rows(archived) == []
    # only the archive is declared: the queue has no limits, and claims see none
    assert engine.scalar("select count(*) from flowlane.queue_limits") == 0
    assert engine.rows("select * from flowlane.queue_flow_control()") == []
    engine.scalar("select flowlane.set_queue_limits('f', 2, null, null)")  # the key left out: on
    assert engine.rows(archived) == [{"queue_name": "f"}]
    assert engine.scalar("select flowlane.keep_only_queue_limits(array['f'])") == []
    assert engine.rows(archived) == [{"queue_name": "f"}, {"queue_name": "g"}]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="archive is true or false"):
        engine.scalar("select flowlane.set_queue_limits('f', null, null, null, archive => null)")


def test_a_claim_ends_the_message_of_a_task_already_ended_without_archiving_it(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    archive_off(engine, "f")
    engine.start("f", {})
    [task] = engine.claim("f")
    message = engine.scalar("select message from pgmq.q_f where msg_id = %s", (task["msg_id"],))
    engine.complete(task, {})
    # the message back on the queue, as a duplicate delivery would leave it
    engine.conn.execute("insert into pgmq.q_f (msg_id, vt, message) overriding system value"
                        " values (%s, clock_timestamp(), %s)",
                        (task["msg_id"], Jsonb(message)))
    assert engine.claim("f") == []
    assert engine.queue_messages("f") == [] and engine.archived_ids("f") == []
