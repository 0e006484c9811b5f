"""A single start written in its final state (_new_run) against the batch path.

Each shape is defined twice, as `<shape>_one` and `<shape>_all`. The same input is started
by `start_flow` on the first (one run: the one-run path where the flow qualifies) and as the
first of two inputs of `start_flows` on the second (always the batch path). Every column of
the run, its step states, tasks, queue messages and held tasks must agree, with ids, flow
names and times taken relative to the run's start.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

# (flow options, steps as (slug, deps, add_step options), input, takes the one-run path)
SHAPES: dict[str, tuple[dict[str, Any], list[tuple[str, list[str], dict[str, Any]]], Any, bool]] = {
    "chain": ({}, [("a", [], {}), ("b", ["a"], {}), ("c", ["b"], {})], {"n": 1}, True),
    "fan_in": (
        {"deadline": 60, "priority": 7},
        [
            ("a", [], {"start_delay": 30}),
            ("b", [], {}),
            ("c", ["a", "b"], {}),
            ("m", ["c"], {"step_type": "map"}),
        ],
        {"n": 2},
        True,
    ),
    "step_limit": (
        {},
        [("a", [], {"concurrency_limit": 2, "concurrency_key": "/k"}), ("b", ["a"], {})],
        {"k": "x"},
        True,
    ),
    "root_condition": (
        {},
        [("a", [], {"required_input_pattern": {"go": True}}), ("b", [], {})],
        {"go": False},
        False,
    ),
    "root_map": ({}, [("m", [], {"step_type": "map"}), ("b", [], {}), ("c", ["m"], {})], [1, 2, 3], True),
    "root_map_empty": ({}, [("m", [], {"step_type": "map"}), ("b", [], {}), ("c", ["m"], {})], [], False),
    "wait_root": ({}, [("w", [], {"step_type": "wait"}), ("b", ["w"], {})], {}, False),
    "flow_limit": ({"concurrency_limit": 2}, [("a", [], {})], {}, False),
}


def _run(engine: Engine, run_id: Any) -> dict[str, Any]:
    row = engine.row(
        "select status, remaining_steps, trace_parent, start_at, deadline_at - started_at as deadline_in, "
        "called_as, idempotency_key, priority, concurrency_key, hold_seq, input, output, "
        "(select count(*) from flowlane.step_slots s where s.run_id = r.run_id) as slots "
        "from flowlane.runs r where run_id = %s",
        (run_id,),
    )
    assert row is not None
    return row


def _states(engine: Engine, run_id: Any) -> list[tuple[Any, ...]]:
    return [
        tuple(r.values())
        for r in engine.rows(
            "select ss.step_slug, ss.status, ss.remaining_deps, ss.initial_tasks, ss.remaining_tasks, "
            "ss.output, ss.started_at - r.started_at as started_in, "
            "ss.created_at - r.started_at as created_in "
            "from flowlane.all_step_states ss join flowlane.runs r using (run_id) "
            "where ss.run_id = %s order by step_slug",
            (run_id,),
        )
    ]


def _tasks(engine: Engine, run_id: Any) -> list[tuple[Any, ...]]:
    return [
        tuple(r.values())
        for r in engine.rows(
            "select t.step_slug, t.task_index, t.status, t.attempts_count, "
            "(select count(*) from flowlane.held_tasks h where h.run_id = t.run_id "
            " and h.step_slug = t.step_slug) as held, t.started_at is not null as started "
            "from flowlane.step_tasks t where t.run_id = %s order by 1, 2",
            (run_id,),
        )
    ]


def _messages(engine: Engine, queue: str, run_id: Any) -> list[tuple[str, int]]:
    found = []
    for m in engine.queue_messages(queue):
        body = dict(m["message"])
        body.pop("flow_slug")
        if body.pop("run_id") == str(run_id):
            found.append((json.dumps(body, sort_keys=True), round(m["vt_in"] / 10)))
    return sorted(found)


def _batch_path_calls(engine: Engine) -> int:
    calls = "select pg_stat_get_xact_function_calls('flowlane._progress_runs'::regproc)"
    return int(engine.scalar(calls) or 0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_single_start_writes_what_the_batch_path_writes(engine: Engine, shape: str) -> None:
    options, steps, run_input, one_run_path = SHAPES[shape]
    one, all_ = f"{shape}_one", f"{shape}_all"
    engine.define(one, steps, **options)
    engine.define(all_, steps, **options)
    with engine.conn.transaction():
        engine.conn.execute("set local track_functions = 'all'")
        single = engine.start(one, run_input)
        batch_path = _batch_path_calls(engine)
        batch = engine.scalar(
            "select (array_agg(run_id order by ord))[1] from flowlane.start_flows(%s, "
            "array[%s::jsonb, %s::jsonb]) with ordinality as s (run_id, ord)",
            (all_, json.dumps(run_input), json.dumps(run_input)),
        )
        assert _batch_path_calls(engine) > batch_path
    assert batch_path == (0 if one_run_path else 1)
    assert _run(engine, single) == _run(engine, batch)
    assert _states(engine, single) == _states(engine, batch)
    assert _tasks(engine, single) == _tasks(engine, batch)
    assert _messages(engine, one, single) == _messages(engine, all_, batch)
    assert_invariants(engine)


def test_a_keyed_single_start_keeps_its_key(engine: Engine) -> None:
    engine.define("keyed", [("a", [], {})])
    start = "from flowlane.start_flow('keyed', '{}', idempotency_key => 'k1')"
    first = engine.row(f"select run_id, called_as, idempotency_key {start}")
    again = engine.row(f"select run_id {start}")
    assert first is not None and again is not None
    assert (first["called_as"], first["idempotency_key"]) == ("keyed", "k1")
    assert again["run_id"] == first["run_id"]
    assert engine.scalar("select count(*) from flowlane.step_tasks") == 1
