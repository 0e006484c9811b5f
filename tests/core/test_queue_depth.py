"""flowlane.queue_depth: the work a queue holds for its workers (what autoscalers read)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def depth(engine: Engine, queue: str = "depth") -> int:
    return int(engine.scalar("select flowlane.queue_depth(%s)", [queue]))


def test_depth_counts_waiting_and_claimed_messages_not_those_not_yet_due(engine: Engine) -> None:
    engine.define("depth", [("now", [], {"base_delay": 3600, "max_attempts": 3}),
                            ("later", [], {"start_delay": 3600})])
    for n in range(3):
        engine.start("depth", {"n": n})
    assert depth(engine) == 3  # three `now` tasks visible; `later` is not due for an hour
    [claimed] = engine.claim("depth", qty=1)
    assert depth(engine) == 3  # one claimed, two waiting
    engine.complete(claimed, {"ok": True})
    assert depth(engine) == 2
    [retried] = engine.claim("depth", qty=1)
    engine.fail(retried)  # retried in an hour: its message stays on the queue, read once
    assert depth(engine) == 2
    engine.conn.execute("update pgmq.q_depth set vt = now() where read_ct = 0")  # all due
    assert depth(engine) == 5
    assert depth(engine, "DEPTH") == 5  # queue names fold case, as everywhere


def test_depth_reads_the_queue_table_through_its_index(engine: Engine) -> None:
    engine.define("depth", [("now", [], {})])
    engine.start("depth", {})
    plans: list[str] = []
    engine.conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice"):
        engine.conn.execute("load 'auto_explain'")
        engine.conn.execute(f"set {setting}")
    assert depth(engine) == 1
    inner = [p for p in plans if "pgmq.q_depth" in p]
    assert inner, plans
    assert all("Seq Scan" not in p for p in inner) and any("q_depth_vt_idx" in p for p in inner)


def test_an_unknown_queue_is_refused_with_a_hint(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.NoDataFound) as caught:
        conn.execute("select flowlane.queue_depth('nowhere')")
    assert 'queue "nowhere" is not registered' in str(caught.value)
    assert caught.value.diag.message_hint == "the queues: `flowlane queue list`"
