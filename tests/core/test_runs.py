"""start_flow, claiming with start_tasks, complete_task(s), maps, DAGs, run output."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowlane.testing.harness import install_clock
from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def test_start_flow_creates_run_states_and_root_tasks(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", [], {}), ("c", ["a", "b"], {})])
    run_id = engine.start("f", {"x": 1})
    run = engine.run(run_id)
    assert (run["status"], run["remaining_steps"], run["input"]) == ("started", 3, {"x": 1})
    states = engine.states(run_id)
    assert {k: v["status"] for k, v in states.items()} == {
        "a": "started",
        "b": "started",
        "c": "created",
    }
    assert states["c"]["remaining_deps"] == 2
    assert (states["a"]["initial_tasks"], states["a"]["remaining_tasks"]) == (1, 1)
    tasks = engine.tasks(run_id)
    assert [(t["step_slug"], t["status"], t["attempts_count"]) for t in tasks] == [
        ("a", "queued", 0),
        ("b", "queued", 0),
    ]
    messages = engine.queue_messages("f")
    assert sorted(m["msg_id"] for m in messages) == sorted(t["message_id"] for t in tasks)
    assert {m["message"]["step_slug"] for m in messages} == {"a", "b"}
    assert all(
        m["message"]["run_id"] == str(run_id) and m["message"]["flow_slug"] == "f" for m in messages
    )


def test_start_flow_with_given_run_id(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    given = uuid.uuid4()
    assert engine.start("f", {}, run_id=given) == given


def _milliseconds(run_id: uuid.UUID) -> int:
    return run_id.int >> 80  # a version 7 UUID's first 48 bits


def _epoch_milliseconds(at: datetime) -> int:
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def test_runs_get_ids_that_sort_in_the_order_they_start(engine: Engine) -> None:
    # time-ordered ids (version 7): a new run's index entries land beside the last run's
    install_clock(engine.conn)
    engine.define("f", [("a", [], {})])
    starts = []
    for _ in range(3):
        one = engine.start("f", {})
        batch = [r[0] for r in engine.conn.execute(
            "select run_id from flowlane.start_flows('f', array['{}', '{}']::jsonb[])")]
        starts.append([one, *batch])
        engine.conn.execute("select flowlane_testing.advance(3600)")
    ids = [run_id for started in starts for run_id in started]
    assert {(run_id.version, run_id.variant) for run_id in ids} == {(7, uuid.RFC_4122)}
    for run_id in ids:  # the id's time is the engine's clock, within the hour before the next starts
        started_at = _epoch_milliseconds(engine.run(run_id)["started_at"])
        assert started_at <= _milliseconds(run_id) < started_at + 3_600_000
    assert [max(started) < min(later) for started, later in itertools.pairwise(starts)] == [True, True]
    assert len(set(ids)) == len(ids)


def test_the_run_id_function_is_inlined(engine: Engine) -> None:
    plan = "\n".join(r[0] for r in engine.conn.execute(
        "explain (verbose, costs off) select flowlane._uuid_v7()").fetchall())
    assert "gen_random_uuid()" in plan and "_uuid_v7" not in plan


def test_start_flow_unknown_flow(engine: Engine) -> None:
    with pytest.raises(psycopg.Error, match='unknown flow "ghost"'):
        engine.start("ghost", {})


def test_start_flow_null_input_rejected(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    with pytest.raises(psycopg.Error, match="input must not be null"):
        engine.conn.execute("select flowlane.start_flow('f', null)")


@pytest.mark.parametrize("bad", [{"a": 1}, "s", 1, None])
def test_root_map_needs_array_input(engine: Engine, bad: Any) -> None:
    engine.define("f", [("m", [], {"step_type": "map"})])
    with pytest.raises(psycopg.Error, match="must be a JSON array"):
        engine.conn.execute("select flowlane.start_flow('f', %s)", (Jsonb(bad),))
    assert engine.scalar("select count(*) from flowlane.runs") == 0


def test_start_delay_delays_first_message(engine: Engine) -> None:
    engine.define("f", [("a", [], {"start_delay": 100})])
    engine.start("f", {})
    [message] = engine.queue_messages("f")
    assert 95 < message["vt_in"] <= 100
    assert engine.claim("f") == []


def test_claim_returns_task_record(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {"hello": "world"})
    [task] = engine.claim("f")
    assert task["flow_slug"] == "f" and task["step_slug"] == "a" and task["run_id"] == run_id
    assert (task["task_index"], task["attempt"]) == (0, 1)
    assert task["input"] == {"hello": "world"}
    assert task["flow_input"] == {"hello": "world"}
    row = engine.task(run_id, "a")
    assert (row["status"], row["attempts_count"], row["last_worker_id"]) == (
        "started",
        1,
        engine.worker_id,
    )
    assert row["started_at"] is not None and row["message_id"] == task["msg_id"]


@pytest.mark.parametrize(
    ("flow_timeout", "step_timeout", "expected"), [(60, None, 62), (60, 5, 7), (10, 300, 302)]
)
def test_claim_visibility_is_effective_timeout_plus_two(
    engine: Engine, flow_timeout: int, step_timeout: int | None, expected: int
) -> None:
    engine.define("f", [("a", [], {"timeout": step_timeout})], timeout=flow_timeout)
    engine.start("f", {})
    [task] = engine.claim("f")
    vt_in = engine.vt_in("f", task["msg_id"])
    assert expected - 2 < vt_in <= expected


def test_claim_benign_duplicates_ignored(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    msg = engine.read("f")
    [task] = engine.start_tasks("f", msg)
    # same message again (e.g. visibility expired): already started, no second claim
    assert engine.start_tasks("f", msg, uuid.uuid4()) == []
    row = engine.task(run_id, "a")
    assert (row["attempts_count"], row["last_worker_id"]) == (1, engine.worker_id)
    engine.complete(task, 1)
    # terminal task: still nothing, nothing changes
    assert engine.start_tasks("f", msg) == []
    assert engine.task(run_id, "a")["status"] == "completed"
    # a message no task tracks is foreign work: reported, never claimed or dropped
    [foreign] = engine.classify("f", [999999], [("f", "a")])
    assert (foreign["outcome"], foreign["flow_slug"], foreign["msg_id"]) == ("unsupported", None, 999999)


def test_claim_only_queued_tasks_of_given_flow(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.define("g", [("a", [], {})])
    engine.start("f", {})
    engine.start("g", {})
    f_msgs = engine.read("f")
    g_msgs = engine.read("g")
    # message ids are per queue: the same numbers exist on both queues
    assert f_msgs == g_msgs
    [task] = engine.start_tasks("g", g_msgs)
    assert task["flow_slug"] == "g"
    assert engine.scalar("select count(*) from flowlane.step_tasks where status = 'started'") == 1


@pytest.mark.no_invariants  # the queue/message is removed on purpose
def test_claim_rolls_back_when_message_missing(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    [msg] = engine.read("f")
    engine.conn.execute("select pgmq.delete('f', %s::bigint)", (msg,))
    with pytest.raises(psycopg.Error, match="claim aborted"):
        engine.start_tasks("f", [msg])
    row = engine.task(run_id, "a")
    assert (row["status"], row["attempts_count"], row["last_worker_id"]) == ("queued", 0, None)


def test_single_step_completion_and_run_output(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    run_id = engine.start("f", {})
    [task] = engine.claim("f")
    row = engine.complete(task, {"ok": True})
    assert row is not None and row["status"] == "completed" and row["output"] == {"ok": True}
    run = engine.run(run_id)
    assert (run["status"], run["output"], run["remaining_steps"]) == (
        "completed",
        {"a": {"ok": True}},
        0,
    )
    assert run["completed_at"] is not None
    assert engine.queue_messages("f") == []
    assert engine.archived_ids("f") == [task["msg_id"]]
    state = engine.states(run_id)["a"]
    assert (state["status"], state["output"], state["remaining_tasks"]) == (
        "completed",
        {"ok": True},
        0,
    )


def test_chain_passes_outputs_as_inputs(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {}), ("c", ["b"], {})])
    run_id = engine.start("f", {"n": 1})
    seen: list[tuple[str, Any]] = []

    def handler(task: dict[str, Any]) -> Any:
        seen.append((task["step_slug"], task["input"]))
        assert task["flow_input"] == {"n": 1}
        return {"step": task["step_slug"]}

    assert engine.drive("f", handler) == 3
    assert seen == [("a", {"n": 1}), ("b", {"a": {"step": "a"}}), ("c", {"b": {"step": "b"}})]
    assert engine.run(run_id)["output"] == {"c": {"step": "c"}}


def test_map_outputs_aggregated_in_index_order_when_completed_out_of_order(engine: Engine) -> None:
    engine.define("f", [("m", [], {"step_type": "map"}), ("after", ["m"], {})])
    run_id = engine.start("f", [10, 20, 30, 40])
    tasks = engine.claim("f")
    assert [t["input"] for t in tasks] == [10, 20, 30, 40]
    assert [t["task_index"] for t in tasks] == [0, 1, 2, 3]
    for task in [tasks[2], tasks[0], tasks[3]]:
        engine.complete(task, task["input"] + 1)
        state = engine.states(run_id)["m"]
        assert state["status"] == "started" and state["output"] is None
    assert engine.states(run_id)["m"]["remaining_tasks"] == 1
    engine.complete(tasks[1], 21)
    state = engine.states(run_id)["m"]
    assert (state["status"], state["output"]) == ("completed", [11, 21, 31, 41])
    [after] = engine.claim("f")
    assert after["input"] == {"m": [11, 21, 31, 41]}
    engine.complete(after, "done")
    assert engine.run(run_id)["output"] == {"after": "done"}


def test_dependent_map_sized_from_single_parent(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("list", [], {}),
            ("each", ["list"], {"step_type": "map"}),
            ("again", ["each"], {"step_type": "map"}),
        ],
    )
    run_id = engine.start("f", {})
    assert engine.states(run_id)["each"]["initial_tasks"] is None
    [lst] = engine.claim("f")
    engine.complete(lst, ["a", "b", "c"])
    assert engine.states(run_id)["each"]["initial_tasks"] == 3
    assert engine.states(run_id)["again"]["initial_tasks"] is None
    each = engine.claim("f")
    assert [t["input"] for t in each] == ["a", "b", "c"]
    for t in each:
        engine.complete(t, t["input"].upper())
    assert engine.states(run_id)["again"]["initial_tasks"] == 3
    again = engine.claim("f")
    assert [t["input"] for t in again] == ["A", "B", "C"]
    for t in reversed(again):
        engine.complete(t, t["input"] * 2)
    assert engine.run(run_id)["output"] == {"again": ["AA", "BB", "CC"]}


def test_diamond_dag_output_of_leaves(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("root", [], {}),
            ("left", ["root"], {}),
            ("right", ["root"], {}),
            ("join", ["left", "right"], {}),
            ("side", ["root"], {}),
        ],
    )
    run_id = engine.start("f", {"v": 2})
    inputs: dict[str, Any] = {}

    def handler(task: dict[str, Any]) -> Any:
        inputs[task["step_slug"]] = task["input"]
        return {"root": 1, "left": 2, "right": 3, "join": 4, "side": 5}[task["step_slug"]]

    assert engine.drive("f", handler) == 5
    assert inputs["join"] == {"left": 2, "right": 3}
    assert inputs["left"] == {"root": 1} == inputs["right"]
    run = engine.run(run_id)
    assert run["status"] == "completed"
    assert run["output"] == {"join": 4, "side": 5}
    assert set(engine.statuses(run_id).values()) == {"completed"}
    assert engine.queue_messages("f") == []


def test_diamond_with_map_and_condition_end_to_end(engine: Engine) -> None:
    """The acceptance scenario: diamond + map + conditions, purely through SQL functions."""
    engine.define(
        "shop",
        [
            ("fetch", [], {}),
            ("items", ["fetch"], {"step_type": "map"}),
            ("alert", ["fetch"], {"required_input_pattern": {"fetch": [{"urgent": True}]}}),
            ("audit", ["fetch"], {"required_input_pattern": {"fetch": [{"audit": True}]}}),
            ("report", ["items", "alert", "audit"], {}),
        ],
    )
    run_id = engine.start("shop", {"shop": 7})
    [fetch] = engine.claim("shop")
    assert fetch["input"] == {"shop": 7}
    engine.complete(fetch, [{"urgent": True}, 2, 3])
    statuses = engine.statuses(run_id)
    assert statuses == {
        "fetch": "completed",
        "items": "started",
        "alert": "started",
        "audit": "skipped",
        "report": "created",
    }
    assert engine.states(run_id)["audit"]["skip_reason"] == "condition_unmet"
    assert engine.states(run_id)["report"]["remaining_deps"] == 2
    claimed = engine.claim("shop")
    assert sorted(t["step_slug"] for t in claimed) == ["alert", "items", "items", "items"]
    for t in reversed(claimed):
        engine.complete(t, "paged" if t["step_slug"] == "alert" else {"i": t["task_index"]})
    [report] = engine.claim("shop")
    # the skipped dep is absent from the input; the map output is in task order
    assert report["input"] == {"items": [{"i": 0}, {"i": 1}, {"i": 2}], "alert": "paged"}
    engine.complete(report, "sent")
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"report": "sent"})
    assert engine.queue_messages("shop") == []
    assert len(engine.archived_ids("shop")) == 6


def test_diamond_with_map_and_met_condition(engine: Engine) -> None:
    engine.define(
        "shop",
        [
            ("fetch", [], {}),
            ("items", ["fetch"], {"step_type": "map"}),
            ("gate", ["fetch"], {"forbidden_input_pattern": {"fetch": [99]}}),
            ("total", ["items", "gate"], {}),
            ("note", ["gate"], {}),
        ],
    )
    run_id = engine.start("shop", {})
    engine.drive(
        "shop",
        lambda t: (
            [1, 2]
            if t["step_slug"] == "fetch"
            else {
                "items": t["input"] * 10 if isinstance(t["input"], int) else None,
                "gate": "open",
                "total": t["input"],
                "note": "n",
            }[t["step_slug"]]
        ),
    )
    run = engine.run(run_id)
    assert run["status"] == "completed"
    assert run["output"] == {"total": {"items": [10, 20], "gate": "open"}, "note": "n"}


def test_complete_tasks_batch(engine: Engine) -> None:
    engine.define("f", [("m", [], {"step_type": "map"})])
    run_id = engine.start("f", [1, 2, 3])
    tasks = engine.claim("f")
    payload = [
        {
            "run_id": str(t["run_id"]),
            "step_slug": t["step_slug"],
            "task_index": t["task_index"],
            "output": t["input"] * 100,
            "worker_id": str(engine.worker_id),
            "attempt": t["attempt"],
        }
        for t in reversed(tasks)
    ]
    rows = engine.rows("select * from flowlane.complete_tasks(%s)", (Jsonb(payload),))
    assert sorted(r["task_index"] for r in rows) == [0, 1, 2]
    assert all(r["status"] == "completed" for r in rows)
    assert engine.run(run_id)["output"] == {"m": [100, 200, 300]}
    # replay of the whole batch: no-op, same rows
    again = engine.rows("select * from flowlane.complete_tasks(%s)", (Jsonb(payload),))
    assert [r["output"] for r in again] == [r["output"] for r in rows]


def test_complete_tasks_requires_array(engine: Engine) -> None:
    with pytest.raises(psycopg.Error, match="must be a JSON array"):
        engine.conn.execute("select * from flowlane.complete_tasks('{}')")


def test_type_violation_fails_run_without_retry(engine: Engine) -> None:
    engine.define(
        "f", [("a", [], {"max_attempts": 5}), ("m", ["a"], {"step_type": "map"}), ("other", [], {})]
    )
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    row = engine.complete(tasks["a"], {"not": "an array"})
    assert row is not None and row["status"] == "failed"
    assert row["error_message"].startswith("[TYPE_VIOLATION]")
    assert row["output"] == {"not": "an array"}
    run = engine.run(run_id)
    assert run["status"] == "failed" and "TYPE_VIOLATION" in run["error_message"]
    assert engine.states(run_id)["a"]["status"] == "failed"
    assert engine.task(run_id, "other")["status"] == "cancelled"
    assert engine.queue_messages("f") == []
    assert engine.task(run_id, "a")["attempts_count"] == 1


def test_get_run_with_states(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})])
    run_id = engine.start("f", {"q": 1})
    doc = engine.scalar("select flowlane.get_run_with_states(%s)", (run_id,))
    assert doc["run"]["run_id"] == str(run_id) and doc["run"]["input"] == {"q": 1}
    assert [s["step_slug"] for s in doc["steps"]] == ["a", "b"]
    assert [(t["step_slug"], t["status"]) for t in doc["tasks"]] == [("a", "queued")]
    assert engine.scalar("select flowlane.get_run_with_states(%s)", (uuid.uuid4(),)) is None


def test_many_runs_share_the_flow_queue(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {})])
    runs = [engine.start("f", {"i": i}) for i in range(5)]
    assert engine.drive("f", lambda t: t["input"]) == 10
    for i, run_id in enumerate(runs):
        assert engine.run(run_id)["output"] == {"b": {"a": {"i": i}}}


def test_start_flow_with_same_run_id_is_idempotent(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.define("g", [("a", [], {})])
    given = uuid.uuid4()
    assert engine.start("f", {"x": 1}, run_id=given) == given
    assert engine.start("f", {"x": 1}, run_id=given) == given
    assert engine.scalar("select count(*) from flowlane.step_tasks") == 1
    assert len(engine.queue_messages("f")) == 1
    with pytest.raises(psycopg.Error, match="already exists"):
        engine.start("f", {"x": 2}, run_id=given)
    with pytest.raises(psycopg.Error, match="already exists"):
        engine.start("g", {"x": 1}, run_id=given)


def test_flow_without_steps_completes_at_start(engine: Engine) -> None:
    engine.create_flow("empty")
    run_id = engine.start("empty", {"x": 1})
    run = engine.run(run_id)
    assert (run["status"], run["output"], run["remaining_steps"]) == ("completed", {}, 0)


def test_wide_map_fan_out_and_fan_in(engine: Engine) -> None:
    engine.define("wide", [("m", [], {"step_type": "map"}), ("sum", ["m"], {})])
    run_id = engine.start("wide", list(range(300)))
    tasks = engine.claim("wide")
    assert len(tasks) == 300 and len({t["msg_id"] for t in tasks}) == 300
    payload = [
        {
            "run_id": str(t["run_id"]),
            "step_slug": "m",
            "task_index": t["task_index"],
            "output": t["input"] * 2,
            "worker_id": str(engine.worker_id),
            "attempt": t["attempt"],
        }
        for t in reversed(tasks)
    ]
    engine.rows("select * from flowlane.complete_tasks(%s)", (Jsonb(payload),))
    [total] = engine.claim("wide")
    assert total["input"] == {"m": [i * 2 for i in range(300)]}
    engine.complete(total, sum(total["input"]["m"]))
    assert engine.run(run_id)["output"] == {"sum": 89700}


@pytest.mark.parametrize(
    ("bad_item", "message"),
    [
        (1, "item 1 must be an object"),
        ({}, "item 1 has no run_id"),
        ({"run_id": "x", "step_slug": "m", "task_index": 0}, "item 1: run_id must be a uuid"),
        ({"step_slug": "m", "task_index": 0}, "item 1 has no run_id"),
        ({"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": "m", "task_index": 1.5},
         "item 1: task_index must be an integer"),
        ({"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": "m", "task_index": 0,
          "worker_id": 5}, "item 1: worker_id must be a uuid"),
        ({"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": "m", "task_index": 0,
          "attempt": 1}, "item 1 has no worker_id"),
        ({"run_id": "00000000-0000-0000-0000-000000000000", "step_slug": "m", "task_index": 0,
          "worker_id": "00000000-0000-0000-0000-000000000000"}, "item 1 has no attempt"),
    ],
)
def test_complete_tasks_malformed_item_applies_nothing(engine: Engine, bad_item: Any,
                                                       message: str) -> None:
    engine.define("f", [("m", [], {"step_type": "map"})])
    run_id = engine.start("f", [1])
    (task,) = engine.claim("f")
    good = {"run_id": str(run_id), "step_slug": "m", "task_index": 0, "output": 1,
            "worker_id": str(engine.worker_id), "attempt": task["attempt"]}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        engine.conn.execute("select * from flowlane.complete_tasks(%s)", (Jsonb([good, bad_item]),))
    assert engine.task(run_id, "m")["status"] == "started"
    engine.complete(task, 1)
