"""Retention: prune_runs deletes finished runs older than their flow's retention, with their
steps, tasks, attempts and queue messages, one bounded batch per call; claims never wait
behind a batch."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

DAY = 86400
LATER = "now() + make_interval(days => %s)"  # prune as of a later time instead of backdating


def _finished(engine: Engine, flow: str, n: int, *, fail_once: bool = False) -> list[uuid.UUID]:
    """n completed runs of a one-step flow (with a failed attempt first when asked)."""
    runs = [engine.start(flow) for _ in range(n)]
    if fail_once:
        for task in engine.claim(flow):
            engine.fail(task)
        engine.make_visible(flow)
    engine.drive(flow, lambda task: {"ok": True})
    return runs


def _prune(engine: Engine, days: int, **args: Any) -> dict[str, int]:
    names = "".join(f", {k} => %({k})s" for k in args)
    row = engine.row(f"select * from flowlane.prune_runs(p_now => {LATER % '%(days)s'}{names})",
                     {"days": days, **args})
    assert row is not None
    return row


def _count(engine: Engine, table: str, runs: list[uuid.UUID]) -> int:
    return int(engine.scalar(f"select count(*) from {table} where run_id = any (%s)", (runs,)))


def _archived(engine: Engine, queue: str) -> int:
    return len(engine.archived_ids(queue))


def test_a_finished_run_past_its_retention_goes_with_everything_it_owns(engine: Engine) -> None:
    engine.define("month", [("one", [], {"max_attempts": 2, "base_delay": 0})])
    engine.define("week", [("one", [], {})], retention=7 * DAY)
    engine.define("keep", [("one", [], {})], retention=None)
    old = _finished(engine, "month", 2, fail_once=True)
    week = _finished(engine, "week", 1)
    kept = _finished(engine, "keep", 1)
    running = engine.start("month")
    assert _archived(engine, "month") == 2 and _count(engine, "flowlane.task_attempts", old) == 2

    nothing = _prune(engine, 6)  # within every retention
    assert nothing == {"runs_deleted": 0, "steps_deleted": 0, "tasks_deleted": 0,
                       "attempts_deleted": 0, "messages_deleted": 0}
    assert _prune(engine, 8) == {"runs_deleted": 1, "steps_deleted": 1, "tasks_deleted": 1,
                                 "attempts_deleted": 0, "messages_deleted": 1}
    assert _count(engine, "flowlane.runs", week) == 0 and _count(engine, "flowlane.runs", old) == 2

    assert _prune(engine, 31) == {"runs_deleted": 2, "steps_deleted": 2, "tasks_deleted": 2,
                                  "attempts_deleted": 2, "messages_deleted": 2}
    for table in ("flowlane.runs", "flowlane.step_states", "flowlane.step_tasks",
                  "flowlane.task_attempts"):
        assert _count(engine, table, old) == 0, table
    assert _archived(engine, "month") == 0 and _archived(engine, "keep") == 1
    assert engine.run(running)["status"] == "started"
    assert engine.run(kept[0])["status"] == "completed"
    assert [m["msg_id"] for m in engine.queue_messages("month")] == [
        engine.task(running, "one")["message_id"]]


def test_older_than_replaces_every_retention_and_flows_narrow_it(engine: Engine) -> None:
    engine.define("keep", [("one", [], {})], retention=None)
    engine.define("other", [("one", [], {})], retention=None)
    kept, other = _finished(engine, "keep", 1), _finished(engine, "other", 1)
    assert _prune(engine, 1)["runs_deleted"] == 0
    assert _prune(engine, 1, p_older_than=3600, p_flows=["keep"])["runs_deleted"] == 1
    assert _count(engine, "flowlane.runs", kept) == 0 and _count(engine, "flowlane.runs", other) == 1


def test_each_call_deletes_one_bounded_batch_and_the_dry_run_deletes_nothing(engine: Engine) -> None:
    engine.define("many", [("one", [], {})])
    _finished(engine, "many", 5)
    preview = engine.rows(f"select * from flowlane.prunable_runs(p_now => {LATER % 31})")
    assert [(r["flow_slug"], r["runs"]) for r in preview] == [("many", 5)]
    assert engine.scalar("select count(*) from flowlane.runs") == 5
    batches = [_prune(engine, 31, p_batch=2)["runs_deleted"] for _ in range(4)]
    assert batches == [2, 2, 1, 0]


def test_bad_arguments_are_refused(engine: Engine) -> None:
    for args, message in (("p_batch => 0", "p_batch must be between 1 and 10000"),
                          ("p_batch => null", "p_batch must be between 1 and 10000"),
                          ("p_older_than => -1", "p_older_than is seconds"),
                          ("p_now => null", "p_now must not be null")):
        with pytest.raises(psycopg.Error, match=message):
            engine.scalar(f"select runs_deleted from flowlane.prune_runs({args})")


def test_a_handlers_run_is_kept_while_the_run_it_handles_is_kept(engine: Engine) -> None:
    """A failure handler's run and a compensation's run, of flows kept a day, wait for the
    failed run they handle (kept a month) and go after it."""
    engine.define("report", [("one", [], {})], retention=DAY)
    engine.define("undo", [("one", [], {})], retention=DAY)
    engine.define("f", [("a", [], {"compensate": "undo"}), ("b", ["a"], {"max_attempts": 1})],
                  on_failure="report", retention=30 * DAY)
    failed = engine.start("f")
    (task,) = engine.claim("f")
    engine.complete(task, {"done": "a"})
    (task,) = engine.claim("f")
    engine.fail(task, "no courier")
    for flow in ("report", "undo"):
        engine.drive(flow, lambda task: {"ok": True})
    handlers = [r["run_id"] for r in engine.rows(
        "select run_id from flowlane.runs where failure_of = %s or compensation_of = %s", (failed, failed))]
    assert len(handlers) == 2 and all(engine.run(h)["status"] == "completed" for h in handlers)

    assert _prune(engine, 2)["runs_deleted"] == 0  # past their own retention, not past the failed run's
    assert _count(engine, "flowlane.runs", handlers) == 2
    assert _prune(engine, 31)["runs_deleted"] == 1  # the failed run first ...
    assert _count(engine, "flowlane.runs", [failed]) == 0 and _count(engine, "flowlane.runs", handlers) == 2
    assert _prune(engine, 31)["runs_deleted"] == 2  # ... then the runs that handled it
    assert _count(engine, "flowlane.runs", handlers) == 0


def test_create_flow_sets_and_resets_the_retention(engine: Engine) -> None:
    assert engine.create_flow("tuned", retention=3600)["opt_retention"] == 3600
    assert engine.create_flow("tuned", retention=None)["opt_retention"] is None
    assert engine.create_flow("tuned")["opt_retention"] == 30 * DAY
    with pytest.raises(psycopg.Error, match="retention must be at least 1 second"):
        engine.create_flow("tuned", retention=0)


def test_a_claim_never_waits_behind_a_prune_batch(engine: Engine, dsn: str) -> None:
    """A batch holds its locks until it commits: claims and completions of live runs made
    while a batch is open (not yet committed) finish without waiting on it."""
    engine.define("busy", [("one", [], {}), ("two", ["one"], {})])
    old = [engine.start("busy") for _ in range(20)]
    engine.drive("busy", lambda task: 1)
    live = [engine.start("busy") for _ in range(10)]
    with psycopg.connect(dsn) as pruner:
        deleted = pruner.execute(
            f"select runs_deleted from flowlane.prune_runs(p_now => {LATER % 31}, p_batch => 10)"
        ).fetchone()
        assert deleted == (10,)  # the batch's transaction stays open, its rows locked
        done = threading.Event()
        failures: list[BaseException] = []

        def claim_loop() -> None:
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    Engine(conn).drive("busy", lambda task: 2)
            except BaseException as exc:
                failures.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=claim_loop)
        thread.start()
        waited = _blocked_until_done(pruner.info.backend_pid, dsn, done)
        pruner.commit()  # releases a claim that did wait, so the thread ends either way
        thread.join()
    assert not waited, f"the claim loop waited for the prune batch: {waited}"
    assert not failures, failures
    assert all(engine.run(r)["status"] == "completed" for r in live)
    assert _count(engine, "flowlane.runs", old) == 10


def _blocked_until_done(blocker: int, dsn: str, done: threading.Event) -> list[int]:
    """Watch the backends until the claim loop is done: the pids found waiting on
    ``blocker`` (the open prune batch), if any."""
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while not done.is_set():
            blocked = [r[0] for r in watcher.execute(
                "select pid from pg_stat_activity where %s = any (pg_blocking_pids(pid))",
                (blocker,))]
            if blocked:
                return blocked
    return []


def test_the_prune_command_previews_then_prunes_an_aliases_versions(
        engine: Engine, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from flowlane.cli import main

    engine.define("report_v1", [("one", [], {})], retention=None)
    engine.define("other", [("one", [], {})])
    engine.scalar("select flowlane.set_alias('report', 'report_v1')")
    _finished(engine, "report_v1", 3)
    _finished(engine, "other", 1)
    args = ["prune", "--dsn", dsn, "--flow", "report", "--older-than", "0"]
    assert main([*args, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("report_v1: 3 run(s) to prune, the oldest ended ")
    assert engine.scalar("select count(*) from flowlane.runs") == 4
    assert main([*args, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "runs": 3, "steps": 3, "tasks": 3, "attempts": 0, "messages": 3}
    assert engine.scalar("select array_agg(flow_slug) from flowlane.runs") == ["other"]
    assert main(["prune", "--dsn", dsn, "--older-than", "3w"]) == 2
    assert "--older-than: `3w` is not a duration" in capsys.readouterr().err
    assert main(["prune", "--dsn", dsn, "--flow", "nope"]) == 1  # an unknown flow: a failure
