"""0006: notifications without a hot row, leases, limits, stuck runs, small fixes."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.runtime import limits
from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# -- 1. enqueue never waits on a shared row ------------------------------------------


def test_enqueue_does_not_wait_for_another_transaction_that_enqueued(
    engine: Engine, dsn: str
) -> None:
    # PGMQ's throttled trigger updated one row per queue on every insert: a transaction that
    # had enqueued (start_flow, complete_task) blocked every other enqueue until it ended, and
    # with run locks held in between, deadlocked (14 in a 300-run baseline)
    engine.define("f", [("a", [], {})])
    assert engine.scalar("select flowlane.enable_queue_notify('f')") is True
    assert engine.scalar("select flowlane.enable_queue_notify('f')") is False  # idempotent
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as other:
        holder.execute("select flowlane.start_flow('f', '{}')")  # open transaction, enqueued
        other.execute("set lock_timeout = '5s'")
        other.execute("select flowlane.start_flow('f', '{}')")  # must not wait for holder
        holder.rollback()
    assert engine.scalar("select count(*) from flowlane.runs") == 1


def test_enable_queue_notify_replaces_pgmq_throttled_trigger(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.conn.execute("select pgmq.enable_notify_insert('f', 0)")
    engine.conn.execute("select flowlane.enable_queue_notify('f')")
    assert engine.rows("select * from pgmq.list_notify_insert_throttles()") == []
    triggers = engine.rows("select tgname from pg_trigger where tgrelid = 'pgmq.q_f'::regclass")
    assert triggers == [{"tgname": "flowlane_notify_insert"}]


def test_insert_notification_reaches_a_listener(engine: Engine, dsn: str) -> None:
    engine.define("f", [("a", [], {})])
    engine.conn.execute("select flowlane.enable_queue_notify('f')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute('listen "pgmq.q_f.INSERT"')
        engine.start("f", {})
        received = list(listener.notifies(timeout=10, stop_after=1))
    assert [n.channel for n in received] == ["pgmq.q_f.INSERT"]


def test_enable_queue_notify_refuses_an_unknown_queue(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="does not exist"):
        engine.conn.execute("select flowlane.enable_queue_notify('nope')")


@pytest.fixture
def queue_f(engine: Engine) -> None:
    """Flow ``f`` of one step, its queue with flowlane's insert notification."""
    engine.define("f", [("a", [], {})])
    engine.conn.execute("select flowlane.enable_queue_notify('f')")


@contextlib.contextmanager
def _listening(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute('listen "pgmq.q_f.INSERT"')
        yield listener


def _producer(dsn: str) -> psycopg.Connection[Any]:
    """A connection whose start stays uncommitted until the test commits it."""
    producer = psycopg.connect(dsn)
    producer.execute("select flowlane.start_flow('f', '{}')")
    return producer


def _blocked_by(watcher: psycopg.Connection[Any], blocker: int) -> None:
    """Until a backend waits for ``blocker`` (a barrier: no sleep, the lock table says so)."""
    while not watcher.execute(
        "select exists (select 1 from pg_stat_activity where %s = any (pg_blocking_pids(pid)))",
        (blocker,),
    ).fetchone()[0]:  # type: ignore[index]
        pass


def _awaiting_inserts(worker: psycopg.Connection[Any], settled: list[bool]) -> threading.Thread:
    """A worker's await_queue_inserts, running in a thread; its answer goes to ``settled``."""
    query = "select flowlane.await_queue_inserts('f', 60000)"
    waiter = threading.Thread(target=lambda: settled.append(worker.execute(query).fetchone()[0]))  # type: ignore[index]
    waiter.start()
    return waiter


@pytest.mark.usefixtures("queue_f")
def test_an_insert_sends_no_notification_while_another_is_on_its_way(engine: Engine, dsn: str) -> None:
    # notifying commits flush one after another: a queue has one notifying transaction in flight
    with _listening(dsn) as listener:
        first, second = _producer(dsn), _producer(dsn)  # the second while the first's is on its way
        first.commit()
        second.commit()
        third = _producer(dsn)  # alone in flight: notifies
        third.commit()
        received = list(listener.notifies(timeout=10, stop_after=2))
        pids = [first.info.backend_pid, third.info.backend_pid]
        for producer in (first, second, third):
            producer.close()
    assert [n.pid for n in received] == pids


@pytest.mark.usefixtures("queue_f")
def test_a_worker_about_to_wait_finds_the_insert_whose_notification_was_left_out(
    engine: Engine, dsn: str
) -> None:
    settled: list[bool] = []
    with _listening(dsn) as listener, psycopg.connect(dsn, autocommit=True) as worker:
        first, second = _producer(dsn), _producer(dsn)  # second: no notification of its own
        first.commit()  # the worker wakes on it, claims the first run and is about to wait again
        waiter = _awaiting_inserts(worker, settled)
        _blocked_by(engine.conn, second.info.backend_pid)
        # an insert while the worker waits, with no notification on its way: it sends its own
        with psycopg.connect(dsn, autocommit=True) as late:
            late.execute("select flowlane.start_flow('f', '{}')")
            late_pid = late.info.backend_pid
        assert waiter.is_alive()  # still waiting for the second
        second.commit()
        waiter.join()
        received = [n.pid for n in listener.notifies(timeout=10, stop_after=2)]
        first_pid = first.info.backend_pid
        first.close()
        second.close()
    assert settled == [True]
    assert received == [first_pid, late_pid]
    assert engine.scalar("select count(*) from pgmq.q_f") == 3  # visible to the claim that follows


@pytest.mark.usefixtures("queue_f")
def test_an_insert_while_a_worker_waits_takes_the_other_lock_and_is_waited_for_next(
    engine: Engine, dsn: str
) -> None:
    settled: list[bool] = []
    with _listening(dsn) as listener, psycopg.connect(dsn, autocommit=True) as worker:
        first = _producer(dsn)  # its notification is on its way
        waiter = _awaiting_inserts(worker, settled)
        _blocked_by(engine.conn, first.info.backend_pid)
        second = _producer(dsn)  # takes the other inserter lock; the first's notification suffices
        first.commit()
        _blocked_by(engine.conn, second.info.backend_pid)  # the worker waits for it in turn
        assert waiter.is_alive()
        second.commit()
        waiter.join()
        third = _producer(dsn)
        third.commit()
        received = [n.pid for n in listener.notifies(timeout=10, stop_after=2)]
        pids = [first.info.backend_pid, third.info.backend_pid]
        for producer in (first, second, third):
            producer.close()
    assert settled == [True]
    assert received == pids


@pytest.mark.usefixtures("queue_f")
def test_awaiting_the_inserters_gives_up_on_a_long_transaction(engine: Engine, dsn: str) -> None:
    producer = _producer(dsn)
    try:
        assert engine.scalar("select flowlane.await_queue_inserts('f', 1)") is False
    finally:
        producer.rollback()
        producer.close()
    assert engine.scalar("select flowlane.await_queue_inserts('f', 1)") is True


@pytest.mark.usefixtures("queue_f")
def test_awaiting_the_inserters_leaves_no_lock_behind_when_its_timeout_meets_the_grant(
    engine: Engine, dsn: str
) -> None:
    # inserters whose transactions last about the wait's timeout: a lock timeout that fires as
    # the lock is granted raises once it is held; a lock that outlived it would make every
    # later wait time out and every insert skip it, until the worker's connection closed
    inserting = ("select pg_try_advisory_xact_lock_shared(k, hashtext('q_f'))"
                 " from unnest(flowlane._queue_inserter_locks()) k; select pg_sleep(0.001)")
    held_after: list[int] = []
    timed_out = 0
    with psycopg.connect(dsn, autocommit=True) as worker, psycopg.connect(dsn, autocommit=True) as inserter:
        for _ in range(300):
            insert = threading.Thread(target=lambda: inserter.execute(inserting))
            insert.start()
            timed_out += not worker.execute("select flowlane.await_queue_inserts('f', 1)").fetchone()[0]  # type: ignore[index]
            insert.join()
            held_after.append(engine.scalar(
                "select count(*) from pg_locks where locktype = 'advisory' and pid = %s",
                (worker.info.backend_pid,)))
    assert timed_out > 0  # the race was run
    assert set(held_after) == {0}


@pytest.mark.usefixtures("queue_f")
def test_an_insert_that_can_take_no_inserter_lock_notifies(engine: Engine, dsn: str) -> None:
    # every inserter lock taken (as waiting workers make them): an insert can take none
    with psycopg.connect(dsn) as holder:
        holder.execute("select pg_advisory_xact_lock(k, hashtext('q_f'))"
                       " from unnest(flowlane._queue_inserter_locks()) k")
        with _listening(dsn) as listener:
            first, second = _producer(dsn), _producer(dsn)
            first.commit()
            second.commit()
            received = [n.pid for n in listener.notifies(timeout=10, stop_after=2)]
            pids = [first.info.backend_pid, second.info.backend_pid]
            first.close()
            second.close()
        holder.rollback()
    assert received == pids


# -- 2. leases ------------------------------------------------------------------------


def lease_item(task: dict[str, Any], running: bool) -> Jsonb:
    return Jsonb([{"run_id": str(task["run_id"]), "step_slug": task["step_slug"],
                   "task_index": task["task_index"], "attempt": task["attempt"],
                   "running": running}])


def test_a_pending_result_keeps_its_lease(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run_id, "a", 100)  # claimed long ago; the result is still being sent
    extended = engine.scalar("select flowlane.extend_leases(%s, %s)",
                             (engine.worker_id, lease_item(task, running=False)))
    assert extended == 1
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 0
    assert engine.vt_in("f", task["msg_id"]) > 35  # hidden until the new stall deadline (40 s)
    assert engine.complete(task, "ok")["status"] == "completed"  # type: ignore[index]


def test_a_handler_running_past_its_timeout_is_not_extended(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run_id, "a", 100)
    extended = engine.scalar("select flowlane.extend_leases(%s, %s)",
                             (engine.worker_id, lease_item(task, running=True)))
    assert extended == 0
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1


def test_only_the_owner_extends_a_lease(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run_id, "a", 100)
    for worker, item in ((uuid.uuid4(), task), (engine.worker_id, {**task, "attempt": 2})):
        assert engine.scalar("select flowlane.extend_leases(%s, %s)",
                             (worker, lease_item(item, running=False))) == 0
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1


def test_extend_leases_refuses_a_non_array(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="JSON array"):
        engine.conn.execute("select flowlane.extend_leases(gen_random_uuid(), '{}')")


# -- 3. stuck runs --------------------------------------------------------------------


@pytest.mark.no_invariants
def test_stuck_runs_lists_a_started_run_whose_task_lost_its_message(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    healthy = engine.start("f", {})
    [task] = [t for t in engine.claim("f") if t["run_id"] == run_id]
    engine.conn.execute("select pgmq.archive('f', %s::bigint)", (task["msg_id"],))
    stuck = engine.rows("select run_id, reason from flowlane.stuck_runs()")
    assert stuck == [{"run_id": run_id,
                      "reason": "its queued and started tasks have no message on their queue"}]
    assert healthy not in [r["run_id"] for r in stuck]


# -- 4. limits ------------------------------------------------------------------------


def test_python_and_sql_limits_agree(engine: Engine) -> None:
    assert engine.scalar("select flowlane.json_limits()") == {
        "max_depth": limits.MAX_DEPTH, "max_bytes": limits.MAX_BYTES}
    for value in (1, [], {}, nested(1), nested(99), nested(100), nested(101),
                  {"a": [{"b": nested(98)}]}, {"a": [{"b": nested(99)}]}):
        sql = engine.scalar("select flowlane.json_depth_exceeds(%s, %s)",
                            (Jsonb(value), limits.MAX_DEPTH))
        assert sql == limits.depth_exceeds(value), value


def test_start_flow_refuses_input_nested_past_the_limit(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.start("f", {"ok": nested(limits.MAX_DEPTH - 1)})
    deep = "[" * 1000 + "1" + "]" * 1000  # 2 KB; json.dumps cannot even encode it
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested deeper than 100"):
        engine.conn.execute("select flowlane.start_flow('f', %s::jsonb)", (deep,))
    assert engine.scalar("select count(*) from flowlane.runs") == 1


def test_depth_counts_objects_and_arrays_not_brackets_in_strings(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    text = "[{" * (limits.MAX_DEPTH + 1)
    run_id = engine.start("f", {"text": text, "ok": nested(limits.MAX_DEPTH - 1)})
    assert engine.scalar("select input ->> 'text' from flowlane.runs where run_id = %s", (run_id,)) == text
    objects: Any = 1
    for _ in range(limits.MAX_DEPTH + 1):
        objects = {"a": objects}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested deeper than 100"):
        engine.start("f", objects)
    assert engine.scalar("select count(*) from flowlane.runs") == 1


def test_start_flow_refuses_input_past_the_size_limit(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="more than the limit"):
        engine.start("f", {"blob": "x" * limits.MAX_BYTES})
    assert engine.scalar("select count(*) from flowlane.runs") == 0


# -- 5. small fixes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "attempts", "delay"),
    [(5, 0, 5), (5, 3, 40), (1, 30, 2**30), (2, 30, 2147483647), (1, 2147483647, 2147483647),
     (0, 2147483647, 0), (5, -1, 5)],
)
def test_retry_delay_never_overflows(engine: Engine, base: int, attempts: int, delay: int) -> None:
    assert engine.scalar("select flowlane.calculate_retry_delay(%s, %s)", (base, attempts)) == delay


def test_concurrent_applies_of_one_flow_never_collide(engine: Engine, dsn: str) -> None:
    # before 0006 about 1 in 150 concurrent applies failed on flows_slug_ci_unique
    errors: list[BaseException] = []

    def apply(slug: str, barrier: threading.Barrier) -> None:
        try:
            with psycopg.connect(dsn) as conn:
                barrier.wait(timeout=10)
                conn.execute("select flowlane.create_flow(%s, queue_mode => 'explicit')", (slug,))
                conn.execute("select flowlane.add_step(%s, 'a', queue_name => 'race_q')", (slug,))
        except BaseException as exc:
            errors.append(exc)

    for i in range(150):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=apply, args=(f"Race{i}", barrier)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert errors == []
    assert engine.scalar("select count(*) from flowlane.flows") == 150
