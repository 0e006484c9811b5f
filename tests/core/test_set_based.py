"""0009: set-based completions and failures, batched starts, one-round-trip claims."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow


def _item(engine: Engine, task: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "run_id": str(task["run_id"]),
        "step_slug": task["step_slug"],
        "task_index": task["task_index"],
        "worker_id": str(engine.worker_id),
        "attempt": task["attempt"],
        **fields,
    }


def _complete_tasks(engine: Engine, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return engine.rows("select * from flowlane.complete_tasks(%s)", (Jsonb(items),))


def _fail_tasks(engine: Engine, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return engine.rows("select * from flowlane.fail_tasks(%s)", (Jsonb(items),))


def _start_flows(engine: Engine, flow: str, inputs: list[Any]) -> list[dict[str, Any]]:
    return engine.rows(
        "select * from flowlane.start_flows(%s, %s::jsonb[])", (flow, [json.dumps(x) for x in inputs])
    )


def test_start_flows_starts_runs_in_input_order_and_sends_their_tasks(engine: Engine) -> None:
    engine.define("fan", [("root", [], {"step_type": "map"}), ("after", ["root"], {})])
    engine.conn.execute("select flowlane.set_alias('fan_latest', 'fan')")
    runs = _start_flows(engine, "fan_latest", [[1, 2], [], [3]])
    assert [r["input"] for r in runs] == [[1, 2], [], [3]]
    assert {r["flow_slug"] for r in runs} == {"fan"}
    # the empty map completed at once and released its child
    assert engine.statuses(runs[1]["run_id"]) == {"root": "completed", "after": "started"}
    bodies = sorted(
        (str(m["message"]["run_id"]), m["message"]["step_slug"], m["message"]["task_index"])
        for m in engine.queue_messages("fan")
    )
    first, empty, last = (str(r["run_id"]) for r in runs)
    assert bodies == sorted(
        [(first, "root", 0), (first, "root", 1), (empty, "after", 0), (last, "root", 0)]
    )
    assert _start_flows(engine, "fan", []) == []


def test_start_flows_with_a_bad_input_starts_no_run(engine: Engine) -> None:
    engine.define("fan", [("root", [], {"step_type": "map"})])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="input 1: root map step"):
        _start_flows(engine, "fan", [[1], {"not": "an array"}, [2]])
    assert engine.scalar("select count(*) from flowlane.runs") == 0
    assert engine.queue_messages("fan") == []


def test_a_batch_rejects_stale_items_one_by_one_and_applies_the_rest(engine: Engine) -> None:
    engine.define("fan", [("root", [], {"step_type": "map"})])
    run_id = engine.start("fan", [1, 2, 3, 4])
    tasks = sorted(engine.claim("fan"), key=lambda t: t["task_index"])
    rows = _complete_tasks(
        engine,
        [
            _item(engine, tasks[0], output="ok"),
            _item(engine, tasks[1], output="stale attempt", attempt=tasks[1]["attempt"] + 1),
            _item(engine, tasks[2], output="other worker", worker_id=str(uuid.uuid4())),
            _item(engine, tasks[3], output="first"),
            _item(engine, tasks[3], output="duplicate"),
        ],
    )
    assert [(r["task_index"], r["status"]) for r in rows] == [
        (0, "completed"), (1, "started"), (2, "started"), (3, "completed"), (3, "completed"),
    ]
    assert [t["output"] for t in engine.tasks(run_id)] == ["ok", None, None, "first"]
    assert engine.states(run_id)["root"]["remaining_tasks"] == 2
    _complete_tasks(engine, [_item(engine, tasks[1], output="b"), _item(engine, tasks[2], output="c")])
    assert engine.run(run_id)["output"] == {"root": ["ok", "b", "c", "first"]}


def test_fail_tasks_records_each_items_error_type_and_traceback(engine: Engine) -> None:
    engine.define("fan", [("root", [], {"step_type": "map", "max_attempts": 2, "base_delay": 0})])
    run_id = engine.start("fan", [1, 2])
    first, second = sorted(engine.claim("fan"), key=lambda t: t["task_index"])
    rows = _fail_tasks(
        engine,
        [
            _item(engine, first, error_message="ValueError: x", error_type="ValueError", traceback="tb 0"),
            _item(engine, second, error_message="KeyError: y", error_type="KeyError", traceback="tb 1"),
        ],
    )
    assert [r["status"] for r in rows] == ["queued", "queued"]
    attempts = engine.rows(
        "select task_index, outcome, error_type, error_message, traceback from flowlane.task_attempts "
        "where run_id = %s order by task_index",
        (run_id,),
    )
    assert attempts == [
        {"task_index": 0, "outcome": "retry", "error_type": "ValueError", "error_message": "ValueError: x",
         "traceback": "tb 0"},
        {"task_index": 1, "outcome": "retry", "error_type": "KeyError", "error_message": "KeyError: y",
         "traceback": "tb 1"},
    ]
    assert all(engine.vt_in("fan", t["msg_id"]) <= 0 for t in (first, second))  # base_delay 0


def test_an_exhausted_task_fails_its_run_after_1_attempt_not_1_attempts(engine: Engine) -> None:
    engine.define("one", [("a", [], {"max_attempts": 1})])
    run_id = engine.start("one", {})
    [task] = engine.claim("one")
    engine.fail(task, "boom")
    assert engine.run(run_id)["error_message"] == "step a task 0 failed after 1 attempt: boom"


def test_a_type_violation_in_a_batch_applies_item_by_item_in_key_order(engine: Engine) -> None:
    engine.define(
        "vio",
        [("a", [], {}), ("b", [], {}), ("m", ["b"], {"step_type": "map"})],
    )
    run_id = engine.start("vio", {})
    a, b = sorted(engine.claim("vio"), key=lambda t: t["step_slug"])
    _complete_tasks(engine, [_item(engine, b, output={"not": "an array"}), _item(engine, a, output=1)])
    # key order: a completes first, then b's output fails the run
    assert engine.task(run_id, "a")["status"] == "completed"
    assert engine.task(run_id, "b")["error_message"].startswith("[TYPE_VIOLATION] step b feeds map step m")
    assert engine.run(run_id)["status"] == "failed"


def test_claim_tasks_sends_the_run_input_once_per_run(engine: Engine) -> None:
    engine.define("fan", [("root", [], {"step_type": "map"})])
    big = [{"payload": "x" * 1000, "i": i} for i in range(5)]
    first = engine.start("fan", big)
    second = engine.start("fan", [1, 2])
    pairs = json.dumps([["fan", "root"]])
    rows = engine.rows(
        "select * from flowlane.claim_tasks('fan', 50, %s, %s::jsonb) order by msg_id",
        (engine.worker_id, pairs),
    )
    assert [r["outcome"] for r in rows] == ["claimed"] * 7
    with_input = [(r["run_id"], r["flow_input"]) for r in rows if r["flow_input"] is not None]
    assert with_input == [(first, big), (second, [1, 2])]
    assert [r["input"] for r in rows] == [*big, 1, 2]
    assert {t["status"] for t in engine.tasks(first)} == {"started"}


def test_claim_tasks_hands_back_a_batch_with_unsupported_work(engine: Engine) -> None:
    engine.define("two", [("a", [], {}), ("b", [], {})])
    run_id = engine.start("two", {})
    rows = engine.rows(
        "select outcome, step_slug, msg_id from flowlane.claim_tasks('two', 50, %s, %s::jsonb) "
        "order by msg_id",
        (engine.worker_id, json.dumps([["two", "a"]])),
    )
    ids = sorted(t["message_id"] for t in engine.tasks(run_id))
    by_step = {t["step_slug"]: t["message_id"] for t in engine.tasks(run_id)}
    assert sorted(r["msg_id"] for r in rows) == ids
    assert {(r["outcome"], r["step_slug"]) for r in rows} == {("unsupported", "b"), ("handed_back", None)}
    assert [r["msg_id"] for r in rows if r["outcome"] == "handed_back"] == [by_step["a"]]
    assert {(t["status"], t["attempts_count"]) for t in engine.tasks(run_id)} == {("queued", 0)}
    assert all(engine.vt_in("two", m) <= 0 for m in ids)


def _index_entries_read_by_claim(engine: Engine, queue: str, qty: int, indexes: str) -> tuple[int, int]:
    """Tasks claimed by one claim of ``qty``, and the entries that scans of the indexes
    ``indexes`` selects (a condition on pg_index ``i``) returned during it."""
    read = f"select sum(pg_stat_get_xact_tuples_returned(i.indexrelid)) from pg_index i where {indexes}"
    with engine.conn.transaction():
        before = engine.scalar(read)
        claimed = len(engine.claim(queue, qty=qty))
        return claimed, engine.scalar(read) - before


def test_a_batch_claim_reads_only_the_tasks_of_its_messages(engine: Engine) -> None:
    # a generic plan of PostgreSQL 15 kept `message_id = any (...)` as a filter and read every
    # task the queue had, completed ones included, in each lookup of the claim
    engine.define("one", [("a", [], {})])
    _start_flows(engine, "one", [{"i": i} for i in range(200)])
    for task in engine.claim("one"):
        engine.complete(task, {})
    _start_flows(engine, "one", [{"i": i} for i in range(3)])
    index = "flowlane.step_tasks_queue_message_unique"
    claimed, read = _index_entries_read_by_claim(engine, "one", 10, f"i.indexrelid = '{index}'::regclass")
    assert claimed == 3
    assert 3 <= read <= 3 * 3  # each of the claim's three lookups reads the batch's three tasks
    assert_invariants(engine)


def test_a_batch_claim_reads_only_the_runs_of_its_tasks(engine: Engine) -> None:
    # a generic plan of PostgreSQL 15 joined the claimed tasks' steps to their runs by flow:
    # through runs_flow_idx, every run of the flow for every task. It took that plan when the
    # runs had been analyzed while there were none (autovacuum does so on a new database) and
    # a few thousand had been written since, at the first claim of the session.
    engine.define("one", [("a", [], {})])
    engine.conn.execute("analyze flowlane.runs")
    _start_flows(engine, "one", [{"i": i} for i in range(4000)])
    claimed, read = _index_entries_read_by_claim(engine, "one", 100, "i.indrelid = 'flowlane.runs'::regclass")
    assert claimed == 100
    assert read <= 100 * 10  # a few reads of each claimed task's run, not the flow's 4,000 runs


def _index_entries_read(engine: Engine, table: str, call: str, *params: Any) -> int:
    """The entries that scans of ``table``'s indexes returned during ``call``."""
    read = ("select sum(pg_stat_get_xact_tuples_returned(i.indexrelid)) from pg_index i"
            f" where i.indrelid = '{table}'::regclass")
    with engine.conn.transaction():
        before = engine.scalar(read)
        engine.conn.execute(call, params)
        return int(engine.scalar(read) - before)


def test_a_start_reads_only_its_own_run(engine: Engine) -> None:
    # planned at the session's first start, while runs held one row (and had been analyzed
    # so), the lookup of the started steps' runs read every run through runs_pkey, on every
    # later start
    engine.define("one", [("a", [], {})])
    engine.start("one", {})
    engine.conn.execute("vacuum analyze flowlane.runs")
    engine.start("one", {})
    _start_flows(engine, "one", [{"i": i} for i in range(2000)])
    read = _index_entries_read(engine, "flowlane.runs", "select flowlane.start_flow('one', '{}')")
    assert read <= 10, read  # a few reads of its own run, not the 2,002 others


def test_claim_tasks_refuses_a_bad_quantity(engine: Engine) -> None:
    engine.define("one", [("a", [], {})])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="qty must be at least 1"):
        engine.rows("select * from flowlane.claim_tasks('one', 0, %s, '[]')", (engine.worker_id,))


def test_complete_tasks_names_a_bad_item(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="item 1: attempt must be an integer"):
        _complete_tasks(
            engine,
            [
                {"run_id": str(uuid.uuid4()), "step_slug": "a", "task_index": 0,
                 "worker_id": str(engine.worker_id), "attempt": 1},
                {"run_id": str(uuid.uuid4()), "step_slug": "a", "task_index": 0, "attempt": "x"},
            ],
        )


BAD_ITEMS: dict[str, tuple[list[Any], str]] = {
    # the first bad item by position is named, whatever is wrong with a later one
    "a later item is not an object": (
        [{"task_index": "x"}, 5],
        'item 0: task_index must be an integer, got "x"',
    ),
    "an integer out of range": (
        [{"task_index": "99999999999"}, {"run_id": "nope"}],
        r"item 0: task_index must be an integer, got \"99999999999\"",
    ),
    "a run id that is not a uuid": ([{}, {"run_id": "nope"}], "item 1: run_id must be a uuid"),
    "a worker id that is not a uuid": ([{}, {"worker_id": 7}], "item 1: worker_id must be a uuid"),
    "an item that is not an object": ([{}, [1]], "item 1 must be an object .*, got array"),
    "a missing key": ([{}, {"step_slug": None}], "item 1 has no step_slug"),
    "no claim to fence by": ([{}, {"attempt": None}], "item 1 has no attempt"),
}


@pytest.mark.parametrize("case", list(BAD_ITEMS))
def test_complete_and_fail_tasks_name_the_first_bad_item(engine: Engine, case: str) -> None:
    changes, message = BAD_ITEMS[case]
    good = {"run_id": str(uuid.uuid4()), "step_slug": "a", "task_index": 0, "worker_id": str(uuid.uuid4()),
            "attempt": 1}
    items = [{**good, **change} if isinstance(change, dict) else change for change in changes]
    for send in (_complete_tasks, _fail_tasks):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            send(engine, items)


def test_complete_tasks_reads_every_spelling_its_casts_accept(engine: Engine) -> None:
    engine.define("one", [("a", [], {})])
    run_id = engine.start("one", {})
    [task] = engine.claim("one")
    item = {
        "run_id": "{" + str(run_id).upper() + "}",  # braces and capitals: still a uuid
        "step_slug": "a",
        "task_index": " 0",
        "worker_id": str(engine.worker_id).replace("-", ""),
        "attempt": str(task["attempt"]),
        "output": {"ok": True},
    }
    [row] = _complete_tasks(engine, [item])
    assert (row["status"], engine.run(run_id)["status"]) == ("completed", "completed")
    assert_invariants(engine)


def test_claims_in_flight_across_the_upgrade_from_the_original_core_complete_in_a_batch(
        db_factory: Any) -> None:
    from flowlane.core import migrator

    with psycopg.connect(db_factory("0002"), autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("fan", [("root", [], {"step_type": "map", "max_attempts": 1}), ("after", ["root"], {})])
        run_id = engine.start("fan", [1, 2, 3])
        failing = engine.start("fan", [9])
        claimed = engine.claim("fan")
        assert [m.version for m in migrator.migrate(conn)] == [m.version for m in migrator.discover()][2:]
        mine = [t for t in claimed if t["run_id"] == run_id]
        [other] = [t for t in claimed if t["run_id"] == failing]
        _complete_tasks(engine, [_item(engine, t, output=t["input"] * 10) for t in mine])
        _fail_tasks(engine, [_item(engine, other, error_message="boom")])
        assert engine.states(run_id)["root"]["output"] == [10, 20, 30]
        assert engine.statuses(run_id) == {"root": "completed", "after": "started"}
        assert engine.run(failing)["error_message"] == "step root task 0 failed after 1 attempt: boom"
        assert engine.scalar("select count(*) from flowlane.task_attempts where run_id = %s", (failing,)) == 1
        [after] = engine.claim("fan")
        engine.complete(after, "done")
        assert engine.run(run_id)["status"] == "completed"
        assert_invariants(engine)


def test_claim_tasks_leaves_a_message_queued_after_its_transaction_began(engine: Engine, dsn: str) -> None:
    engine.define("one", [("a", [], {})])
    pairs = json.dumps([["one", "a"]])
    with psycopg.connect(dsn) as claimer:  # a transaction that began before the run started
        claimer.execute("select now()")
        run_id = engine.start("one", {})
        rows = claimer.execute(
            "select outcome from flowlane.claim_tasks('one', 10, %s, %s::jsonb)", (engine.worker_id, pairs)
        ).fetchall()
        claimer.commit()
    assert rows == []
    [task] = engine.tasks(run_id)
    assert (task["status"], task["attempts_count"]) == ("queued", 0)
    assert engine.vt_in("one", task["message_id"]) <= 0
    claimed = engine.rows(
        "select run_id from flowlane.claim_tasks('one', 10, %s, %s::jsonb)", (engine.worker_id, pairs)
    )
    assert [r["run_id"] for r in claimed] == [run_id]


def test_a_batch_starts_the_plain_steps_it_makes_ready_with_their_tasks(engine: Engine) -> None:
    engine.define("chain", [("a", [], {}), ("b", ["a"], {}), ("c", ["b"], {})])
    runs = [engine.start("chain", {"n": n}) for n in range(3)]
    claimed = engine.claim("chain")
    rows = _complete_tasks(engine, [_item(engine, t, output={"n": 1}) for t in claimed])
    assert [(r["run_id"], r["status"]) for r in rows] == sorted((t["run_id"], "completed") for t in claimed)
    for run_id in runs:
        states = engine.states(run_id)
        assert (states["b"]["status"], states["b"]["remaining_tasks"]) == ("started", 1)
        assert states["c"]["status"] == "created" and states["c"]["remaining_deps"] == 1
        assert engine.task(run_id, "b")["status"] == "queued"
    assert sorted(t["run_id"] for t in engine.claim("chain")) == sorted(runs)


def test_a_batch_making_a_conditioned_step_ready_resolves_every_run_of_it(engine: Engine) -> None:
    engine.define("plain", [("a", [], {}), ("b", ["a"], {})])
    engine.define("gated", [("a", [], {}), ("b", ["a"], {"required_input_pattern": {"a": {"go": True}}})])
    plain, gated_on, gated_off = engine.start("plain"), engine.start("gated"), engine.start("gated")
    outputs = {plain: {"go": False}, gated_on: {"go": True}, gated_off: {"go": False}}
    claimed = engine.claim("plain") + engine.claim("gated")
    _complete_tasks(engine, [_item(engine, t, output=outputs[t["run_id"]]) for t in claimed])
    assert engine.task(plain, "b")["status"] == "queued"
    assert engine.task(gated_on, "b")["status"] == "queued"
    assert engine.states(gated_off)["b"]["status"] == "skipped"
    assert engine.run(gated_off)["status"] == "completed"
