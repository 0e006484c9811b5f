"""The claim of one message (_claim_one) against the batch path (_claim_batch).

Each scenario leaves one message on a queue in some state. In one transaction (one `now()`)
the message is claimed by `_claim_one` and, after a rollback to a savepoint, by
`_claim_batch`. Where the one-message path claims, both must return the same row and leave
the same task, lease and message; where it declines, it must have changed nothing, and the
batch path (which then decides) must not claim.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

WORKER = uuid.uuid4()


def _message(engine: Engine, run_id: Any, step: str, index: int = 0) -> int:
    return int(
        engine.scalar(
            "select message_id from flowlane.step_tasks where run_id = %s and step_slug = %s "
            "and task_index = %s",
            (run_id, step, index),
        )
    )


def _tables(engine: Engine, queue: str) -> tuple[sql.Identifier, sql.Identifier]:
    """The queue's table and its archive."""
    q, a = (engine.scalar("select pgmq.format_table_name(%s, %s)", (queue, kind)) for kind in ("q", "a"))
    return sql.Identifier("pgmq", q), sql.Identifier("pgmq", a)


def _put_back(engine: Engine, queue: str, msg_id: int) -> None:
    """A message delivered again after its task moved on: back from the archive to the queue."""
    queue_table, archive = _tables(engine, queue)
    engine.conn.execute(sql.SQL("delete from {} where msg_id = %s").format(archive), (msg_id,))
    engine.conn.execute(
        sql.SQL(
            "insert into {} (msg_id, vt, message) overriding system value "
            "values (%s, clock_timestamp(), '{{}}')"
        ).format(queue_table),
        (msg_id,),
    )


def _queued(engine: Engine) -> tuple[str, int]:
    engine.define("one", [("a", [], {})])
    run = engine.start("one", {"n": 1})
    return "one", _message(engine, run, "a")


def _dependent(engine: Engine) -> tuple[str, int]:
    engine.define("chain", [("a", [], {}), ("b", ["a"], {})])
    run = engine.start("chain", {"n": 2})
    engine.complete(engine.claim("chain")[0], {"out": 3})
    return "chain", _message(engine, run, "b")


def _map_element(engine: Engine) -> tuple[str, int]:
    engine.define("mapped", [("m", [], {"step_type": "map"})])
    run = engine.start("mapped", [10, 20, 30])
    return "mapped", _message(engine, run, "m", 1)


def _quick(engine: Engine) -> tuple[str, int]:
    """A task whose lease (12 s) is shorter than the read's visibility a worker serving a slower
    step on the queue reads with (claim_tasks reads with the longest lease of its pairs)."""
    engine.define("quick", [("a", [], {"timeout": 10})])
    run = engine.start("quick", {"n": 1})
    return "quick", _message(engine, run, "a")


def _started(engine: Engine) -> tuple[str, int]:
    queue, msg_id = _queued(engine)
    engine.claim(queue)
    return queue, msg_id


def _completed(engine: Engine) -> tuple[str, int]:
    queue, msg_id = _queued(engine)
    engine.complete(engine.claim(queue)[0], {})
    _put_back(engine, queue, msg_id)
    return queue, msg_id


def _cancelled_run(engine: Engine) -> tuple[str, int]:
    engine.define("cancelled", [("a", [], {})])
    run = engine.start("cancelled")
    msg_id = _message(engine, run, "a")
    engine.conn.execute("select flowlane.cancel_run(%s)", (run,))
    if not engine.queue_messages("cancelled"):
        _put_back(engine, "cancelled", msg_id)
    return "cancelled", msg_id


def _foreign(engine: Engine) -> tuple[str, int]:
    engine.define("one", [("a", [], {})])
    return "one", int(engine.scalar("select pgmq.send('one', '{\"not\": \"a task\"}')"))


# scenario: (state, the worker's pairs, the read's visibility, claimed by the one-message path)
SCENARIOS: dict[str, tuple[Callable[[Engine], tuple[str, int]], list[tuple[str, str]], int | None, bool]] = {
    "queued": (_queued, [("one", "a")], 62, True),
    "dependent": (_dependent, [("chain", "a"), ("chain", "b")], 62, True),
    "map_element": (_map_element, [("mapped", "m")], 62, True),
    "read_outlasts_lease": (_quick, [("quick", "a")], 62, True),
    "start_tasks": (_queued, [("one", "a")], None, True),
    "unsupported": (_queued, [("one", "b")], 62, False),
    "started": (_started, [("one", "a")], 62, False),
    "completed": (_completed, [("one", "a")], 62, False),
    "cancelled_run": (_cancelled_run, [("cancelled", "a")], 62, False),
    "foreign": (_foreign, [("one", "a")], 62, False),
}


def _state(engine: Engine, queue: str, msg_id: int) -> dict[str, Any]:
    queue_table, archive = _tables(engine, queue)
    message = engine.conn.execute(
        sql.SQL("select round(extract(epoch from vt - now())), read_ct from {} where msg_id = %s").format(
            queue_table
        ),
        (msg_id,),
    ).fetchone()
    archived = engine.conn.execute(sql.SQL("select count(*) from {}").format(archive)).fetchone()
    return {
        "task": engine.row(
            "select * from flowlane.step_tasks where queue_name = %s and message_id = %s", (queue, msg_id)
        ),
        "started": engine.rows("select run_id, step_slug, task_index, started_at from flowlane.step_tasks "
                               "where status = 'started' order by 1, 2, 3"),
        "message": message,
        "archived": archived,
    }


def _claim(
    engine: Engine, function: str, queue: str, msg_id: int, pairs: list[tuple[str, str]], read_vt: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    args = (queue, msg_id, WORKER, [p[0] for p in pairs], [p[1] for p in pairs], read_vt)
    if function == "one":
        rows = engine.rows(
            "select * from flowlane._claim_one(%s, %s, %s, %s, %s, %s, null) where outcome is not null", args
        )
    else:
        rows = engine.rows(
            "select * from flowlane._claim_batch(%s, array[%s::bigint], %s, %s, %s, %s, null)", args
        )
    return rows, _state(engine, queue, msg_id)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_one_message_claims_what_the_batch_path_claims(engine: Engine, scenario: str) -> None:
    prepare, pairs, read_vt, claimed = SCENARIOS[scenario]
    queue, msg_id = prepare(engine)
    with engine.conn.transaction():
        before = _state(engine, queue, msg_id)
        with engine.conn.transaction(force_rollback=True):
            one, after_one = _claim(engine, "one", queue, msg_id, pairs, read_vt)
        with engine.conn.transaction(force_rollback=True):
            batch, after_batch = _claim(engine, "batch", queue, msg_id, pairs, read_vt)
    assert bool(one) == claimed
    if claimed:
        assert one == batch
        assert one[0]["outcome"] == "claimed" and one[0]["attempt"] == 1
        assert after_one == after_batch
        assert after_one["task"]["status"] == "started"
    else:
        assert after_one == before
        assert all(r["outcome"] != "claimed" for r in batch)
    if before["task"] is not None and before["task"]["status"] not in ("queued", "started"):
        engine.conn.execute("select pgmq.archive(%s, %s::bigint)", (queue, msg_id))  # the put-back message


def test_the_claimed_inputs_are_the_tasks_own(engine: Engine) -> None:
    queue, msg_id = _dependent(engine)
    (row,) = engine.rows(
        "select * from flowlane.claim_tasks(%s, 1, %s, %s::jsonb)", (queue, WORKER, '[["chain", "b"]]')
    )
    assert (row["msg_id"], row["input"], row["flow_input"]) == (msg_id, {"a": {"out": 3}}, {"n": 2})
    queue, msg_id = _map_element(engine)
    (row,) = engine.rows(
        "select * from flowlane.start_tasks(%s, array[%s::bigint], %s, %s::jsonb)",
        (queue, msg_id, WORKER, '[["mapped", "m"]]'),
    )
    assert (row["task_index"], row["input"], row["flow_input"]) == (1, 20, [10, 20, 30])


def test_a_claim_of_one_message_takes_the_one_message_path(engine: Engine) -> None:
    queue, _ = _queued(engine)
    with engine.conn.transaction():
        engine.conn.execute("set local track_functions = 'all'")
        (row,) = engine.rows(
            "select * from flowlane.claim_tasks(%s, 5, %s, %s::jsonb)", (queue, WORKER, '[["one", "a"]]')
        )
        calls = engine.row(
            "select pg_stat_get_xact_function_calls('flowlane._claim_one'::regproc) as one, "
            "coalesce(pg_stat_get_xact_function_calls('flowlane._start_tasks'::regproc), 0) as batch"
        )
    assert row["outcome"] == "claimed"
    assert calls == {"one": 1, "batch": 0}


@pytest.mark.parametrize(
    "call",
    [
        "select * from flowlane.claim_tasks('one', 1, null, '[[\"one\", \"a\"]]'::jsonb)",
        "select * from flowlane.start_tasks('one', array[%s::bigint], null, '[[\"one\", \"a\"]]'::jsonb)",
    ],
)
def test_a_claim_of_one_message_without_a_worker_id_is_refused(engine: Engine, call: str) -> None:
    _, msg_id = _queued(engine)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="worker_id is required"):
        engine.rows(call, (msg_id,) if "%s" in call else None)
    assert (
        engine.scalar("select status from flowlane.step_tasks where message_id = %s", (msg_id,)) == "queued"
    )
