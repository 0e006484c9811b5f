"""Flow control in the SQL Core: concurrency keys on flows and steps, a queue's concurrency
and rate limit, priorities; what waits, and why (run_holds, queue_flow_control)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

Row = dict[str, Any]


def claim(engine: Engine, queue: str, qty: int = 100, worker: uuid.UUID | None = None) -> list[Row]:
    """A worker's claim (claim_tasks), every row."""
    pairs = Jsonb([list(p) for p in engine.routed_pairs(queue)])
    return engine.rows(
        "select * from flowlane.claim_tasks(%s, %s, %s, %s)",
        (queue, qty, worker or engine.worker_id, pairs),
    )


def claimed(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r["outcome"] == "claimed"]


def status(engine: Engine, run_id: uuid.UUID) -> str:
    return str(engine.run(run_id)["status"])


def holds(engine: Engine, run_ids: list[uuid.UUID]) -> list[Row]:
    return engine.rows("select * from flowlane.run_holds(%s)", (run_ids,))


def test_a_flow_limit_holds_runs_per_key_fifo_and_the_end_of_one_begins_the_next(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1, concurrency_key="/customer_id")
    first, second, third = (engine.start("f", {"customer_id": 42}) for _ in range(3))
    other = engine.start("f", {"customer_id": 7})
    assert [status(engine, r) for r in (first, second, third, other)] == [
        "started", "waiting", "waiting", "started"]
    shown = holds(engine, [second, third])
    assert [(h["run_id"], h["waiting_for"], h["place"]) for h in shown] == sorted([
        (second, "concurrency customer_id=42: 1 of 1 started", 1),
        (third, "concurrency customer_id=42: 1 of 1 started", 2),
    ], key=lambda h: str(h[0]))
    # held runs have no task: the queue holds the two started runs' tasks only
    tasks = claimed(claim(engine, "f"))
    assert sorted(t["run_id"] for t in tasks) == sorted([first, other])
    engine.complete(next(t for t in tasks if t["run_id"] == first), 1)
    # the completion began the next run of the key, in the same transaction
    assert [status(engine, r) for r in (first, second, third)] == ["completed", "started", "waiting"]
    [task] = claimed(claim(engine, "f"))
    assert task["run_id"] == second and task["attempt"] == 1
    engine.fail(task)  # max_attempts 3: a retry keeps the run (and its slot)
    assert status(engine, third) == "waiting"
    assert_invariants(engine)


@pytest.mark.parametrize("end", ["cancel", "fail", "deadline", "cancel_held"])
def test_every_way_a_run_ends_begins_the_next_held_run(engine: Engine, end: str) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1})], concurrency_limit=1, deadline=60)
    first, second = engine.start("f", {}), engine.start("f", {})
    assert status(engine, second) == "waiting"
    if end == "cancel":
        engine.scalar("select flowlane.cancel_run(%s)", (first,))
    elif end == "fail":
        [task] = claimed(claim(engine, "f"))
        engine.fail(task)
    elif end == "deadline":
        engine.scalar("select flowlane.maintenance_tick(now() + interval '1 hour')")
    else:
        engine.scalar("select flowlane.cancel_run(%s)", (second,))
        assert status(engine, first) == "started"
        third = engine.start("f", {})
        assert status(engine, third) == "waiting"
        engine.scalar("select flowlane.cancel_run(%s)", (first,))
        assert status(engine, third) == "started"
        return
    assert status(engine, first) in {"cancelled", "failed"}
    run = engine.run(second)
    assert run["status"] == "started" and run["deadline_at"] is not None
    # the deadline counts from the run's begin, not from its creation
    assert run["deadline_at"] == run["started_at"] + __import__("datetime").timedelta(seconds=60)
    assert_invariants(engine)


def test_a_retried_run_waits_for_its_key_like_a_new_one(engine: Engine) -> None:
    engine.define("f", [("a", [], {"max_attempts": 1})], concurrency_limit=1)
    first = engine.start("f", {})
    [task] = claimed(claim(engine, "f"))
    engine.fail(task)
    second = engine.start("f", {})
    assert status(engine, second) == "started"
    engine.scalar("select flowlane.retry_run(%s)", (first,))
    assert status(engine, first) == "waiting"
    [task] = claimed(claim(engine, "f"))
    engine.complete(task, 1)
    assert status(engine, first) == "started"
    [task] = claimed(claim(engine, "f"))
    assert task["run_id"] == first
    engine.complete(task, 2)
    assert engine.run(first)["output"] == {"a": 2}
    assert_invariants(engine)


def test_a_delayed_run_of_a_limited_flow_waits_for_its_key_when_due(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1)
    started = engine.start("f", {})
    delayed = engine.scalar(
        "select run_id from flowlane.start_flow('f', '{}', start_at => now() + interval '1 minute')")
    assert holds(engine, [delayed])[0]["waiting_for"].startswith("start at ")
    engine.scalar("select flowlane.maintenance_tick(now() + interval '2 minutes')")
    assert status(engine, delayed) == "waiting"
    assert holds(engine, [delayed])[0]["waiting_for"] == "concurrency f: 1 of 1 started"
    [task] = claimed(claim(engine, "f"))
    engine.complete(task, 1)
    assert status(engine, started) == "completed" and status(engine, delayed) == "started"


def test_raising_and_removing_a_flow_limit_begins_held_runs(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1)
    runs = [engine.start("f", {}) for _ in range(4)]
    assert [status(engine, r) for r in runs] == ["started"] + ["waiting"] * 3
    engine.create_flow("f", concurrency_limit=2)
    assert [status(engine, r) for r in runs] == ["started", "started", "waiting", "waiting"]
    engine.create_flow("f")
    assert [status(engine, r) for r in runs] == ["started"] * 4
    assert len(claimed(claim(engine, "f"))) == 4
    assert_invariants(engine)


def test_a_step_limit_holds_tasks_without_a_message_or_an_attempt(engine: Engine) -> None:
    engine.define("f", [("m", [], {"step_type": "map", "concurrency_limit": 2,
                                   "concurrency_key": "/0"})])
    run_id = engine.start("f", ["x", "y", "z", "w"])
    other = engine.start("f", ["q"])
    assert len(engine.tasks(run_id)) == 2  # two sent, two held (no step_tasks row, no message)
    shown = [h for h in holds(engine, [run_id]) if h["step_slug"] == "m"]
    assert [(h["task_index"], h["waiting_for"], h["place"]) for h in shown] == [
        (2, "step concurrency 0=x: 2 of 2 started", 1), (3, "step concurrency 0=x: 2 of 2 started", 2)]
    assert engine.rows("select * from flowlane.stuck_runs()") == []
    tasks = claimed(claim(engine, "f"))
    assert sorted((t["run_id"] == other, t["task_index"]) for t in tasks) == [
        (False, 0), (False, 1), (True, 0)]
    engine.fail(next(t for t in tasks if t["task_index"] == 0 and t["run_id"] == run_id))
    assert len(engine.tasks(run_id)) == 2  # a retry keeps its slot
    engine.complete(next(t for t in tasks if t["task_index"] == 1), "b")
    sent = engine.task(run_id, "m", 2)
    assert sent["status"] == "queued" and sent["attempts_count"] == 0
    engine.make_visible("f")
    rest = claimed(claim(engine, "f"))
    assert sorted((t["task_index"], t["attempt"]) for t in rest) == [(0, 2), (2, 1)]
    for t in rest:
        engine.complete(t, t["task_index"])
    [last] = claimed(claim(engine, "f"))
    engine.complete(last, 3)
    assert engine.run(run_id)["output"] == {"m": [0, "b", 2, 3]}
    assert_invariants(engine)


def test_a_run_that_ends_drops_its_held_tasks_and_frees_their_key(engine: Engine) -> None:
    engine.define("f", [("m", [], {"step_type": "map", "concurrency_limit": 1})])
    first = engine.start("f", [1, 2, 3])
    second = engine.start("f", [4])
    engine.scalar("select flowlane.cancel_run(%s)", (first,))
    assert engine.scalar("select count(*) from flowlane.held_tasks where run_id = %s", (first,)) == 0
    [task] = claimed(claim(engine, "f"))
    assert task["run_id"] == second
    assert_invariants(engine)


def test_a_queue_concurrency_limit_caps_started_tasks_across_claims(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    for _ in range(5):
        engine.start("f", {})
    engine.scalar("select flowlane.set_queue_limits('f', 2, null, null)")
    first = claimed(claim(engine, "f", 10))
    assert len(first) == 2
    [refused] = claim(engine, "f", 10, uuid.uuid4())
    assert refused["outcome"] == "at_capacity" and refused["msg_id"] is None
    [row] = engine.rows("select * from flowlane.queue_flow_control()")
    assert row["started"] == 2 and row["waiting_for"] == "queue concurrency f: 2 of 2 started"
    engine.complete(first[0], 1)
    assert len(claimed(claim(engine, "f", 10))) == 1
    # the two-step claim (pgmq.read, then start_tasks) is held to the same limit
    engine.complete(first[1], 1)
    ids = engine.read("f")
    assert len(ids) == 2
    started = engine.rows("select * from flowlane.start_tasks('f', %s, %s, %s)",
                          (ids, engine.worker_id, Jsonb([["f", "a"]])))
    assert [r["outcome"] for r in started] == ["claimed"]
    assert engine.scalar("select flowlane.keep_only_queue_limits('{}')") == ["f"]
    assert len(claimed(claim(engine, "f", 10))) == 1  # the handed-back message
    assert_invariants(engine)


def test_a_rate_limit_starts_a_burst_then_says_when_the_next_start_is_allowed(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    for _ in range(5):
        engine.start("f", {})
    engine.scalar("select flowlane.set_queue_limits('f', null, 2, 60)")
    assert len(claimed(claim(engine, "f", 10))) == 2
    [refused] = claim(engine, "f", 10)
    assert refused["outcome"] == "rate_limited"
    assert 29_000 <= refused["input"]["wait_ms"] <= 30_000
    [row] = engine.rows("select * from flowlane.queue_flow_control()")
    assert row["waiting_for"].startswith("rate limit f: next start in ")
    # half a window later, one token
    engine.conn.execute("update flowlane.queue_limits set refilled_at = refilled_at - interval '30 s'")
    assert len(claimed(claim(engine, "f", 10))) == 1
    queued = engine.rows("select run_id from flowlane.step_tasks where status = 'queued' limit 1")
    assert holds(engine, [queued[0]["run_id"]])[0]["waiting_for"].startswith("rate limit f")


def test_claims_take_higher_priorities_first_and_fifo_within_one(engine: Engine) -> None:
    for flow, priority in (("low", None), ("high", 10)):
        engine.create_flow(flow, queue_mode="explicit", priority=priority)
        engine.add_step(flow, "a", queue_name="shared")
    order = [engine.start("low", {"n": 1}), engine.start("high", {"n": 2}),
             engine.start("low", {"n": 3}), engine.start("high", {"n": 4})]
    urgent = engine.scalar(
        "select run_id from flowlane.start_flow('low', '{\"n\": 5}', priority => 100)")
    seen = []
    for _ in range(5):
        [task] = claimed(claim(engine, "shared", 1))
        seen.append(task["run_id"])
    assert seen == [urgent, order[1], order[3], order[0], order[2]]
    assert engine.scalar("select prioritized from flowlane.queues where queue_name = 'shared'")


def test_undeclared_queues_and_unlimited_flows_behave_as_before(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    runs = [engine.start("f", {}) for _ in range(3)]
    assert all(engine.run(r)["concurrency_key"] is None for r in runs)
    assert len(claimed(claim(engine, "f"))) == 3
    assert not engine.scalar("select prioritized from flowlane.queues where queue_name = 'f'")


def test_options_are_checked(engine: Engine) -> None:
    for options, message in (
        ({"concurrency_limit": 0}, "at least 1"),
        ({"concurrency_key": "/a"}, "needs a concurrency limit"),
        ({"concurrency_limit": 1, "concurrency_key": "a"}, "not a JSON pointer"),
        ({"priority": 1001}, "from -1000 to 1000"),
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            engine.create_flow("f", **options)
    engine.create_flow("f")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="from -1000 to 1000"):
        engine.scalar("select flowlane.start_flow('f', '{}', priority => -1001)")
    engine.add_step("f", "a")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at least 1"):
        engine.scalar("select flowlane.set_queue_limits('f', 0, null, null)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="both a limit and a period"):
        engine.scalar("select flowlane.set_queue_limits('f', null, 5, null)")
    with pytest.raises(psycopg.errors.NoDataFound):
        engine.scalar("select flowlane.set_queue_limits('nope', 1, null, null)")


def test_a_big_backlog_of_one_key_does_not_delay_the_other_keys(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=2, concurrency_key="/customer")
    engine.rows("select 1 from flowlane.start_flows('f', %s::jsonb[])",
                ([Jsonb({"customer": "big", "n": n}) for n in range(1000)],))
    others = [engine.start("f", {"customer": f"c{k}"}) for k in range(10)]
    assert engine.scalar("select count(*) from flowlane.runs where status = 'waiting'") == 998
    big_done = 0
    others_begun_at: dict[uuid.UUID, int] = {}
    while big_done < 10:
        tasks = claimed(claim(engine, "f", 4))
        assert tasks, "the queue ran dry before the big key's tenth run completed"
        for task in tasks:
            if task["run_id"] in others:
                others_begun_at.setdefault(task["run_id"], big_done)
            engine.complete(task, 1)
            if task["flow_input"] is not None and task["flow_input"].get("customer") == "big":
                big_done += 1
    # every other key's run started (was claimed) before the big key's tenth run completed
    assert sorted(others_begun_at) == sorted(others)
    assert max(others_begun_at.values()) < 10
    # the big key's runs began in the order they were started (FIFO per key)
    begun = engine.rows("select input ->> 'n' as n from flowlane.runs where input ->> 'customer' = 'big' "
                        "and status <> 'waiting' order by started_at, hold_seq")
    assert sorted(int(r["n"]) for r in begun) == list(range(len(begun)))


def test_at_capacity_the_end_of_a_started_task_wakes_the_queues_listeners(engine: Engine, dsn: str) -> None:
    engine.define("f", [("a", [], {})])
    engine.scalar("select flowlane.set_queue_limits('f', 1, null, null)")
    engine.start("f", {})
    engine.start("f", {})
    [task] = claimed(claim(engine, "f"))
    [refused] = claim(engine, "f")
    assert refused["outcome"] == "at_capacity"
    channel = engine.scalar("select 'pgmq.' || pgmq.format_table_name('f', 'q') || '.INSERT'")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(psycopg.sql.SQL("listen {}").format(psycopg.sql.Identifier(channel)))
        engine.complete(task, 1)  # no new message: the run had one step
        woken = list(listener.notifies(timeout=10, stop_after=1))
    assert [n.channel for n in woken] == [channel]
    assert len(claimed(claim(engine, "f"))) == 1


def test_strict_priorities_starve_lower_ones_while_higher_ones_are_visible(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    low = engine.start("f", {"n": "low"})
    for n in range(5):  # a permanent higher-priority load: one new urgent run per claim
        urgent = engine.scalar("select run_id from flowlane.start_flow('f', %s, priority => 1)",
                               (Jsonb({"n": n}),))
        [task] = claimed(claim(engine, "f", 1))
        assert task["run_id"] == urgent
        engine.complete(task, 1)
    [task] = claimed(claim(engine, "f", 1))
    assert task["run_id"] == low


def test_child_runs_of_a_limited_flow_wait_for_their_key_and_the_parent_collects_them(engine: Engine) -> None:
    engine.define("child", [("double", [], {})], concurrency_limit=1)
    engine.define("parent", [("each", [], {"step_type": "map", "child_flow": "child"})])
    run_id = engine.start("parent", [3, 1, 2])
    children = engine.rows("select run_id, status from flowlane.runs where parent_run_id = %s "
                           "order by parent_task_index", (run_id,))
    assert [c["status"] for c in children] == ["started", "waiting", "waiting"]
    assert engine.rows("select * from flowlane.stuck_runs()") == []
    for _ in range(3):
        [task] = claimed(claim(engine, "child"))
        engine.complete(task, task["input"] * 10)
    assert engine.run(run_id)["output"] == {"each": [{"double": 30}, {"double": 10}, {"double": 20}]}
    # a parent that ends cancels its held children too
    other = engine.start("parent", [5, 6])
    engine.scalar("select flowlane.cancel_run(%s)", (other,))
    assert [r["status"] for r in engine.rows(
        "select status from flowlane.runs where parent_run_id = %s", (other,))] == ["cancelled", "cancelled"]
    assert_invariants(engine)


def test_retention_never_prunes_a_held_run(engine: Engine) -> None:
    engine.define("f", [("a", [], {})], concurrency_limit=1, retention=60)
    engine.start("f", {})
    held = engine.start("f", {})
    pruned = engine.scalar("select runs_deleted from flowlane.prune_runs(p_now => now() + interval '1 day')")
    assert pruned == 0 and status(engine, held) == "waiting"
