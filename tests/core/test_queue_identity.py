"""Migration 0002: queue identity on steps and tasks, registry, routing modes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def queues(engine: Engine) -> list[str]:
    return [
        r["queue_name"] for r in engine.rows("select queue_name from pgmq.list_queues() order by 1")
    ]


def registry(engine: Engine) -> dict[str, tuple[str, str | None]]:
    return {
        r["queue_name"]: (r["ownership"], r["owner_flow_slug"])
        for r in engine.rows("select * from flowlane.queues")
    }


def explicit(
    engine: Engine,
    flow: str,
    routes: dict[str, str],
    deps: dict[str, list[str]] | None = None,
    **options: Any,
) -> None:
    """A flow with explicit routing; ``routes``: step -> queue, in definition order."""
    engine.create_flow(flow, queue_mode="explicit", **options)
    for step, queue in routes.items():
        engine.add_step(flow, step, (deps or {}).get(step, []), queue_name=queue)


# -- schema -------------------------------------------------------------------


def test_identity_columns_not_null(engine: Engine) -> None:
    nullable = engine.scalar(
        "select is_nullable from information_schema.columns "
        "where table_schema = 'flowlane' and table_name = 'step_tasks' and column_name = 'queue_name'")
    assert nullable == "NO"


def test_a_message_id_is_kept_once_written(engine: Engine) -> None:
    # a task's message id may be null only for a task completed from its step's cache (the
    # engine's invariants check that after every test: tests/core/engine.py)
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="immutable identity"):
        engine.conn.execute("update flowlane.step_tasks set message_id = null where run_id = %s", (run_id,))


def test_a_step_has_a_queue_unless_it_is_a_wait_or_child_flow_step(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    for index, (step_type, child, queue) in enumerate(
            [("wait", None, "f"), ("single", "f", "f"), ("single", None, None), ("map", None, None)]):
        with pytest.raises(psycopg.errors.CheckViolation, match="steps_queue_iff_handler"):
            engine.conn.execute(
                "insert into flowlane.steps (flow_slug, step_slug, step_type, step_index, child_flow, "
                "queue_name) values ('f', %s, %s, %s, %s, %s)",
                (f"s{index}", step_type, index + 1, child, queue))


def test_queue_message_identity_unique(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    task = engine.task(run_id, "a")
    with pytest.raises(psycopg.errors.UniqueViolation, match="step_tasks_queue_message_unique"):
        engine.conn.execute(
            "insert into flowlane.step_tasks "
            "(flow_slug, run_id, step_slug, task_index, queue_name, message_id) "
            "values ('f', %s, 'a', 1, 'f', %s)",
            (run_id, task["message_id"]),
        )


def test_task_queue_identity_is_immutable(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    for assignment in ("queue_name = 'other'", "message_id = message_id + 100"):
        with pytest.raises(psycopg.Error, match="immutable identity"):
            engine.conn.execute(
                f"update flowlane.step_tasks set {assignment} where run_id = %s", (run_id,)
            )
    # ordinary updates are unaffected; a no-op assignment of the same value is allowed
    engine.conn.execute(
        "update flowlane.step_tasks set error_message = 'x', queue_name = queue_name"
    )
    with pytest.raises(psycopg.Error, match="immutable identity"):
        engine.conn.execute("update flowlane.steps set queue_name = 'other'")


# -- routing modes ------------------------------------------------------------


def test_flow_mode_default_queue(engine: Engine) -> None:
    engine.define("Orders", [("a", [], {}), ("b", ["a"], {"queue_name": "orders"})])
    assert [r["queue_name"] for r in engine.rows("select queue_name from flowlane.steps")] == [
        "orders"
    ] * 2
    assert queues(engine) == ["orders"]
    assert registry(engine) == {"orders": ("owned", "Orders")}


def test_flow_mode_rejects_other_queue(engine: Engine) -> None:
    engine.create_flow("orders")
    with pytest.raises(psycopg.Error, match='routes this step to queue "orders", not "elsewhere"'):
        engine.add_step("orders", "a", queue_name="elsewhere")
    assert queues(engine) == []


def test_flow_mode_slug_longer_than_47_rejected(engine: Engine) -> None:
    with pytest.raises(psycopg.Error, match="at most 47 characters"):
        engine.create_flow("f" * 48)
    assert engine.create_flow("f" * 48, queue_mode="per-step")["queue_mode"] == "per-step"


def test_per_step_mode_derives_private_queues(engine: Engine) -> None:
    long_step = "s" * 40
    engine.create_flow("Billing", queue_mode="per-step")
    engine.add_step("Billing", "Fetch")
    engine.add_step("Billing", long_step, ["Fetch"])
    rows = engine.rows("select step_slug, queue_name from flowlane.steps order by step_index")
    assert [r["queue_name"] for r in rows] == ["billing__fetch", "billing__1"]
    assert registry(engine) == {
        "billing__fetch": ("owned", "Billing"),
        "billing__1": ("owned", "Billing"),
    }
    assert queues(engine) == ["billing__1", "billing__fetch"]
    # the derived name may be given explicitly; another name is refused
    assert (
        engine.add_step("Billing", "Fetch", queue_name="billing__fetch")["queue_name"]
        == "billing__fetch"
    )
    with pytest.raises(psycopg.Error, match="routes this step to queue"):
        engine.add_step("Billing", "Fetch", queue_name="billing_fetch")


def test_per_step_mode_too_long_even_with_index(engine: Engine) -> None:
    engine.create_flow("f" * 46, queue_mode="per-step")
    with pytest.raises(psycopg.Error, match="longer than 47 characters"):
        engine.add_step("f" * 46, "a")
    assert queues(engine) == [] and registry(engine) == {}


def test_explicit_mode_requires_queue_name(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error, match="queue_name is required"):
        engine.add_step("f", "a")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Classify", 'not canonical.*|.*write "classify"'),
        ("a__b", "invalid queue name"),
        ("q" * 48, "invalid queue name"),
        ("trailing_", "invalid queue name"),
        ("1abc", "invalid queue name"),
        ("has-dash", "invalid queue name"),
        ("", "invalid queue name"),
    ],
)
def test_explicit_queue_names_validated(engine: Engine, name: str, message: str) -> None:
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error, match=message):
        engine.add_step("f", "a", queue_name=name)
    assert queues(engine) == [] and registry(engine) == {}


def test_non_canonical_name_gets_hint(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error) as info:
        engine.add_step("f", "a", queue_name="Classify")
    assert info.value.diag.message_hint == 'queue names are lowercase: write "classify"'


def test_explicit_queue_shared_by_flows_and_steps(engine: Engine) -> None:
    explicit(engine, "f", {"a": "shared_q", "b": "shared_q"}, {"b": ["a"]})
    explicit(engine, "g", {"a": "shared_q", "c": "other_q"})
    assert registry(engine) == {"shared_q": ("shared", None), "other_q": ("shared", None)}
    assert queues(engine) == ["other_q", "shared_q"]


@pytest.mark.parametrize("second_mode", ["flow", "explicit", "per-step"])
def test_owned_queue_refused_to_other_flows(engine: Engine, second_mode: str) -> None:
    engine.define("owner", [("a", [], {})])
    engine.create_flow("intruder", queue_mode=second_mode)
    with pytest.raises(
        psycopg.Error, match=r'queue "owner" is owned by flow "owner"|routes this step'
    ):
        engine.add_step("intruder", "a", queue_name="owner")
    assert registry(engine) == {"owner": ("owned", "owner")}


def test_owned_queue_cannot_be_declared_shared_by_its_owner(engine: Engine) -> None:
    engine.define("orders", [("a", [], {})])
    engine.conn.execute("select flowlane.delete_flow_and_data('orders')")
    # the registry keeps the ownership; recreated with explicit routing, the
    # flow may not turn its owned queue into a shared one
    engine.create_flow("orders", queue_mode="explicit")
    with pytest.raises(psycopg.Error, match='queue "orders" is owned but flow "orders"'):
        engine.add_step("orders", "a", queue_name="orders")
    assert registry(engine) == {"orders": ("owned", "orders")}


def test_shared_queue_cannot_become_a_flow_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "billing"})
    engine.create_flow("billing")
    with pytest.raises(psycopg.Error, match='queue "billing" is shared but flow "billing"'):
        engine.add_step("billing", "a")


def test_unregistered_pgmq_queue_is_not_taken_over(engine: Engine) -> None:
    engine.conn.execute("select pgmq.create('legacy')")
    engine.create_flow("f", queue_mode="explicit")
    with pytest.raises(psycopg.Error, match="not registered with flowlane"):
        engine.add_step("f", "a", queue_name="legacy")
    assert registry(engine) == {}


def test_create_flow_queue_mode_is_shape(engine: Engine) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.Error, match="exists with queue_mode flow, not per-step"):
        engine.create_flow("f", queue_mode="per-step")
    with pytest.raises(psycopg.Error, match="queue_mode must be"):
        engine.create_flow("g", queue_mode="step")


def test_add_step_changed_queue_is_a_shape_mismatch(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1"})
    assert engine.add_step("f", "a", queue_name="q1", timeout=9)["opt_timeout"] == 9
    with pytest.raises(
        psycopg.Error, match='step "a" of flow "f" already exists with a different queue_name'
    ):
        engine.add_step("f", "a", queue_name="q2")
    assert "q2" not in registry(engine)


def test_add_step_reprovisions_a_lost_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1"})
    engine.conn.execute("select pgmq.drop_queue('q1')")
    engine.add_step("f", "a", queue_name="q1")
    assert queues(engine) == ["q1"]


# -- task creation and claiming -------------------------------------------------


def test_start_ready_steps_groups_by_queue_and_snapshots(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "b": "q1", "m": "q2", "c": "q2"}, {"c": ["a", "b", "m"]})
    engine.conn.execute("update flowlane.steps set step_type = 'map' where step_slug = 'm'")
    before = queues(engine)
    run_id = engine.start("f", [1, 2, 3])
    assert queues(engine) == before
    tasks = engine.tasks(run_id)
    assert [(t["step_slug"], t["task_index"], t["queue_name"]) for t in tasks] == [
        ("a", 0, "q1"),
        ("b", 0, "q1"),
        ("m", 0, "q2"),
        ("m", 1, "q2"),
        ("m", 2, "q2"),
    ]
    on_q1 = {m["msg_id"]: m["message"] for m in engine.queue_messages("q1")}
    on_q2 = {m["msg_id"]: m["message"] for m in engine.queue_messages("q2")}
    for t in tasks:
        body = (on_q1 if t["queue_name"] == "q1" else on_q2)[t["message_id"]]
        assert (body["step_slug"], body["task_index"]) == (t["step_slug"], t["task_index"])
    assert len(on_q1) == 2 and len(on_q2) == 3


@pytest.mark.no_invariants  # the queue/message is removed on purpose
def test_start_ready_steps_performs_no_queue_ddl(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1"})
    engine.conn.execute("select pgmq.drop_queue('q1')")
    with pytest.raises(psycopg.Error):
        engine.start("f", {})
    assert queues(engine) == []
    assert engine.scalar("select count(*) from flowlane.runs") == 0


def test_start_tasks_takes_queue_and_returns_tasks_of_several_flows(engine: Engine) -> None:
    explicit(engine, "f", {"a": "work"})
    explicit(engine, "g", {"x": "work", "y": "other"})
    f_run = engine.start("f", {"from": "f"})
    g_run = engine.start("g", {"from": "g"})
    claimed = engine.claim("work")
    assert sorted((t["flow_slug"], t["step_slug"], t["queue_name"]) for t in claimed) == [
        ("f", "a", "work"),
        ("g", "x", "work"),
    ]
    assert {t["run_id"] for t in claimed} == {f_run, g_run}
    [y] = engine.claim("other")
    assert (y["flow_slug"], y["queue_name"], y["input"]) == ("g", "other", {"from": "g"})


def test_same_message_id_on_two_queues_claims_only_the_right_task(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "b": "q2"})
    run_id = engine.start("f", {})
    ids = {t["step_slug"]: t["message_id"] for t in engine.tasks(run_id)}
    assert ids["a"] == ids["b"]
    [task] = engine.start_tasks("q2", [ids["b"]])
    assert task["step_slug"] == "b"
    assert engine.task(run_id, "a")["status"] == "queued"


def test_claim_visibility_set_on_task_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "b": "q2"}, timeout=60)
    engine.conn.execute("update flowlane.steps set opt_timeout = 10 where step_slug = 'b'")
    engine.start("f", {})
    [a] = engine.claim("q1")
    [b] = engine.claim("q2")
    assert 60 < engine.vt_in("q1", a["msg_id"]) <= 62
    assert 10 < engine.vt_in("q2", b["msg_id"]) <= 12


@pytest.mark.parametrize("qty", [1, 2])  # one message at a time (its own path), both at once
def test_a_workers_claim_keeps_the_longest_lease_of_its_pairs(engine: Engine, qty: int) -> None:
    # claim_tasks reads with the longest lease of the pairs the worker serves: a task of a step
    # with a shorter one keeps it (start_tasks, whose caller read the message, sets the task's own)
    explicit(engine, "f", {"slow": "q", "quick": "q"}, timeout=60)
    engine.conn.execute("update flowlane.steps set opt_timeout = 10 where step_slug = 'quick'")
    engine.start("f", {})
    claim = "select * from flowlane.claim_tasks('q', %s, %s, %s::jsonb) where outcome = 'claimed'"
    claimed = [row for _ in range(2 // qty)
               for row in engine.rows(claim, (qty, engine.worker_id, '[["f", "slow"], ["f", "quick"]]'))]
    assert sorted(c["step_slug"] for c in claimed) == ["quick", "slow"]
    assert all(60 < engine.vt_in("q", c["msg_id"]) <= 62 for c in claimed)


# -- every PGMQ operation on the task's own queue --------------------------------


def test_completion_archives_on_task_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "b": "q2"}, {"b": ["a"]})
    run_id = engine.start("f", {})
    [a] = engine.claim("q1")
    engine.complete(a, 1)
    assert engine.archived_ids("q1") == [a["msg_id"]] and engine.archived_ids("q2") == []
    [b] = engine.claim("q2")
    engine.complete(b, 2)
    assert engine.archived_ids("q2") == [b["msg_id"]]
    assert engine.queue_messages("q1") == [] == engine.queue_messages("q2")
    assert engine.run(run_id)["output"] == {"b": 2}


def test_retry_delay_on_task_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "b": "q2"}, base_delay=3)
    engine.start("f", {})
    [a] = engine.claim("q1")
    [b] = engine.claim("q2")
    engine.fail(b)
    assert 4 < engine.vt_in("q2", b["msg_id"]) <= 6
    assert engine.vt_in("q1", a["msg_id"]) > 60  # untouched claim lease on the other queue


def test_run_failure_archives_on_every_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "m": "q2", "c": "q3"}, max_attempts=1)
    engine.conn.execute("update flowlane.steps set step_type = 'map' where step_slug = 'm'")
    run_id = engine.start("f", [1, 2, 3])
    [a] = engine.claim("q1")
    engine.claim("q2", qty=1)
    engine.fail(a)
    assert engine.run(run_id)["status"] == "failed"
    for q in ("q1", "q2", "q3"):
        assert engine.queue_messages(q) == [], q
    assert len(engine.archived_ids("q2")) == 3 and len(engine.archived_ids("q3")) == 1
    assert sorted({t["status"] for t in engine.tasks(run_id)}) == ["cancelled", "failed"]


def test_condition_fail_archives_on_every_queue(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit")
    engine.add_step("f", "a", queue_name="q1")
    engine.add_step("f", "side", queue_name="q2")
    engine.add_step(
        "f", "b", ["a"], queue_name="q3", required_input_pattern={"a": 1}, when_unmet="fail"
    )
    run_id = engine.start("f", {})
    [a] = engine.claim("q1")
    engine.complete(a, 2)
    assert engine.run(run_id)["status"] == "failed"
    assert engine.queue_messages("q2") == [] and len(engine.archived_ids("q2")) == 1


def test_skip_cascade_archives_every_queue_group(engine: Engine) -> None:
    """A force-skip across several queues archives all of them."""
    engine.create_flow("f", queue_mode="explicit", max_attempts=1)
    engine.add_step("f", "root", queue_name="q1", when_exhausted="skip-cascade")
    engine.add_step("f", "m", queue_name="q2", step_type="map")
    engine.add_step("f", "n", queue_name="q3")
    engine.add_step("f", "tail", ["root", "m", "n"], queue_name="q1")
    run_id = engine.start("f", [1, 2])
    # a skip-cascade from root reaches only root and tail; m and n keep running
    [root] = engine.claim("q1")
    engine.fail(root)
    assert engine.statuses(run_id) == {
        "root": "skipped",
        "m": "started",
        "n": "started",
        "tail": "skipped",
    }
    assert len(engine.queue_messages("q2")) == 2 and len(engine.queue_messages("q3")) == 1


def test_skip_step_archives_siblings_on_its_queue(engine: Engine) -> None:
    engine.create_flow("f", queue_mode="explicit", max_attempts=1)
    engine.add_step("f", "m", queue_name="q2", step_type="map", when_exhausted="skip-cascade")
    engine.add_step("f", "n", ["m"], queue_name="q3", step_type="map")
    engine.add_step("f", "other", queue_name="q1")
    run_id = engine.start("f", [1, 2, 3])
    first = engine.claim("q2", qty=1)
    engine.fail(first[0])
    assert engine.queue_messages("q2") == []
    assert sorted(engine.archived_ids("q2")) == sorted(
        t["message_id"] for t in engine.tasks(run_id, "m")
    )
    assert len(engine.queue_messages("q1")) == 1
    assert engine.statuses(run_id)["n"] == "skipped"


def test_late_callback_archives_on_task_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "q1", "b": "q2"})
    run_id = engine.start("f", {})
    [b] = engine.claim("q2")
    engine.complete(b, "done")
    # put the archived message back (as if archiving had been lost) and replay the callback
    engine.conn.execute(
        "insert into pgmq.q_q2 (msg_id, vt, message) overriding system value "
        "select msg_id, vt, message from pgmq.a_q2"
    )
    engine.conn.execute("delete from pgmq.a_q2")
    row = engine.complete(b, "again")
    assert row is not None and row["output"] == "done"
    assert engine.queue_messages("q2") == [] and engine.archived_ids("q2") == [b["msg_id"]]
    assert len(engine.queue_messages("q1")) == 1
    assert engine.task(run_id, "a")["status"] == "queued"


# -- stalled recovery with effective timeouts ----------------------------------


def stalled_setup(engine: Engine, step_timeout: int | None) -> tuple[Any, dict[str, Any]]:
    engine.create_flow("f", queue_mode="explicit", timeout=60)
    engine.add_step("f", "fast", queue_name="q_fast", timeout=step_timeout)
    engine.add_step("f", "other", queue_name="q_other")
    run_id = engine.start("f", {})
    [task] = engine.claim("q_fast")
    engine.claim("q_other")
    return run_id, task


def test_stalled_step_timeout_shorter_than_flow_timeout(engine: Engine) -> None:
    run_id, task = stalled_setup(engine, step_timeout=5)
    engine.backdate(run_id, "fast", 34)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 0
    engine.backdate(run_id, "fast", 36)  # > 5 + 30, far below the flow's 60 + 30
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    assert engine.task(run_id, "fast")["status"] == "queued"
    assert engine.vt_in("q_fast", task["msg_id"]) <= 0
    assert engine.task(run_id, "other")["status"] == "started"


def test_stalled_step_timeout_longer_than_flow_timeout(engine: Engine) -> None:
    run_id, task = stalled_setup(engine, step_timeout=300)
    engine.backdate(run_id, "fast", 100)  # stalled by the flow timeout, not by the step's
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 0
    assert engine.task(run_id, "fast")["status"] == "started"
    engine.backdate(run_id, "fast", 331)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    assert engine.vt_in("q_fast", task["msg_id"]) <= 0


def test_stalled_null_step_timeout_falls_back_to_flow(engine: Engine) -> None:
    run_id, task = stalled_setup(engine, step_timeout=None)
    engine.backdate(run_id, "fast", 89)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 0
    engine.backdate(run_id, "fast", 91)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    assert engine.vt_in("q_fast", task["msg_id"]) <= 0


def test_stalled_reset_lands_on_the_task_queue(engine: Engine) -> None:
    run_id, task = stalled_setup(engine, step_timeout=5)
    other = engine.task(run_id, "other")
    lease_before = engine.vt_in("q_other", other["message_id"])
    # same message id on both queues: only the stalled task's queue is reset
    assert other["message_id"] == task["msg_id"]
    engine.backdate(run_id, "fast", 40)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    assert engine.vt_in("q_fast", task["msg_id"]) <= 0
    assert engine.vt_in("q_other", other["message_id"]) == pytest.approx(lease_before, abs=1)
    [again] = engine.claim("q_fast")
    assert (again["step_slug"], again["queue_name"], again["attempt"]) == ("fast", "q_fast", 2)


def test_stall_exhaustion_archives_on_task_queue(engine: Engine) -> None:
    run_id, task = stalled_setup(engine, step_timeout=5)
    engine.conn.execute(
        "update flowlane.steps set opt_max_attempts = 1 where step_slug = 'fast'"
    )
    engine.backdate(run_id, "fast", 40)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    assert engine.task(run_id, "fast")["status"] == "failed"
    assert engine.archived_ids("q_fast") == [task["msg_id"]]
    # the run failed: its other task is cancelled and archived on its own queue
    assert engine.archived_ids("q_other") == [engine.task(run_id, "other")["message_id"]]


# -- deletion --------------------------------------------------------------------------


def test_delete_flow_leaves_other_flows_messages_on_shared_queue(engine: Engine) -> None:
    explicit(engine, "f", {"a": "shared_q", "b": "f_only"}, {"b": ["a"]})
    explicit(engine, "g", {"x": "shared_q"})
    for _ in range(3):
        engine.start("f", {})
        engine.start("g", {})
    claimed = engine.claim("shared_q", qty=2)  # some started, some queued
    g_ids = sorted(
        t["message_id"]
        for t in engine.rows("select message_id from flowlane.step_tasks where flow_slug = 'g'")
    )
    before = engine.queue_messages("shared_q")
    assert len(before) == 6
    engine.conn.execute("select flowlane.delete_flow_and_data('f')")
    after = engine.queue_messages("shared_q")
    assert [m["msg_id"] for m in after] == g_ids
    assert [(m["msg_id"], m["vt"], m["read_ct"]) for m in after] == [
        (m["msg_id"], m["vt"], m["read_ct"]) for m in before if m["msg_id"] in g_ids
    ]
    assert queues(engine) == ["f_only", "shared_q"]
    assert set(registry(engine)) == {"shared_q", "f_only"}
    assert engine.scalar("select count(*) from flowlane.step_tasks where flow_slug = 'f'") == 0
    assert engine.scalar("select count(*) from flowlane.flows") == 1
    # g still runs to completion on the shared queue
    for task in claimed:
        engine.complete(task, "late")  # f's callbacks find nothing; g's complete
    engine.drive("shared_q", lambda t: "ok")
    assert engine.scalar("select count(*) from flowlane.runs where status = 'completed'") == 3


def test_delete_flow_never_drops_its_own_queue(engine: Engine) -> None:
    engine.define("orders", [("a", [], {})])
    engine.start("orders", {})
    engine.conn.execute("select flowlane.delete_flow_and_data('orders')")
    assert queues(engine) == ["orders"]
    assert engine.queue_messages("orders") == []
    assert len(engine.archived_ids("orders")) == 1
    # the same slug can be created again and reuses its queue
    engine.define("orders", [("a", [], {})])
    engine.start("orders", {})
    assert len(engine.claim("orders")) == 1
