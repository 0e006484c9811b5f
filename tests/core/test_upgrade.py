"""Upgrades of the original core (0001, 0002) to this release: backfills, runs in flight, and
the original core's preflight of message ids; and a call of the previous release's workers in
flight while the pending migration commits."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane import errors
from flowlane.core import migrator
from tests.core.engine import Engine, assert_invariants
from tests.release_support import previous_release

pytestmark = pytest.mark.slow

REPAIR_DOC = Path(__file__).resolve().parents[2] / "docs" / "upgrade-repair.md"


def populate_0001(engine: Engine) -> dict[str, Any]:
    """Flows and runs in every state on a database of the original core (0001 or 0002)."""
    by_flow = engine.scalar("select to_regclass('flowlane.queues') is null")  # 0001 claims by flow
    flow_slug = "Orders" if by_flow else None
    engine.define(
        "Orders",
        [("fetch", [], {}), ("items", ["fetch"], {"step_type": "map"}), ("total", ["items"], {})],
    )
    engine.define("mail", [("send", [], {"max_attempts": 1})])
    runs: dict[str, Any] = {}
    # completed run
    runs["done"] = engine.start("Orders", {"n": 0})
    engine.drive(
        "orders", lambda t: [1, 2] if t["step_slug"] == "fetch" else t["input"], flow_slug=flow_slug
    )
    # failed run
    runs["failed"] = engine.start("mail", {})
    [send] = engine.claim("mail")
    engine.fail(send)
    # active runs: one mid-map with a started task, one untouched
    runs["active"] = engine.start("Orders", {"n": 1})
    [fetch] = engine.claim("orders", flow_slug=flow_slug)
    engine.complete(fetch, [10, 20, 30])
    items = engine.claim("orders", qty=2, flow_slug=flow_slug)
    engine.complete(items[0], 11)
    runs["started_task"] = items[1]
    runs["fresh"] = engine.start("Orders", {"n": 2})
    runs["mail_active"] = engine.start("mail", {})
    return runs


def snapshot(engine: Engine) -> dict[str, Any]:
    """Catalog and data of schemas flowlane and pgmq, comparable before/after."""
    snap: dict[str, Any] = {}
    snap["relations"] = engine.rows(
        "select n.nspname, c.relname, c.relkind from pg_class c "
        "join pg_namespace n on n.oid = c.relnamespace "
        "where n.nspname in ('flowlane', 'pgmq') order by 1, 2"
    )
    snap["columns"] = engine.rows(
        "select c.relname, a.attname, a.atttypid::regtype::text as type, a.attnotnull "
        "from pg_attribute a "
        "join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace "
        "where n.nspname = 'flowlane' and a.attnum > 0 and not a.attisdropped order by 1, 2"
    )
    snap["constraints"] = engine.rows(
        "select conrelid::regclass::text as rel, conname, pg_get_constraintdef(oid) as def "
        "from pg_constraint where connamespace = 'flowlane'::regnamespace order by 1, 2"
    )
    snap["functions"] = engine.rows(
        "select p.oid::regprocedure::text as sig, md5(p.prosrc) as src from pg_proc p "
        "where p.pronamespace = 'flowlane'::regnamespace order by 1"
    )
    snap["triggers"] = engine.rows(
        "select tgname from pg_trigger t join pg_class c on c.oid = t.tgrelid "
        "where c.relnamespace = 'flowlane'::regnamespace order by 1"
    )
    tables = [r["relname"] for r in snap["relations"] if r["relkind"] == "r"]
    schemas = {r["relname"]: r["nspname"] for r in snap["relations"] if r["relkind"] == "r"}
    for table in tables:
        snap[f"data:{table}"] = engine.scalar(
            f"select md5(coalesce(string_agg(t::text, '|' order by t::text), '')) "
            f'from {schemas[table]}."{table}" t'
        )
    return snap


def test_upgrade_backfills_and_in_flight_runs_complete(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("0001"), autocommit=True) as conn:
        engine = Engine(conn)
        runs = populate_0001(engine)
        counts_before = engine.scalar("select count(*) from flowlane.step_tasks")
        applied = migrator.migrate(conn)
        assert applied[0].version == "0002"

        # backfill: steps, tasks, registry, queue mode
        assert engine.rows(
            "select distinct flow_slug, queue_name from flowlane.steps order by 1"
        ) == [
            {"flow_slug": "Orders", "queue_name": "orders"},
            {"flow_slug": "mail", "queue_name": "mail"},
        ]
        assert engine.scalar("select count(*) from flowlane.step_tasks") == counts_before
        assert (
            engine.scalar(
                "select count(*) from flowlane.step_tasks where queue_name <> lower(flow_slug)"
            )
            == 0
        )
        assert engine.rows(
            "select queue_name, ownership, owner_flow_slug from flowlane.queues order by 1"
        ) == [
            {"queue_name": "mail", "ownership": "owned", "owner_flow_slug": "mail"},
            {"queue_name": "orders", "ownership": "owned", "owner_flow_slug": "Orders"},
        ]
        assert engine.scalar("select array_agg(distinct queue_mode) from flowlane.flows") == [
            "flow"
        ]
        sealed = "select count(*) from flowlane.flows where shape_sealed_at is null"
        assert engine.scalar(sealed) == 0
        # terminal runs untouched
        assert engine.run(runs["done"])["output"] == {"total": {"items": [1, 2]}}
        assert engine.run(runs["failed"])["status"] == "failed"

        # the started task finishes through the new callback path
        engine.complete(runs["started_task"], 21)
        # everything else completes through start_tasks(queue_name, ...)
        engine.drive("orders", lambda t: [5] if t["step_slug"] == "fetch" else t["input"])
        engine.drive("mail", lambda t: "sent")
        assert engine.run(runs["active"])["output"] == {"total": {"items": [11, 21, 30]}}
        assert engine.run(runs["fresh"])["output"] == {"total": {"items": [5]}}
        assert engine.run(runs["mail_active"])["output"] == {"send": "sent"}
        assert engine.queue_messages("orders") == [] and engine.queue_messages("mail") == []
        # new runs and new definitions use the new functions
        engine.define(
            "Orders",
            [
                ("fetch", [], {}),
                ("items", ["fetch"], {"step_type": "map"}),
                ("total", ["items"], {}),
            ],
        )
        assert engine.scalar("select flowlane.get_flow_shape('Orders') ->> 'queue_mode'") == "flow"


def inject_null_message_ids(engine: Engine, runs: dict[str, Any]) -> None:
    engine.conn.execute(
        "update flowlane.step_tasks set message_id = null "
        "where run_id = %s and step_slug = 'fetch'",
        (runs["fresh"],),
    )  # active (queued)
    engine.conn.execute(
        "update flowlane.step_tasks set message_id = null "
        "where run_id = %s and step_slug = 'total'",
        (runs["done"],),
    )  # terminal (completed)


def test_upgrade_preflight_rejects_null_message_ids_and_changes_nothing(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory("0001"), autocommit=True) as conn:
        engine = Engine(conn)
        runs = populate_0001(engine)
        inject_null_message_ids(engine, runs)
        before = snapshot(engine)
        with pytest.raises(errors.MigrationError) as info:
            migrator.migrate(conn)
        error = info.value
        assert "0002_queue_identity.sql failed and was rolled back" in str(error)
        assert "upgrade preflight failed: 2 task(s) have no message_id" in str(error)
        assert error.detail is not None
        assert "completed=1, queued=1" in error.detail
        keys = re.findall(
            r"\(run_id=([0-9a-f-]+), step_slug=(\w+), task_index=(\d+), status=(\w+)\)",
            error.detail,
        )
        assert sorted(keys) == sorted(
            [
                (str(runs["fresh"]), "fetch", "0", "queued"),
                (str(runs["done"]), "total", "0", "completed"),
            ]
        )
        assert error.hint is not None and "docs/upgrade-repair.md" in error.hint
        assert snapshot(engine) == before
        assert engine.scalar("select max(version) from flowlane.schema_migrations") == "0001"


def test_upgrade_preflight_diagnostics_are_bounded(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("0001"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("m", [], {"step_type": "map"})])
        engine.start("f", list(range(40)))
        engine.conn.execute("update flowlane.step_tasks set message_id = null")
        with pytest.raises(errors.MigrationError) as info:
            migrator.migrate(conn)
        assert "40 task(s)" in str(info.value)
        assert info.value.detail is not None and info.value.detail.count("run_id=") == 5
        assert "queued=40" in info.value.detail


def repair_sql() -> str:
    text = REPAIR_DOC.read_text(encoding="utf-8")
    match = re.search(r"```sql\n(-- flowlane upgrade repair.*?)```", text, re.DOTALL)
    assert match, "the repair script is missing from docs/upgrade-repair.md"
    return match.group(1)


def test_documented_repair_lets_the_upgrade_pass(db_factory: Callable[..., str]) -> None:
    with psycopg.connect(db_factory("0001"), autocommit=True) as conn:
        engine = Engine(conn)
        runs = populate_0001(engine)
        inject_null_message_ids(engine, runs)
        with conn.transaction():
            conn.execute(repair_sql())
        assert (
            engine.scalar("select count(*) from flowlane.step_tasks where message_id is null") == 0
        )
        migrator.migrate(conn)
        # the repaired active task runs; the repaired terminal one stays terminal
        assert engine.task(runs["done"], "total")["status"] == "completed"
        engine.complete(runs["started_task"], 21)
        engine.drive("orders", lambda t: [7] if t["step_slug"] == "fetch" else t["input"])
        assert engine.run(runs["fresh"])["output"] == {"total": {"items": [7]}}
        assert engine.run(runs["active"])["status"] == "completed"


def test_upgrade_preflight_rejects_duplicate_message_identities(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory("0001"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("m", [], {"step_type": "map"})])
        run_id = engine.start("f", [1, 2, 3])
        conn.execute(
            "update flowlane.step_tasks set message_id = (select min(message_id) "
            "from flowlane.step_tasks) where run_id = %s and task_index = 2",
            (run_id,),
        )
        before = snapshot(engine)
        with pytest.raises(errors.MigrationError, match="referenced by more than one task") as info:
            migrator.migrate(conn)
        assert info.value.detail is not None and "(queue=f, message_id=" in info.value.detail
        assert info.value.hint is not None and "docs/upgrade-repair.md" in info.value.hint
        assert snapshot(engine) == before


def _claimed_long_ago(engine: Engine, run_id: uuid.UUID, seconds: int) -> None:
    """Backdate a task the original core started (it has no lease columns to clear)."""
    engine.conn.execute(
        "update flowlane.step_tasks set started_at = now() - make_interval(secs => %s), "
        "queued_at = now() - make_interval(secs => %s) where run_id = %s", (seconds, seconds, run_id))


def test_runs_in_flight_on_the_original_core_finish_after_the_upgrade(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        runs = populate_0001(engine)
        engine.define("retrying", [("a", [], {"max_attempts": 3})])
        retrying = engine.start("retrying", {})
        [first] = engine.claim("retrying")
        engine.fail(first, "first attempt")
        ended = ("status", "output", "started_at", "completed_at", "failed_at")
        terminal = {key: {c: engine.run(runs[key])[c] for c in ended} for key in ("done", "failed")}
        tasks_before = engine.scalar("select count(*) from flowlane.step_tasks")

        after_the_original_core = [m.version for m in migrator.discover() if m.version > "0002"]
        assert [m.version for m in migrator.migrate(conn)] == after_the_original_core

        assert_invariants(engine)
        assert engine.scalar("select count(*) from flowlane.step_tasks") == tasks_before
        started = engine.scalar("select count(*) from flowlane.step_tasks where status = 'started'")
        assert started == 1  # the started map task
        assert {key: {c: engine.run(runs[key])[c] for c in ended} for key in ("done", "failed")} == terminal
        assert engine.complete(runs["started_task"], 21)["status"] == "completed"
        engine.make_visible("retrying")
        engine.drive("orders", lambda t: [5] if t["step_slug"] == "fetch" else t["input"])
        engine.drive("mail", lambda t: "sent")
        engine.drive("retrying", lambda t: "second attempt")
        assert engine.run(runs["active"])["output"] == {"total": {"items": [11, 21, 30]}}
        assert engine.run(runs["fresh"])["output"] == {"total": {"items": [5]}}
        assert engine.run(runs["mail_active"])["output"] == {"send": "sent"}
        assert engine.run(retrying)["output"] == {"a": "second attempt"}
        assert engine.task(retrying, "a")["attempts_count"] == 2
        assert engine.queue_messages("orders") == engine.queue_messages("mail") == []
        assert_invariants(engine)


def test_the_upgrade_ends_permanently_stalled_tasks_and_converts_notifications(
    db_factory: Callable[..., str],
) -> None:
    # the original core's fourth stall archived the message and left the task started forever
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"timeout": 10}), ("b", ["a"], {})], max_attempts=10)
        engine.conn.execute("select pgmq.enable_notify_insert('f', 0)")
        stuck = engine.start("f", {})
        for _ in range(4):
            engine.claim("f")
            _claimed_long_ago(engine, stuck, 100)
            engine.scalar("select flowlane.requeue_stalled_tasks()")
        row = engine.task(stuck, "a")
        assert row["status"] == "started" and row["permanently_stalled_at"] is not None
        healthy = engine.start("f", {})
        migrator.migrate(conn)
        assert engine.run(stuck)["status"] == "failed"
        assert engine.task(stuck, "a")["error_message"] == (
            "no result within 10 s, 4 attempts (the original core stopped retrying it)")
        assert engine.run(healthy)["status"] == "started"
        assert engine.rows("select * from flowlane.stuck_runs()") == []
        # nothing is lost: the failed run can be retried, and both finish
        assert engine.row("select * from flowlane.retry_run(%s)", (stuck,))["status"] == "started"
        engine.drive("f", lambda t: t["step_slug"])
        assert [engine.run(r)["status"] for r in (stuck, healthy)] == ["completed"] * 2
        assert engine.rows("select * from pgmq.list_notify_insert_throttles()") == []
        assert engine.scalar(
            "select tgname from pg_trigger where tgrelid = 'pgmq.q_f'::regclass"
        ) == "flowlane_notify_insert"


def test_tasks_started_before_the_upgrade_are_leased_fenced_and_recoverable(
    db_factory: Callable[..., str],
) -> None:
    # stalled recovery finds the started tasks through their index: a task claimed before the
    # upgrade must be in it
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"timeout": 10})], max_attempts=3)
        recent_run, stalled_run, fresh_run = (engine.start("f", {"n": n}) for n in range(3))
        claimed = {t["run_id"]: t for t in engine.claim("f")}
        recent, stalled, fresh = claimed[recent_run], claimed[stalled_run], claimed[fresh_run]
        _claimed_long_ago(engine, stalled_run, 100)

        migrator.migrate(conn)

        assert engine.scalar("select count(*) from flowlane.step_tasks where status = 'started'") == 3
        assert_invariants(engine)
        assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
        assert engine.task(stalled_run, "a")["status"] == "queued"
        assert engine.task(recent_run, "a")["status"] == "started"
        # fencing: the stalled attempt's late result is rejected, another worker's too
        assert engine.complete(stalled, "late")["status"] == "queued"
        engine.complete_raw(fresh_run, "a", 0, "stolen", uuid.uuid4(), fresh["attempt"])
        assert engine.task(fresh_run, "a")["status"] == "started"
        # the owners' results apply; the requeued task runs again as attempt 2
        assert engine.complete(recent, "r")["status"] == "completed"
        assert engine.complete(fresh, "f")["status"] == "completed"
        [again] = engine.claim("f")
        assert again["run_id"] == stalled_run and again["attempt"] == 2
        assert engine.complete(again, "s")["status"] == "completed"
        assert [engine.run(r)["status"] for r in (recent_run, stalled_run, fresh_run)] == ["completed"] * 3
        assert engine.scalar("select count(*) from flowlane.step_tasks where status = 'started'") == 0
        assert_invariants(engine)


def test_the_upgrade_keeps_each_steps_timeout_and_the_flow_options(
    db_factory: Callable[..., str],
) -> None:
    # tasks claimed before the upgrade stall by their own step's timeout; flows keep their options
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("quick", [("a", [], {"timeout": 10})])
        engine.define("slow", [("a", [], {})])  # the flow's default timeout, 60 s
        quick_run, slow_run = engine.start("quick", {}), engine.start("slow", {})
        [quick] = engine.claim("quick")
        [slow] = engine.claim("slow")
        _claimed_long_ago(engine, quick_run, 41)  # past 10 + 30 s
        _claimed_long_ago(engine, slow_run, 41)  # within 60 + 30 s

        migrator.migrate(conn)

        assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
        assert engine.task(quick_run, "a")["status"] == "queued"
        assert engine.task(slow_run, "a")["status"] == "started"
        assert engine.scalar(
            "select error_message from flowlane.task_attempts where run_id = %s", (quick_run,)
        ) == "no result within 10 s (attempt 1)"
        results = [engine.complete(slow, "done"), engine.complete(quick, "late")]
        # the late result of the stalled attempt is fenced off
        assert [r and r["status"] for r in results] == ["completed", "queued"]
        [again] = engine.claim("quick")
        done = engine.complete(again, "ok")
        assert again["attempt"] == 2 and done is not None and done["status"] == "completed"
        options = ("select opt_max_attempts, opt_base_delay, opt_timeout, opt_retention "
                   "from flowlane.flows where flow_slug = %s")
        assert engine.row(options, ("slow",)) == {"opt_max_attempts": 3, "opt_base_delay": 5,
                                                  "opt_timeout": 60, "opt_retention": 2592000}
        engine.create_flow("after_upgrade")
        assert engine.row(options, ("after_upgrade",)) == engine.row(options, ("slow",))
        assert_invariants(engine)


def test_an_alias_adopts_the_name_of_a_flow_with_runs_in_flight_after_the_upgrade(
    db_factory: Callable[..., str],
) -> None:
    # a bare flow with a run in flight moves behind an alias of its own name; the run
    # finishes on it, new runs by that name start the alias's active version
    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("hello", [("a", [], {})])
        engine.define("hello_v2", [("a", [], {}), ("b", ["a"], {})])
        in_flight = engine.start("hello", {})

        migrator.migrate(conn)

        conn.execute("select flowlane.set_alias('hello', 'hello_v2', array['hello'])")
        engine.create_flow("hello")  # its compiled SQL applies again
        moved = engine.start("hello", {})
        assert engine.run(moved)["flow_slug"] == "hello_v2"
        [task] = engine.claim("hello")
        done = engine.complete(task, 1)
        assert task["run_id"] == in_flight and done is not None and done["status"] == "completed"
        engine.drive("hello_v2", lambda task: 2)
        assert [engine.run(r)["status"] for r in (in_flight, moved)] == ["completed"] * 2
        assert_invariants(engine)


def _blocked(watcher: psycopg.Connection[Any], pid: int) -> bool:
    return bool(watcher.execute("select cardinality(pg_blocking_pids(%s)) > 0", (pid,)).fetchone()[0])  # type: ignore[index]


def _worker_call(engine: Engine, queries: dict[str, str], call: str) -> tuple[Any, dict[str, Any]]:
    """The previous release's worker query for ``call`` over the queue's tasks, and its
    parameters."""
    pairs = Jsonb([["inflight", "a"]])
    claim = queries["worker_claim_tasks"], {"queue_name": "inflight", "qty": 10,
                                            "worker_id": engine.worker_id, "pairs": pairs}
    if call == "claim":
        return claim
    claimed = engine.rows(*claim)
    result = "output" if call == "complete" else "error"
    items = [{"run_id": str(t["run_id"]), "step_slug": "a", "task_index": 0, "attempt": t["attempt"],
              "worker_id": str(engine.worker_id), result: "done"} for t in claimed]
    return queries[f"worker_{call}_tasks"], {"results": Jsonb(items)}


@pytest.mark.parametrize("call", ["claim", "complete", "fail"])
@pytest.mark.parametrize("tasks", [1, 2], ids=["one task", "a batch"])
def test_a_workers_call_in_flight_when_the_newest_migration_commits_finishes(
    db_factory: Callable[..., str], call: str, tasks: int,
) -> None:
    # the previous release's workers claim and complete while `migrate` runs: a call that
    # entered the previous release's functions before the pending migration committed runs
    # their old bodies to the end, so every function those call must still exist then
    previous = previous_release()
    dsn = db_factory(previous.last_migration)
    with (psycopg.connect(dsn, autocommit=True) as conn,
          psycopg.connect(dsn, autocommit=True) as worker,
          psycopg.connect(dsn, autocommit=True) as migrating,
          psycopg.connect(dsn) as holder):
        engine = Engine(conn)
        engine.define("inflight", [("a", [], {})], max_attempts=1)
        runs = [engine.start("inflight", {"n": n}) for n in range(tasks)]
        statement, params = _worker_call(engine, previous.queries(), call)
        # the call waits inside the engine's functions for the runs' rows, which holder locks
        holder.execute("select 1 from flowlane.runs where run_id = any(%s) for update", (runs,))
        with ThreadPoolExecutor(2) as pool:
            answer = pool.submit(lambda: worker.execute(statement, params).fetchall())
            while not _blocked(conn, worker.info.backend_pid):
                assert not answer.done(), answer.result()
            migrated = pool.submit(migrator.migrate, migrating)
            # a migration that needs a lock the call holds waits for it: let the call go on
            while not migrated.done() and not _blocked(conn, migrating.info.backend_pid):
                pass
            holder.rollback()
            rows = answer.result()
            assert [m.version for m in migrated.result()] == [previous.upgrade.version]
        ended = {"claim": "started", "complete": "completed", "fail": "failed"}[call]
        assert len(rows) == tasks
        assert {engine.task(run, "a")["status"] for run in runs} == {ended}


def test_a_task_claimed_before_the_upgrade_is_overridden_after_it_with_its_history_kept(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory(previous_release().last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"base_delay": 0})], max_attempts=3)
        run_id = engine.start("f", {})
        [first] = engine.claim("f")
        engine.fail(first, "flaky")
        engine.make_visible("f")
        [second] = engine.claim("f")  # a worker holds attempt 2 across the upgrade

        migrator.migrate(conn, roles=True)

        [row] = engine.rows("select status, last_worker_id from flowlane.override_task("
                            "%s, 'a', 0, '\"by hand\"', 'the handler hangs')", (run_id,))
        assert row == {"status": "completed", "last_worker_id": None}
        assert engine.rows("select attempt, outcome, error_message from flowlane.task_attempts"
                           " where run_id = %s order by id", (run_id,)) == [
            {"attempt": 1, "outcome": "retry", "error_message": "flaky"},
            {"attempt": 2, "outcome": "overridden",
             "error_message": f"completed by hand by {conn.info.user}: the handler hangs"}]
        assert engine.complete(second, "late")["last_worker_id"] is None  # type: ignore[index]
        assert engine.run(run_id)["output"] == {"a": "by hand"}


def test_runs_of_the_previous_release_rerun_from_a_step_after_the_upgrade(
    db_factory: Callable[..., str],
) -> None:
    previous = previous_release()
    with psycopg.connect(db_factory(previous.last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"max_attempts": 2, "base_delay": 0}), ("b", ["a"], {})])
        run_id = engine.start("f", {})
        [a] = engine.claim("f")
        engine.fail(a, "first try")
        engine.make_visible("f")
        engine.drive("f", lambda t: t["step_slug"])
        assert engine.run(run_id)["status"] == "completed"
        migrator.migrate(conn)
        # the attempt kept before the upgrade is unchanged; the rerun adds the superseded ones
        engine.row("select * from flowlane.retry_run_from(%s, 'a')", (run_id,))
        engine.drive("f", lambda t: t["step_slug"] + "2")
        assert engine.run(run_id)["output"] == {"b": "b2"}
        history = engine.rows("select step_slug, outcome, error_message, output from flowlane.task_attempts "
                              "where run_id = %s order by id", (run_id,))
        assert history == [
            {"step_slug": "a", "outcome": "retry", "error_message": "first try", "output": None},
            {"step_slug": "a", "outcome": "superseded", "error_message": None, "output": "a"},
            {"step_slug": "b", "outcome": "superseded", "error_message": None, "output": "b"},
        ]
        assert_invariants(engine)


def test_runs_started_after_the_upgrade_get_time_ordered_ids_and_earlier_runs_keep_theirs(
    db_factory: Callable[..., str],
) -> None:
    previous = previous_release()
    with psycopg.connect(db_factory(previous.last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {})])
        earlier = engine.start("f", {})
        migrator.migrate(conn)
        later = engine.start("f", {})
        default = engine.scalar("select pg_get_expr(d.adbin, d.adrelid) from pg_attrdef d join pg_attribute a"
                                " on a.attrelid = d.adrelid and a.attnum = d.adnum"
                                " where d.adrelid = 'flowlane.runs'::regclass and a.attname = 'run_id'")
        assert (earlier.version, later.version, default) == (4, 7, "flowlane._uuid_v7()")
        engine.drive("f", lambda t: str(t["run_id"]))
        assert {engine.run(r)["output"]["a"] for r in (earlier, later)} == {str(earlier), str(later)}
        assert_invariants(engine)


def test_a_run_in_flight_on_the_previous_release_gets_a_failure_handler_and_compensation(
    db_factory: Callable[..., str],
) -> None:
    with psycopg.connect(db_factory("0003"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("undo", [("work", [], {})])
        engine.define("f", [("a", [], {}), ("b", ["a"], {"max_attempts": 1})])
        run_id = engine.start("f", {"n": 1})
        (task,) = engine.claim("f")
        engine.complete(task, {"a": 1})
        migrator.migrate(conn)

        assert (engine.run(run_id)["compensation"], engine.run(run_id)["failure_of"]) == (None, None)
        # the options converge on the flow with a run in flight, as a deploy does
        engine.create_flow("f", on_failure="undo")
        engine.add_step("f", "a", compensate="undo")
        engine.add_step("f", "b", ["a"], max_attempts=1)
        (task,) = engine.claim("f")
        engine.fail(task, "broken")
        inputs = {t["input"].get("step", "handler"): t["input"] for t in engine.claim("undo")}
        assert set(inputs) == {"a", "handler"}
        assert (inputs["a"]["input"], inputs["a"]["output"]) == ({"n": 1}, {"a": 1})
        assert inputs["handler"]["failed_step"] == "b"
        assert engine.run(run_id)["compensation"] == "running"


def test_a_step_of_the_previous_release_takes_a_cache_with_a_run_in_flight(
    db_factory: Callable[..., str],
) -> None:
    previous = previous_release()
    with psycopg.connect(db_factory(previous.last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {})])
        done, in_flight = engine.start("f", {"n": 1}), engine.start("f", {"n": 1})
        tasks = {t["run_id"]: t for t in engine.claim("f")}
        engine.complete(tasks[done], "before")
        migrator.migrate(conn)
        # the tasks kept their messages and came from no cache
        kept = engine.tasks(done) + engine.tasks(in_flight)
        assert [(t["cached"], t["message_id"] is not None) for t in kept] == [(False, True), (False, True)]
        engine.add_step("f", "a", cache_ttl=3600, cache_fingerprint="v1")  # as a deploy does
        engine.complete(tasks[in_flight], "after")  # the claim made before the upgrade
        later = engine.start("f", {"n": 1})
        assert engine.states(later)["a"]["output"] == "after" and engine.tasks(later)[0]["cached"]
        assert_invariants(engine)


def test_a_queue_of_the_previous_release_keeps_its_archive_and_may_turn_it_off_with_a_run_in_flight(
    db_factory: Callable[..., str],
) -> None:
    previous = previous_release()
    with psycopg.connect(db_factory(previous.last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {})])
        engine.scalar("select flowlane.set_queue_limits('f', 5, null, null)")  # a 0.1.0 queue file
        done, in_flight = engine.start("f", {"n": 1}), engine.start("f", {"n": 2})
        tasks = {t["run_id"]: t for t in engine.claim("f")}
        engine.complete(tasks[done], "before")
        migrator.migrate(conn)
        assert engine.scalar("select archive_messages from flowlane.queues where queue_name = 'f'") is True
        assert engine.archived_ids("f") == [tasks[done]["msg_id"]]
        # a queue file with the archive off, applied with a run in flight
        engine.scalar("select flowlane.set_queue_limits('f', 5, null, null, archive => false)")
        engine.complete(tasks[in_flight], "after")  # the claim made before the upgrade
        assert engine.run(in_flight)["status"] == "completed"
        assert engine.queue_messages("f") == [] and engine.archived_ids("f") == [tasks[done]["msg_id"]]
        assert_invariants(engine)


def test_tasks_leased_on_the_previous_release_are_recovered_and_counted_after_the_upgrade(
    db_factory: Callable[..., str],
) -> None:
    # the previous release kept its started tasks in the table task_leases, which the upgrade
    # drops: its started tasks stay recoverable and count against their queue's concurrency
    with psycopg.connect(db_factory(previous_release().last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"timeout": 10})], max_attempts=3)
        stalled_run, recent_run, waiting_run = (engine.start("f", {"n": n}) for n in range(3))
        engine.scalar("select flowlane.set_queue_limits('f', 2, null, null)")
        claimed = {t["run_id"]: t for t in engine.claim("f")}
        assert set(claimed) == {stalled_run, recent_run}
        _claimed_long_ago(engine, stalled_run, 100)

        migrator.migrate(conn)

        assert engine.scalar("select to_regclass('flowlane.task_leases')") is None
        refused = engine.rows("select outcome from flowlane.claim_tasks('f', 10, %s, %s)",
                              (engine.worker_id, Jsonb([["f", "a"]])))
        assert refused == [{"outcome": "at_capacity"}]  # the two tasks started before the upgrade
        assert engine.rows("select started from flowlane.queue_flow_control()") == [{"started": 2}]
        assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
        assert engine.task(stalled_run, "a")["status"] == "queued"
        assert engine.complete(claimed[stalled_run], "late")["status"] == "queued"  # type: ignore[index]
        assert engine.complete(claimed[recent_run], "r")["status"] == "completed"  # type: ignore[index]
        engine.drive("f", lambda t: "after")
        assert [engine.run(r)["status"] for r in (stalled_run, recent_run, waiting_run)] == ["completed"] * 3
        assert engine.task(stalled_run, "a")["attempts_count"] == 2
        assert_invariants(engine)


def test_root_steps_of_runs_in_flight_keep_their_rows_beside_the_states_tasks_hold(
    db_factory: Callable[..., str],
) -> None:
    # the previous release wrote a step_states row for every step, which its runs in flight
    # keep; a run started after the upgrade keeps its root step's state in the step's task.
    # Each path (complete one and in a batch, fail and retry, stalled recovery, cancel, retry
    # and rerun) takes both forms, side by side.
    with psycopg.connect(db_factory(previous_release().last_migration), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("f", [("a", [], {"max_attempts": 2, "timeout": 10}), ("b", ["a"], {})])
        old = [engine.start("f", {"n": n}) for n in range(5)]
        claimed = {t["run_id"]: t for t in engine.claim("f")}
        migrator.migrate(conn)
        new = [engine.start("f", {"n": n}) for n in range(5)]
        claimed |= {t["run_id"]: t for t in engine.claim("f")}
        assert set(claimed) == {*old, *new}
        assert {r["run_id"] for r in engine.rows(
            "select run_id from flowlane.step_states where step_slug = 'a'")} == set(old)
        assert {r["run_id"] for r in engine.rows(
            "select run_id from flowlane.step_tasks where step_started_at is not null")} == set(new)

        for form in (old, new):
            assert engine.complete(claimed[form[0]], {"n": 0})["status"] == "completed"  # type: ignore[index]
            assert engine.fail(claimed[form[2]], "first")["status"] == "queued"  # type: ignore[index]
            engine.backdate(form[3], "a", 100)
            assert engine.complete(claimed[form[4]], {"n": 4})["status"] == "completed"  # type: ignore[index]
        batch = [{"run_id": str(r), "step_slug": "a", "task_index": 0, "output": {"n": 1},
                  "worker_id": str(engine.worker_id), "attempt": claimed[r]["attempt"]}
                 for r in (old[1], new[1])]
        assert [t["status"] for t in engine.rows(
            "select status from flowlane.complete_tasks(%s)", (Jsonb(batch),))] == ["completed"] * 2
        assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 2

        engine.make_visible("f")
        for task in engine.claim("f"):
            if task["run_id"] in (old[2], new[2]):
                assert engine.fail(task, "second")["status"] == "failed"  # type: ignore[index]
            elif task["step_slug"] == "b":
                engine.complete(task, {"b": task["input"]})
        for form in (old, new):
            engine.scalar("select flowlane.cancel_run(%s)", (form[3],))
            assert engine.run(form[2])["status"] == "failed"
            engine.scalar("select flowlane.retry_run(%s)", (form[2],))
            engine.scalar("select flowlane.retry_run_from(%s, 'a')", (form[4],))
        engine.drive("f", lambda t: {"b": t["input"]} if t["step_slug"] == "b" else {"n": t["input"]["n"]})

        for form in (old, new):
            assert [engine.run(r)["status"] for r in form] == ["completed"] * 3 + ["cancelled", "completed"]
            assert [engine.run(r)["output"] for r in form] == [
                {"b": {"b": {"a": {"n": n}}}} if n != 3 else None for n in range(5)]
            assert [engine.statuses(r) for r in form] == [{"a": "completed", "b": "completed"}] * 3 + [
                {"a": "cancelled", "b": "cancelled"}, {"a": "completed", "b": "completed"}]
        # a run's failure, cancel or retry wrote its root step's state into step_states
        assert {r["run_id"] for r in engine.rows(
            "select run_id from flowlane.step_tasks where step_started_at is not null")} == {new[0], new[1]}
        assert_invariants(engine)
