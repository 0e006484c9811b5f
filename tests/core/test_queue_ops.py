"""The queue operations (_queue_read, _queue_archive, _queue_archive_batch, _queue_delete_batch,
_queue_set_vt, _queue_send, _queue_send_batch): a
registered queue gets a static branch of its own when its registration commits, and every
branch means what PGMQ's call means. Each case runs the same calls on a registered queue
(its branch) and on a queue only PGMQ knows (PGMQ's function) and compares what they leave.
A task's cycle, one call at a time, goes through the branches only."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

MESSAGE_COLUMNS = "msg_id, read_ct, message, headers, last_read_at is not null as read"
OPERATIONS = ("_queue_read", "_queue_archive", "_queue_archive_batch", "_queue_delete_batch", "_queue_set_vt",
              "_queue_send", "_queue_send_batch")


def register(engine: Engine, queue: str) -> None:
    engine.define(queue, [("a", [], {})])  # the flow's own queue, named after it


def branches(engine: Engine, function: str) -> list[str]:
    source = engine.scalar("select prosrc from pg_proc where oid = %s::regproc", (f"flowlane.{function}",))
    return re.findall(r"if p_queue = '([a-z_]+)' then", source)


def queue_rows(engine: Engine, table: str) -> list[dict[str, Any]]:
    return engine.rows(f"select {MESSAGE_COLUMNS} from pgmq.{table} order by msg_id")


def test_a_registered_queue_gets_its_branches_when_its_registration_commits(
    engine: Engine, dsn: str
) -> None:
    engine.conn.execute("select pgmq.create('plain')")  # PGMQ's only: no branch
    register(engine, "flow_a")
    assert branches(engine, "_queue_read") == ["flow_a"]
    with psycopg.connect(dsn) as other:
        for flow in ("flow_c", "flow_b"):
            other.execute("select flowlane.create_flow(%s)", (flow,))
            other.execute("select flowlane.add_step(%s, 'a', '{}')", (flow,))
            assert branches(engine, "_queue_read") == ["flow_a"]  # not committed yet
            if flow == "flow_c":
                other.rollback()
        other.commit()
    for function in OPERATIONS:
        assert branches(engine, function) == ["flow_a", "flow_b"], function


def test_read_archive_and_send_leave_what_pgmq_leaves(engine: Engine) -> None:
    register(engine, "flow_a")
    engine.conn.execute("select pgmq.create('plain')")
    results = {}
    for queue in ("flow_a", "plain"):
        sent = [engine.scalar("select flowlane._queue_send(%s, %s, 0)", (queue, Jsonb({"n": n})))
                for n in range(4)]
        delayed = engine.scalar("select flowlane._queue_send(%s, %s, 60)", (queue, Jsonb({"n": 9})))
        read = engine.rows("select msg_id, read_ct, message from flowlane._queue_read(%s, 30, 3)",
                           (queue,))
        hidden = engine.scalar(
            f"select bool_and(vt > clock_timestamp() + interval '25 seconds') from pgmq.q_{queue}"
            " where msg_id = any (%s)", ([r["msg_id"] for r in read],))
        delayed_hidden = engine.scalar(
            f"select vt > clock_timestamp() + interval '55 seconds' from pgmq.q_{queue} where msg_id = %s",
            (delayed,))
        archived = [engine.scalar("select flowlane._queue_archive(%s, %s)", (queue, msg_id))
                    for msg_id in (sent[0], sent[0], 999)]
        again = engine.rows("select msg_id from flowlane._queue_read(%s, 30, 5)", (queue,))
        batch = [r["id"] for r in engine.rows(
            "select m.id from flowlane._queue_send_batch(%s, %s::jsonb[], 60) m (id)",
            (queue, [Jsonb({"b": n}) for n in range(3)]))]
        batch_vt = engine.scalar(
            f"select count(distinct vt) = 1 and bool_and(vt > clock_timestamp() + interval '55 seconds')"
            f" from pgmq.q_{queue} where msg_id = any (%s)", (batch,))
        archived_batch = [r["id"] for r in engine.rows(
            "select m.id from flowlane._queue_archive_batch(%s, %s) m (id) order by 1",
            (queue, [sent[2], sent[1], sent[0], 999]))]
        moved = engine.scalar("select flowlane._queue_set_vt(%s, %s, 120)", (queue, [sent[3], batch[0], 999]))
        moved_vt = engine.scalar(
            f"select bool_and(vt > clock_timestamp() + interval '115 seconds') from pgmq.q_{queue}"
            " where msg_id = any (%s)", ([sent[3], batch[0]],))
        results[queue] = {
            "sent": sent, "delayed": delayed, "read": read, "hidden": hidden,
            "delayed_hidden": delayed_hidden, "archived": archived, "again": again,
            "batch": batch, "batch_vt": batch_vt, "archived_batch": archived_batch,
            "moved": moved, "moved_vt": moved_vt,
            "queue": queue_rows(engine, f"q_{queue}"), "archive": queue_rows(engine, f"a_{queue}"),
        }
    assert results["flow_a"] == results["plain"]
    a = results["flow_a"]
    assert [r["msg_id"] for r in a["read"]] == a["sent"][:3]
    assert [r["read_ct"] for r in a["read"]] == [1, 1, 1]
    assert a["hidden"] is True and a["delayed_hidden"] is True
    assert a["archived"] == [True, False, False]
    assert [r["msg_id"] for r in a["again"]] == [a["sent"][3]]
    assert a["batch"] == [a["delayed"] + n for n in (1, 2, 3)] and a["batch_vt"] is True
    assert a["archived_batch"] == a["sent"][1:3]  # not the one archived before, nor an unknown id
    assert a["moved"] == 2 and a["moved_vt"] is True
    assert [r["msg_id"] for r in a["archive"]] == a["sent"][:3]
    assert a["archive"][0]["read_ct"] == 1 and a["archive"][0]["message"] == {"n": 0}


def test_a_batch_delete_leaves_what_pgmq_leaves(engine: Engine) -> None:
    register(engine, "flow_a")
    engine.conn.execute("select pgmq.create('plain')")
    results = {}
    for queue in ("flow_a", "plain"):
        sent = [engine.scalar("select flowlane._queue_send(%s, %s, 0)", (queue, Jsonb({"n": n})))
                for n in range(4)]
        deleted = [[r["id"] for r in engine.rows(
            "select m.id from flowlane._queue_delete_batch(%s, %s) m (id) order by 1", (queue, ids))]
            for ids in ([sent[2], sent[0], 999], [sent[0]])]
        results[queue] = {"sent": sent, "deleted": deleted, "queue": queue_rows(engine, f"q_{queue}"),
                          "archive": queue_rows(engine, f"a_{queue}")}
    assert results["flow_a"] == results["plain"]
    a = results["flow_a"]
    assert a["deleted"] == [[a["sent"][0], a["sent"][2]], []]  # not an unknown id, nor one deleted before
    assert [r["msg_id"] for r in a["queue"]] == [a["sent"][1], a["sent"][3]] and a["archive"] == []


def test_a_read_skips_messages_another_transaction_has_locked(engine: Engine, dsn: str) -> None:
    register(engine, "flow_a")
    ids = [engine.scalar("select flowlane._queue_send('flow_a', %s, 0)", (Jsonb({"n": n}),))
           for n in range(2)]
    with psycopg.connect(dsn) as other:
        locked = other.execute("select msg_id from flowlane._queue_read('flow_a', 30, 1)").fetchall()
        assert locked == [(ids[0],)]
        assert engine.rows("select msg_id from flowlane._queue_read('flow_a', 30, 5)") == [{"msg_id": ids[1]}]


def test_a_read_touches_the_messages_it_reads_not_the_whole_queue(engine: Engine) -> None:
    register(engine, "flow_a")
    engine.conn.execute("select pgmq.send_batch('flow_a', array_fill('{}'::jsonb, array[500]))")
    with engine.conn.transaction():
        assert len(engine.rows("select * from flowlane._queue_read('flow_a', 30, 2)")) == 2
        touched = engine.row(
            "select seq_tup_read, idx_tup_fetch from pg_stat_xact_user_tables"
            " where schemaname = 'pgmq' and relname = 'q_flow_a'")
    assert touched is not None and touched["seq_tup_read"] == 0
    assert touched["idx_tup_fetch"] <= 4  # the two read, found once to lock and once to update


def _pgmq_calls(engine: Engine) -> int:
    """PGMQ's functions called in this transaction (track_functions = 'all')."""
    return int(engine.scalar(
        "select coalesce(sum(pg_stat_get_xact_function_calls(p.oid)), 0) from pg_proc p"
        " where p.pronamespace = 'pgmq'::regnamespace"))


def test_a_tasks_one_at_a_time_cycle_calls_no_pgmq_function(engine: Engine) -> None:
    # each of PGMQ's calls builds and plans its statement; a registered queue's branch does not
    engine.define("cycle", [("a", [], {"max_attempts": 2}), ("b", ["a"], {"max_attempts": 1})])
    pairs = Jsonb([["cycle", "a"], ["cycle", "b"]])
    claim = "select * from flowlane.claim_tasks('cycle', 1, %s, %s) where outcome = 'claimed'"
    with engine.conn.transaction():
        engine.conn.execute("set local track_functions = 'all'")
        run_id = engine.start("cycle")
        first = engine.row(claim, (engine.worker_id, pairs))
        assert first is not None and first["step_slug"] == "a"
        engine.fail(first)  # a retry: its message hidden for the retry delay
        visible_now = "select flowlane._queue_set_vt('cycle', array[%s::bigint], 0)"
        engine.conn.execute(visible_now, (first["msg_id"],))
        again = engine.row(claim, (engine.worker_id, pairs))
        assert again is not None and again["attempt"] == 2
        engine.complete(again, {"ok": True})  # enqueues b
        second = engine.row(claim, (engine.worker_id, pairs))
        assert second is not None and second["step_slug"] == "b"
        engine.fail(second)  # out of attempts: archived, the run fails
        assert engine.run(run_id)["status"] == "failed"
        assert _pgmq_calls(engine) == 0
