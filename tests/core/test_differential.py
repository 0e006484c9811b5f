"""Differential property: set-based batches mean the same as their items one by one.

Random DAGs (maps, empty maps, conditions with every when_unmet, retries, every
when_exhausted, type violations) are defined twice, as a `seq` flow and a `set`
flow, and started with the same inputs (`start_flow` per run vs one
`start_flows`). Each round claims every visible task of both (`read` +
`start_tasks` vs `claim_tasks`), decides every result the same way, cuts the
results into random batches, and applies each batch to the `seq` flow item by
item (`complete_task` / `fail_task` in key order) and to the `set` flow with one
`complete_tasks` and one `fail_tasks`. After every batch both flows hold the
same runs, step states, tasks, attempt history and queue contents, and the
engine's invariants hold.
"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

_counter = itertools.count()
RUN_INPUTS = [[1, 2, 3], [], [4]]


@dataclass(frozen=True)
class StepDef:
    slug: str
    deps: tuple[str, ...]
    map: bool
    condition: bool  # if: {first dep: {"flag": true}}
    when_unmet: str
    when_exhausted: str
    max_attempts: int
    items: int  # a single step feeding a map outputs this many items (-1: not an array)


@st.composite
def dags(draw: st.DrawFn) -> list[StepDef]:
    n = draw(st.integers(min_value=1, max_value=5))
    steps: list[StepDef] = []
    for i in range(n):
        earlier = [s.slug for s in steps]
        deps = (
            draw(st.lists(st.sampled_from(earlier), max_size=min(2, len(earlier)), unique=True))
            if earlier
            else []
        )
        is_map = len(deps) <= 1 and draw(st.booleans())
        steps.append(
            StepDef(
                slug=f"s{i}",
                deps=tuple(deps),
                map=is_map,
                condition=bool(deps) and draw(st.integers(0, 2)) == 0,
                when_unmet=draw(st.sampled_from(["skip", "skip-cascade", "fail"])),
                when_exhausted=draw(st.sampled_from(["fail", "skip", "skip-cascade"])),
                max_attempts=draw(st.integers(1, 2)),
                items=draw(st.sampled_from([0, 1, 2, 3, -1])),
            )
        )
    return steps


def define(engine: Engine, flow: str, steps: list[StepDef]) -> None:
    engine.create_flow(flow, base_delay=0)
    for s in steps:
        options: dict[str, Any] = {
            "step_type": "map" if s.map else "single",
            "max_attempts": s.max_attempts,
            "when_exhausted": s.when_exhausted,
        }
        if s.condition:
            options["required_input_pattern"] = Jsonb({s.deps[0]: {"flag": True}})
            options["when_unmet"] = s.when_unmet
        engine.add_step(flow, s.slug, list(s.deps), **options)


def feeds_map(steps: list[StepDef], slug: str) -> bool:
    return any(s.map and s.deps == (slug,) for s in steps)


def result(
    steps: dict[str, StepDef], all_steps: list[StepDef], task: dict[str, Any], fails: set[tuple[str, int]]
) -> tuple[bool, Any]:
    """(ok, output or error) for a claimed task: the same for both flows."""
    step = steps[task["step_slug"]]
    if (step.slug, task["attempt"]) in fails:
        return False, f"{step.slug} failed on attempt {task['attempt']}"
    if step.map:
        return True, task["input"]
    if feeds_map(all_steps, step.slug):
        return True, list(range(step.items)) if step.items >= 0 else {"not": "an array"}
    return True, {"flag": (int(step.slug[1:]) + task["task_index"]) % 2 == 0, "step": step.slug}


def key(task: dict[str, Any], runs: dict[str, int]) -> tuple[int, str, int]:
    return runs[str(task["run_id"])], task["step_slug"], task["task_index"]


def snapshot(engine: Engine, flow: str, runs: dict[str, int]) -> dict[str, Any]:
    """Everything observable about a flow's runs, with run ids replaced by their position."""

    def pos(row: dict[str, Any]) -> int:
        return runs[str(row["run_id"])]

    state: dict[str, Any] = {}
    state["runs"] = sorted(
        (
            pos(r),
            r["status"],
            json.dumps(r["output"], sort_keys=True),
            r["error_message"],
            r["remaining_steps"],
        )
        for r in engine.rows("select * from flowlane.runs where flow_slug = %s", (flow,))
    )
    state["steps"] = sorted(
        (
            pos(r),
            r["step_slug"],
            r["status"],
            r["remaining_deps"],
            r["initial_tasks"],
            r["remaining_tasks"],
            json.dumps(r["output"], sort_keys=True),
            r["error_message"],
            r["skip_reason"],
        )
        for r in engine.rows("select * from flowlane.all_step_states where flow_slug = %s", (flow,))
    )
    state["tasks"] = sorted(
        (
            pos(r),
            r["step_slug"],
            r["task_index"],
            r["status"],
            r["attempts_count"],
            json.dumps(r["output"], sort_keys=True),
            r["error_message"],
            r["requeued_count"],
        )
        for r in engine.rows("select * from flowlane.step_tasks where flow_slug = %s", (flow,))
    )
    state["attempts"] = sorted(
        (
            pos(r),
            r["step_slug"],
            r["task_index"],
            r["attempt"],
            r["outcome"],
            r["error_message"],
            r["error_type"],
        )
        for r in engine.rows(
            "select a.* from flowlane.task_attempts a join flowlane.runs r using (run_id) "
            "where r.flow_slug = %s",
            (flow,),
        )
    )
    live = engine.queue_messages(flow)
    state["live"] = sorted(
        (runs[m["message"]["run_id"]], m["message"]["step_slug"], m["message"]["task_index"], m["vt_in"] <= 0)
        for m in live
    )
    state["archived"] = sorted(
        (runs[r["message"]["run_id"]], r["message"]["step_slug"], r["message"]["task_index"])
        for r in engine.rows(f"select message from pgmq.a_{flow}")  # flow slugs are generated here
    )
    return state


# Completing s0 releases s2; completing s1 fails the run (s3's condition is unmet). One by
# one in key order, s2 starts before the run fails; a batch holding both must do the same.
STEPS_WHERE_ORDER_MATTERS = [
    StepDef("s0", (), False, False, "skip", "fail", 1, 0),
    StepDef("s1", (), False, False, "skip", "fail", 1, 0),
    StepDef("s2", ("s0",), False, True, "skip", "fail", 1, 0),  # s0 outputs flag true: met
    StepDef("s3", ("s1",), False, True, "fail", "fail", 1, 0),  # s1 outputs flag false: unmet
]
ORDER_SEED = 0  # random.Random(0) puts run 0's s0 and s1 in the first batch


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(steps=STEPS_WHERE_ORDER_MATTERS, fails=set(), rng=random.Random(ORDER_SEED))
@given(
    steps=dags(),
    fails=st.sets(st.tuples(st.sampled_from([f"s{i}" for i in range(5)]), st.integers(1, 2)), max_size=4),
    rng=st.randoms(use_true_random=False),
)
def test_batches_equal_items_one_by_one(
    engine: Engine, steps: list[StepDef], fails: set[tuple[str, int]], rng: random.Random
) -> None:
    n = next(_counter)
    seq, bat = f"diff_seq_{n}", f"diff_set_{n}"
    for flow in (seq, bat):
        define(engine, flow, steps)
    by_slug = {s.slug: s for s in steps}
    inputs = RUN_INPUTS if any(s.map and not s.deps for s in steps) else [{"a": 1}, {"b": 2}]
    seq_ids = [str(engine.start(seq, x)) for x in inputs]
    bat_ids = [
        str(r["run_id"])
        for r in engine.rows(
            "select run_id from flowlane.start_flows(%s, %s::jsonb[])", (bat, [json.dumps(x) for x in inputs])
        )
    ]
    runs = {**{r: i for i, r in enumerate(seq_ids)}, **{r: i for i, r in enumerate(bat_ids)}}
    assert snapshot(engine, seq, runs) == snapshot(engine, bat, runs)
    worker = engine.worker_id
    pairs = json.dumps([[bat, s.slug] for s in steps])
    for _ in range(40):
        seq_claimed = {key(t, runs): t for t in engine.claim(seq)}
        bat_claimed = {
            key(t, runs): t
            for t in engine.rows(
                "select * from flowlane.claim_tasks(%s, 1000, %s, %s::jsonb) where outcome = 'claimed'",
                (bat, worker, pairs),
            )
        }
        assert seq_claimed.keys() == bat_claimed.keys()
        if not seq_claimed:
            break
        order = sorted(seq_claimed)
        rng.shuffle(order)
        while order:
            size = rng.randint(1, 4)
            batch, order = sorted(order[:size]), order[size:]
            outcomes = {k: result(by_slug, steps, seq_claimed[k], fails) for k in batch}
            done = [k for k in batch if outcomes[k][0]]
            failed = [k for k in batch if not outcomes[k][0]]
            for k in done:
                engine.complete(seq_claimed[k], outcomes[k][1])
            for k in failed:
                engine.fail(seq_claimed[k], outcomes[k][1])
            engine.rows(
                "select * from flowlane.complete_tasks(%s)",
                (
                    Jsonb(
                        [
                            {
                                "run_id": str(bat_claimed[k]["run_id"]),
                                "step_slug": k[1],
                                "task_index": k[2],
                                "output": outcomes[k][1],
                                "worker_id": str(worker),
                                "attempt": bat_claimed[k]["attempt"],
                            }
                            for k in done
                        ]
                    ),
                ),
            )
            engine.rows(
                "select * from flowlane.fail_tasks(%s)",
                (
                    Jsonb(
                        [
                            {
                                "run_id": str(bat_claimed[k]["run_id"]),
                                "step_slug": k[1],
                                "task_index": k[2],
                                "error_message": outcomes[k][1],
                                "worker_id": str(worker),
                                "attempt": bat_claimed[k]["attempt"],
                            }
                            for k in failed
                        ]
                    ),
                ),
            )
            assert snapshot(engine, seq, runs) == snapshot(engine, bat, runs)
            assert_invariants(engine)
    else:
        raise AssertionError("the runs did not settle in 40 rounds")
    statuses = {
        r["status"] for r in engine.rows("select status from flowlane.runs where flow_slug = %s", (bat,))
    }
    assert statuses <= {"completed", "failed"}
    assert uuid.UUID(bat_ids[0])
