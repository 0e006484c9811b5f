"""0005: claiming with supported pairs, coverage, drain status, deployments, adoption, rollouts."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

JOBS = "jobs"


def _shared(engine: Engine) -> None:
    """Two flows on one explicit queue ``jobs``; ``a`` also routes ``two`` to ``side``."""
    engine.define("a", [("one", [], {"queue_name": JOBS}), ("two", ["one"], {"queue_name": "side"})],
                  queue_mode="explicit")
    engine.define("b", [("only", [], {"queue_name": JOBS})], queue_mode="explicit")


def _attempts(engine: Engine) -> list[int]:
    return [r[0] for r in engine.conn.execute(
        "select attempts_count from flowlane.step_tasks order by flow_slug, step_slug")]


# -- start_tasks: classification -------------------------------------------------


def test_queued_tasks_of_supported_pairs_are_claimed_from_several_flows(engine: Engine) -> None:
    _shared(engine)
    engine.start("a", {})
    engine.start("b", {})
    rows = engine.classify(JOBS, engine.read(JOBS), [("a", "one"), ("b", "only")])
    assert sorted((r["outcome"], r["flow_slug"], r["step_slug"], r["attempt"]) for r in rows) == [
        ("claimed", "a", "one", 1), ("claimed", "b", "only", 1)]
    assert all(r["queue_name"] == JOBS for r in rows)


def test_one_unsupported_pair_hands_the_whole_batch_back_untouched(engine: Engine) -> None:
    _shared(engine)
    engine.start("a", {})
    engine.start("b", {})
    batch = engine.read(JOBS, vt=300)
    assert len(batch) == 2
    rows = engine.classify(JOBS, batch, [("b", "only")])
    [refused] = rows
    assert (refused["outcome"], refused["flow_slug"], refused["step_slug"]) == ("unsupported", "a", "one")
    assert refused["input"] is None and refused["flow_input"] is None  # never a body
    assert _attempts(engine) == [0, 0]
    assert engine.scalar("select count(*) from flowlane.step_tasks where status <> 'queued'") == 0
    assert all(m["vt_in"] <= 0 for m in engine.queue_messages(JOBS))  # visible again, both


def test_pairs_are_exact_flow_and_step_not_flows(engine: Engine) -> None:
    engine.define("c", [("x", [], {"queue_name": JOBS}), ("y", ["x"], {"queue_name": JOBS})],
                  queue_mode="explicit")
    run = engine.start("c", {})
    [x] = engine.classify(JOBS, engine.read(JOBS), [("c", "x")])
    engine.complete(x, 1)
    [refused] = engine.classify(JOBS, engine.read(JOBS), [("c", "x")])
    assert (refused["outcome"], refused["step_slug"]) == ("unsupported", "y")
    assert engine.task(run, "y")["attempts_count"] == 0
    [y] = engine.classify(JOBS, engine.read(JOBS), [("c", "x"), ("c", "y")])
    assert y["outcome"] == "claimed"
    engine.complete(y, 2)


def test_foreign_message_is_unsupported_and_left_on_the_queue(engine: Engine) -> None:
    _shared(engine)
    [foreign] = [r[0] for r in engine.conn.execute("select * from pgmq.send('jobs', '{}'::jsonb)")]
    engine.start("b", {})
    rows = engine.classify(JOBS, engine.read(JOBS), [("a", "one"), ("b", "only")])
    assert [(r["outcome"], r["msg_id"], r["flow_slug"]) for r in rows] == [
        ("unsupported", foreign, None)]
    assert _attempts(engine) == [0]
    assert foreign in [m["msg_id"] for m in engine.queue_messages(JOBS)]
    engine.conn.execute("select pgmq.delete('jobs', %s::bigint)", (foreign,))  # tidy for invariants


def test_visible_started_task_costs_no_attempt_and_hides_until_stall_recovery(engine: Engine) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run = engine.start("f", {})
    [task] = engine.claim("f")
    engine.make_visible("f")  # its lease ran out while the handler still runs
    assert engine.claim("f", worker_id=uuid.uuid4()) == []
    row = engine.task(run, "a")
    assert (row["attempts_count"], row["last_worker_id"]) == (1, engine.worker_id)
    # hidden until the stall threshold (timeout + 30 s after the claim), not re-read in a loop
    assert 30 < engine.vt_in("f", task["msg_id"]) <= 40
    engine.complete(task, "done")


def test_visible_duplicate_of_an_extended_lease_hides_until_the_renewed_deadline(
    engine: Engine,
) -> None:
    engine.define("f", [("a", [], {"timeout": 10})])
    run = engine.start("f", {})
    [task] = engine.claim("f")
    engine.backdate(run, "a", 25)  # claimed 25 s ago, its lease extended just now
    item = {"run_id": str(run), "step_slug": "a", "task_index": 0, "attempt": 1, "running": False}
    assert engine.scalar("select flowlane.extend_leases(%s, %s)", (engine.worker_id, Jsonb([item]))) == 1
    engine.make_visible("f")
    assert engine.claim("f", worker_id=uuid.uuid4()) == []
    assert 35 < engine.vt_in("f", task["msg_id"]) <= 41  # renewal + timeout + 30 s
    engine.complete(task, "done")


def test_terminal_task_message_is_archived_and_nothing_changes(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run = engine.start("f", {})
    [task] = engine.claim("f")
    engine.complete(task, 1)
    # the message comes back (say, a restore of the queue table): it is archived again
    engine.conn.execute(
        "insert into pgmq.q_f (msg_id, read_ct, enqueued_at, vt, message, headers) "
        "overriding system value select msg_id, read_ct, enqueued_at, now(), message, headers "
        "from pgmq.a_f where msg_id = %s",
        (task["msg_id"],),
    )
    engine.conn.execute("delete from pgmq.a_f where msg_id = %s", (task["msg_id"],))
    assert engine.classify("f", [task["msg_id"]], [("f", "a")]) == []
    assert engine.queue_messages("f") == [] and engine.archived_ids("f") == [task["msg_id"]]
    assert engine.task(run, "a")["status"] == "completed" and engine.run(run)["status"] == "completed"


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (None, "supported_pairs must be a JSON array"),
        ({"a": "one"}, "supported_pairs must be a JSON array"),
        (["a.one"], "item 0 must be a pair of slugs"),
        ([["a"]], "item 0 must be a pair of slugs"),
        ([["a", "one"], ["a", 1]], "item 1 must be a pair of slugs"),
        ([["a", "bad slug"]], "item 0 must be a pair of slugs"),
        ([["a", "one", "one"]], "item 0 must be a pair of slugs"),  # a defined step, and more
        ([["a", "one"], ["run", "one"]], "item 1 must be a pair of slugs"),  # not defined, not a slug
    ],
)
def test_bad_supported_pairs_are_refused_before_anything_changes(
    engine: Engine, pairs: object, message: str
) -> None:
    _shared(engine)
    engine.start("a", {})
    batch = engine.read(JOBS, vt=300)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        engine.rows("select * from flowlane.start_tasks('jobs', %s, %s, %s)",
                    (batch, uuid.uuid4(), None if pairs is None else Jsonb(pairs)))
    assert _attempts(engine) == [0]
    assert all(m["vt_in"] > 200 for m in engine.queue_messages(JOBS))


@pytest.mark.parametrize(
    ("queue", "msg_ids", "worker", "message"),
    [
        ("Jobs", [1], True, "invalid queue name 'Jobs'"),
        (None, [1], True, "invalid queue name NULL"),
        ("jobs", None, True, "msg_ids must be an array"),
        ("jobs", [1, None], True, "msg_ids must be an array"),
        ("jobs", [1], False, "worker_id is required"),
    ],
)
def test_bad_claim_arguments_are_clear_errors(
    engine: Engine, queue: str | None, msg_ids: list[int | None] | None, worker: bool, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        engine.rows("select * from flowlane.start_tasks(%s, %s::bigint[], %s, '[]')",
                    (queue, msg_ids, uuid.uuid4() if worker else None))


# -- coverage and drain ----------------------------------------------------------


def _coverage(engine: Engine, queue: str, pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    rows = engine.rows("select * from flowlane.coverage(%s, %s)", (queue, Jsonb([list(p) for p in pairs])))
    return {f"{r['flow_slug']}.{r['step_slug']}": r["sources"] for r in rows}


def test_coverage_active_versions_and_plain_flows(engine: Engine) -> None:
    _shared(engine)
    assert _coverage(engine, JOBS, []) == {"a.one": ["active version"], "b.only": ["active version"]}
    assert _coverage(engine, JOBS, [("a", "one"), ("b", "only")]) == {}
    assert _coverage(engine, "side", [("a", "one")]) == {"a.two": ["active version"]}


def test_coverage_draining_version_only_while_runs_can_reach_the_queue(engine: Engine) -> None:
    for version in ("v1", "v2"):
        engine.define(version, [("pre", [], {"queue_name": "pre"}), ("a", ["pre"], {"queue_name": JOBS})],
                      queue_mode="explicit")
    engine.conn.execute("select flowlane.set_alias('app', 'v2', array['v1'])")
    served = [("v2", "a")]
    assert _coverage(engine, JOBS, served) == {}  # a draining version without runs needs nothing
    run = engine.start("v1", {})
    assert _coverage(engine, JOBS, served) == {"v1.a": ["started run"]}  # v1.a not yet queued
    [pre] = engine.claim("pre")
    engine.complete(pre, 1)
    assert _coverage(engine, JOBS, served) == {"v1.a": ["started run", "task on the queue"]}
    rows = engine.rows("select * from flowlane.drain_status()")
    assert [(r["alias"], r["flow_slug"], r["started_runs"], r["active_tasks"], r["drained"])
            for r in rows] == [("app", "v1", 1, 1, False)]
    [a] = engine.classify(JOBS, engine.read(JOBS), [("v1", "a")])
    engine.complete(a, 2)
    assert engine.run(run)["status"] == "completed"
    assert _coverage(engine, JOBS, served) == {}
    assert engine.scalar("select drained from flowlane.drain_status()") is True


# -- deployments -----------------------------------------------------------------


def _register(engine: Engine, deployment: str, queue: str = JOBS,
              pairs: list[list[str]] | None = None) -> uuid.UUID:
    worker = uuid.uuid4()
    engine.rows("select * from flowlane.register_worker(%s, %s, 'w', %s, %s)",
                (worker, queue, deployment, Jsonb(pairs or [["b", "only"]])))
    return worker


def test_disabled_deployment_refuses_registration_until_enabled(engine: Engine) -> None:
    _shared(engine)
    _register(engine, "jobs_worker")
    row = engine.row("select * from flowlane.set_deployment_enabled('jobs_worker', false, 'bad batch')")
    assert row is not None and (row["enabled"], row["reason"]) == (False, "bad batch")
    disabled = 'FLOWLANE_DEPLOYMENT_DISABLED: worker deployment "jobs_worker" is disabled: bad batch'
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=disabled):
        _register(engine, "jobs_worker")
    engine.rows("select * from flowlane.set_deployment_enabled('jobs_worker', true)")
    worker = _register(engine, "jobs_worker")
    assert engine.scalar("select supported_pairs from flowlane.workers where worker_id = %s",
                         (worker,)) == [["b", "only"]]


def test_deployment_serves_one_queue_and_unknown_names_are_errors(engine: Engine) -> None:
    _shared(engine)
    _register(engine, "d1")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='serves queue "jobs", not "side"'):
        _register(engine, "d1", queue="side")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid deployment name"):
        _register(engine, "-bad")
    with pytest.raises(psycopg.errors.NoDataFound, match="unknown worker deployment 'nope'") as info:
        engine.rows("select * from flowlane.set_deployment_enabled('nope', false)")
    assert info.value.diag.message_hint is not None and "known: d1" in info.value.diag.message_hint


def test_a_refusal_is_kept_per_deployment_until_a_worker_registers_on_the_queue(
        engine: Engine) -> None:
    _shared(engine)
    refuse = "select * from flowlane.record_worker_refusal(%s, %s, %s, %s)"
    engine.rows(refuse, (JOBS, "a", "flows missing from the database: x", "apply"))
    engine.rows(refuse, (JOBS, "a", "a coverage gap", None))  # the latest one is kept
    engine.rows(refuse, (JOBS, "b", "flows missing from the database: y", None))
    engine.rows(refuse, ("not_registered_yet", "c", "flows missing from the database: z", None))
    rows = engine.rows("select queue_name, deployment_name, reason, hint "
                       "from flowlane.worker_refusals order by 1, 2")
    assert [tuple(r.values()) for r in rows] == [
        (JOBS, "a", "a coverage gap", None), (JOBS, "b", "flows missing from the database: y", None),
        ("not_registered_yet", "c", "flows missing from the database: z", None)]
    definitions = "select count(*) from flowlane.flows"  # a runtime record, not a definition
    before = engine.scalar(definitions)
    _register(engine, "a")
    assert engine.scalar("select array_agg(queue_name) from flowlane.worker_refusals") == [
        "not_registered_yet"]
    assert engine.scalar(definitions) == before


@pytest.mark.parametrize(("args", "message"), [
    (("Bad Queue", "a", "why"), "queue"),
    ((JOBS, "-bad", "why"), "invalid deployment name"),
    ((JOBS, "a", " "), "a reason is required"),
    ((JOBS, "a", None), "a reason is required"),
])
def test_bad_refusals_are_clear_errors(engine: Engine, args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        engine.rows("select * from flowlane.record_worker_refusal(%s, %s, %s)", args)


# -- adoption --------------------------------------------------------------------


def test_adopting_an_empty_queue_records_pgmq_spelling_and_shared_ownership(engine: Engine) -> None:
    engine.conn.execute("select pgmq.create('Legacy_Jobs')")
    row = engine.row("select * from flowlane.adopt_queue('legacy_jobs')")
    assert row is not None
    assert (row["queue_name"], row["ownership"], row["pgmq_queue_name"]) == (
        "legacy_jobs", "shared", "Legacy_Jobs")
    assert row["adopted_at"] is not None
    # explicit routes may now use it, and adopting again changes nothing
    engine.define("f", [("a", [], {"queue_name": "legacy_jobs"})], queue_mode="explicit")
    again = engine.row("select * from flowlane.adopt_queue('legacy_jobs')")
    assert again == row
    engine.start("f", {})
    [task] = engine.claim("legacy_jobs")
    engine.complete(task, 1)


def test_adopting_a_queue_whose_messages_are_all_tracked(engine: Engine) -> None:
    engine.define("f", [("a", [], {"queue_name": "tracked"})], queue_mode="explicit")
    engine.start("f", {})
    # the registry row is lost (say, a partial restore); the queue's message is a task's
    with engine.conn.transaction():
        engine.conn.execute("set local session_replication_role = replica")
        engine.conn.execute("delete from flowlane.queues where queue_name = 'tracked'")
    row = engine.row("select * from flowlane.adopt_queue('tracked')")
    assert row is not None and row["ownership"] == "shared"
    [task] = engine.claim("tracked")
    engine.complete(task, 1)


def test_adoption_is_refused_while_a_foreign_message_is_on_the_queue(engine: Engine) -> None:
    engine.conn.execute("select pgmq.create('legacy')")
    engine.conn.execute("""select pgmq.send('legacy', '{"job": 1}'::jsonb)""")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                       match='holds 1 message\\(s\\) that no flowlane task tracks'):
        engine.rows("select * from flowlane.adopt_queue('legacy')")
    assert engine.scalar("select count(*) from flowlane.queues where queue_name = 'legacy'") == 0
    with pytest.raises(psycopg.errors.InsufficientPrivilege,
                       match="adopt it with `flowlane queue adopt legacy`"):
        engine.define("f", [("a", [], {"queue_name": "legacy"})], queue_mode="explicit")
    engine.conn.execute("select pgmq.purge_queue('legacy')")


def test_owned_and_missing_queues_cannot_be_adopted(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match='owned by flow "f"'):
        engine.rows("select * from flowlane.adopt_queue('f')")
    with pytest.raises(psycopg.errors.NoDataFound, match='no PGMQ queue named "ghost"'):
        engine.rows("select * from flowlane.adopt_queue('ghost')")


# -- rollouts --------------------------------------------------------------------


def test_rollout_disables_deprecates_and_reenables_only_what_was_enabled(engine: Engine) -> None:
    _shared(engine)
    live = _register(engine, "d_on")
    _register(engine, "d_off")
    engine.rows("select * from flowlane.set_deployment_enabled('d_off', false, 'maintenance')")
    first = engine.row("select * from flowlane.begin_rollout(array['d_on', 'd_off'])")
    assert first is not None and first["previously_enabled"] == ["d_on"]
    assert engine.scalar("select flowlane.heartbeat(%s)", (live,)) is True  # told to stop
    assert engine.scalar("select bool_or(enabled) from flowlane.worker_deployments") is False
    # interrupted, run again: the same record, nothing re-enabled early
    again = engine.row("select * from flowlane.begin_rollout(array['d_off', 'd_on'])")
    assert again is not None and again["rollout_id"] == first["rollout_id"]
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="is unfinished"):
        engine.rows("select * from flowlane.begin_rollout(array['d_on'])")
    engine.rows("select * from flowlane.finish_rollout(%s)", (first["rollout_id"],))
    states = dict(engine.conn.execute(
        "select deployment_name, enabled from flowlane.worker_deployments").fetchall())
    assert states == {"d_on": True, "d_off": False}
    assert engine.scalar(
        "select reason from flowlane.worker_deployments where deployment_name = 'd_off'"
    ) == "maintenance"
