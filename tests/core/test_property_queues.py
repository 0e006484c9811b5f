"""Property: over random DAGs with mixed explicit per-step routes, queue identity holds.

- every task's queue equals its step's queue;
- (queue_name, message_id) is unique;
- every PGMQ message of a run (live or archived) lives on its task's queue and
  its body names that task;
- runs complete with the leaf outputs and leave no live message behind.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

QUEUES = ["qa", "qb", "qc"]
RUN_INPUT = [1, 2, 3]
_counter = itertools.count()


@dataclass(frozen=True)
class StepDef:
    slug: str
    deps: tuple[str, ...]
    map: bool
    queue: str


@st.composite
def dags(draw: st.DrawFn) -> list[StepDef]:
    n = draw(st.integers(min_value=1, max_value=6))
    steps: list[StepDef] = []
    for i in range(n):
        earlier = [s.slug for s in steps]
        deps = draw(
            st.lists(st.sampled_from(earlier), max_size=min(2, len(earlier)), unique=True)
            if earlier
            else st.just([])
        )
        is_map = len(deps) <= 1 and draw(st.booleans())
        steps.append(StepDef(f"s{i}", tuple(deps), is_map, draw(st.sampled_from(QUEUES))))
    return steps


def handler(steps: dict[str, StepDef], task: dict[str, Any]) -> Any:
    step = steps[task["step_slug"]]
    if step.map:
        return task["input"]
    return [int(step.slug[1:]), int(step.slug[1:]) + 1]


def expected_outputs(steps: list[StepDef]) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for step in steps:
        if step.map:
            outputs[step.slug] = outputs[step.deps[0]] if step.deps else RUN_INPUT
        else:
            outputs[step.slug] = [int(step.slug[1:]), int(step.slug[1:]) + 1]
    parents = {d for s in steps for d in s.deps}
    return {s.slug: outputs[s.slug] for s in steps if s.slug not in parents}


def existing_queues(engine: Engine) -> list[str]:
    return [
        r["queue_name"] for r in engine.rows("select queue_name from flowlane.queues order by 1")
    ]


def check_identity(engine: Engine, flow: str, run_ids: list[Any]) -> None:
    mismatched = engine.scalar(
        "select count(*) from flowlane.step_tasks t join flowlane.steps s "
        "on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug "
        "where t.flow_slug = %s and t.queue_name <> s.queue_name",
        (flow,),
    )
    assert mismatched == 0
    duplicates = engine.scalar(
        "select count(*) from (select 1 from flowlane.step_tasks "
        "group by queue_name, message_id having count(*) > 1) d"
    )
    assert duplicates == 0
    tasks = {
        (t["queue_name"], t["message_id"]): t
        for t in engine.rows("select * from flowlane.step_tasks where flow_slug = %s", (flow,))
    }
    seen = 0
    for queue in existing_queues(engine):
        for table in ("q", "a"):
            for message in engine.rows(
                f"select msg_id, message from pgmq.{table}_{queue} "
                "where message ->> 'run_id' = any(%s)",
                ([str(r) for r in run_ids],),
            ):
                task = tasks.get((queue, message["msg_id"]))
                assert task is not None, f"message {message} on {queue} has no task on that queue"
                body = message["message"]
                assert (body["step_slug"], body["task_index"], body["run_id"]) == (
                    task["step_slug"],
                    task["task_index"],
                    str(task["run_id"]),
                )
                seen += 1
    assert seen == len(tasks), "every task has exactly one message on its queue"


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=dags())
def test_queue_identity_over_random_dags(engine: Engine, steps: list[StepDef]) -> None:
    flow = f"prop_{next(_counter)}"
    engine.create_flow(flow, queue_mode="explicit")
    for step in steps:
        engine.add_step(
            flow,
            step.slug,
            list(step.deps),
            step_type="map" if step.map else "single",
            queue_name=step.queue,
        )
    by_slug = {s.slug: s for s in steps}
    run_ids = [engine.start(flow, RUN_INPUT) for _ in range(2)]
    check_identity(engine, flow, run_ids)
    for _ in range(50):
        progressed = False
        for queue in existing_queues(engine):
            for task in engine.claim(queue):
                assert task["queue_name"] == queue == by_slug[task["step_slug"]].queue
                engine.complete(task, handler(by_slug, task))
                progressed = True
        check_identity(engine, flow, run_ids)
        assert_invariants(engine)
        if not progressed:
            break
    expected = expected_outputs(steps)
    for run_id in run_ids:
        run = engine.run(run_id)
        assert (run["status"], run["output"]) == ("completed", expected)
    live = engine.scalar(
        "select count(*) from flowlane.step_tasks "
        "where flow_slug = %s and status in ('queued', 'started')",
        (flow,),
    )
    assert live == 0
    for queue in existing_queues(engine):
        left = [m for m in engine.queue_messages(queue) if m["message"]["flow_slug"] == flow]
        assert left == []
