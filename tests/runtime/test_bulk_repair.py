"""Retrying and cancelling many runs at once (`flowlane retry|cancel` with a filter): a dry run
counts, the runs are taken in batches of one short transaction each, and a claim loop working
meanwhile is never held by more than one batch."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.runtime.client import Client, Repair, RunFilter
from tests.core.engine import Engine
from tests.runtime.rt_support import flowlane, wait_until

pytestmark = pytest.mark.slow

FAILED = 1000


def _fail(engine: Engine, task: dict[str, Any], kind: str) -> None:
    engine.conn.execute(
        "select flowlane.fail_task_detailed(%s, %s, %s, %s, %s, %s, %s, null)",
        (task["run_id"], task["step_slug"], task["task_index"], f"{kind}: card 4242", engine.worker_id,
         task["attempt"], kind))


def _failed_runs(engine: Engine) -> dict[str, list[uuid.UUID]]:
    """FAILED runs of shop failed in charge with CardDeclined, five with Timeout."""
    engine.define("shop", [("charge", [], {"max_attempts": 1})])
    engine.conn.execute("select flowlane.start_flows('shop', %s)",
                        ([Jsonb({"n": n}) for n in range(FAILED + 5)],))
    kinds: dict[str, list[uuid.UUID]] = {"CardDeclined": [], "Timeout": []}
    tasks = engine.claim("shop") + engine.claim("shop")  # a claim takes at most 1000
    assert len(tasks) == FAILED + 5
    for n, task in enumerate(sorted(tasks, key=lambda t: t["input"]["n"])):
        kind = "Timeout" if n >= FAILED else "CardDeclined"
        _fail(engine, task, kind)
        kinds[kind].append(task["run_id"])
    return kinds


def test_a_dry_run_counts_and_shows_a_sample_and_changes_nothing(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        kinds = _failed_runs(engine)
        shown = flowlane("retry", "--flow", "shop", "--step", "charge", "--error-type", "CardDeclined",
                         "--dry-run", "--dsn", dsn)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == f"would retry {FAILED} runs (in batches of 100); nothing changed"
        assert len([line for line in lines if "CardDeclined: card 4242" in line]) == 10
        assert lines[-1] == f"  ... and {FAILED - 10} more"
        by_text = flowlane("retry", "--error", "timeout: CARD", "--dry-run", "--format", "json", "--dsn", dsn)
        assert by_text.returncode == 0, by_text.stderr
        assert '"matched": 5' in by_text.stdout
        assert engine.scalar("select count(*) from flowlane.runs where status = 'failed'") == FAILED + 5
        assert {engine.run(r)["retry_count"] for r in kinds["CardDeclined"]} == {0}

        refused = flowlane("retry", "--dsn", dsn)
        assert refused.returncode == 2 and "name a run (RUN_ID) or the runs to take" in refused.stderr
        both = flowlane("cancel", str(kinds["Timeout"][0]), "--flow", "shop", "--dsn", dsn)
        assert both.returncode == 2 and "give RUN_ID or filter options, not both" in both.stderr


def _claim_and_complete(claims: Engine, claimed: Counter[uuid.UUID]) -> int:
    """Claim and complete what is visible on shop; the number of claims that gave up waiting
    for a lock (lock_timeout)."""
    try:
        for task in claims.claim("shop", qty=50):
            claimed[task["run_id"]] += 1
            claims.complete(task, {"charged": True})
    except psycopg.errors.LockNotAvailable:
        return 1
    return 0


def test_a_thousand_failed_runs_are_retried_in_batches_while_claims_go_on(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        kinds = _failed_runs(Engine(conn))
    in_order = sorted(kinds["CardDeclined"])  # runs started together: a batch is the next 100 ids
    done: list[Repair] = []

    def repair() -> None:
        with Client(dsn) as client:
            done.append(client.repair("retry", RunFilter(flow="shop", error_type="CardDeclined"),
                                      batch_size=100))

    repairing = threading.Thread(target=repair)
    lock_waits = 0
    claimed: Counter[uuid.UUID] = Counter()
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as blocker:
        claims = Engine(conn)
        # a claim that waits for a lock longer than this gives up, and is counted
        conn.execute("set lock_timeout = '30s'")
        # hold the third batch half way: its transaction waits for this run's lock
        blocker.execute("select 1 from flowlane.runs where run_id = %s for update", (in_order[250],))
        repairing.start()
        waiting = ("select count(*) from pg_stat_activity "
                   "where datname = current_database() and wait_event_type = 'Lock'")
        wait_until(lambda: claims.scalar(waiting), message="the repair waiting in its third batch")
        # the two batches before it are committed, their locks released: their tasks are claimed
        # and completed while the third batch's transaction is open
        assert claims.scalar("select count(*) from flowlane.runs where retry_count = 1") == 200
        while claims.scalar("select count(*) from pgmq.q_shop where vt <= now()") > 0:
            lock_waits += _claim_and_complete(claims, claimed)
        assert set(claimed) == set(in_order[:200])
        blocker.rollback()
        while repairing.is_alive() or claims.scalar("select count(*) from pgmq.q_shop") > 0:
            lock_waits += _claim_and_complete(claims, claimed)
        repairing.join()
        [result] = done
        assert (result.matched, result.changed, result.batches) == (FAILED, FAILED, 10)
        assert lock_waits == 0
        assert set(claimed) == set(kinds["CardDeclined"]) and set(claimed.values()) == {1}
        # one transaction a batch: the runs retried together share the time their transaction began
        per_transaction = claims.rows("select retried_at, count(*) as runs from flowlane.runs "
                                      "where retry_count = 1 group by retried_at")
        assert sorted(r["runs"] for r in per_transaction) == [100] * 10
        statuses = Counter(claims.run(r)["status"] for r in kinds["CardDeclined"])
        assert statuses == Counter({"completed": FAILED})
        assert {claims.run(r)["status"] for r in kinds["Timeout"]} == {"failed"}


def test_cancel_with_a_filter_takes_started_runs_in_batches(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("mail", [("send", [], {})])
        runs = [engine.start("mail", {"n": n}) for n in range(25)]
        cancelled = flowlane("cancel", "--flow", "mail", "--batch", "10", "--reason", "bad deploy",
                             "--dsn", dsn)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout.splitlines()[0] == "cancelled 25 of 25 matching runs in 3 batches"
        assert {(engine.run(r)["status"], engine.run(r)["cancel_reason"]) for r in runs} == {
            ("cancelled", "bad deploy")}
        assert engine.queue_messages("mail") == []
