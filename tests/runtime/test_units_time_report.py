"""`flowlane run` shows a run's start time, deadline, key and schedule."""

from __future__ import annotations

from flowlane.runtime.report import render_run
from flowlane.runtime.run_state import RunState


def _state(**run: object) -> RunState:
    base = {"run_id": "r1", "flow_slug": "f", "status": "started", "started_at": "2030-01-01 00:00:00+00"}
    return RunState.from_json({"run": {**base, **run}, "steps": [], "tasks": [], "attempts": []}, holds=[])


def test_time_facts_of_a_run() -> None:
    text = render_run(_state(status="waiting", start_at="2030-01-01 00:00:00+00",
                             idempotency_key="order-7", called_as="orders",
                             schedule_name="nightly", schedule_slot="2030-01-01 02:00:00+00",
                             deadline_at="2030-01-01 04:00:00+00"))
    assert "starts    2030-01-01 00:00:00+00" in text
    assert "deadline  2030-01-01 04:00:00+00" in text
    assert "key       order-7 (under orders)" in text
    assert "schedule  nightly slot 2030-01-01 02:00:00+00" in text
    triggered = render_run(_state(schedule_name="nightly"))
    assert "schedule  nightly (run now)" in triggered and "starts" not in triggered


def test_a_plain_run_has_none() -> None:
    text = render_run(_state())
    assert all(word not in text for word in ("deadline", "key ", "schedule", "starts"))


def test_hold_lines_name_the_run_its_place_and_count_tasks_per_reason() -> None:
    from flowlane.runtime.report import hold_lines

    why = "queue concurrency q: 2 of 2 started"
    holds = [{"step_slug": None, "task_index": None, "waiting_for": "start at 2026-05-01", "place": None},
             {"step_slug": None, "task_index": None, "waiting_for": "concurrency k=1: 1 of 1 started",
              "place": 2},
             *({"step_slug": "deliver", "task_index": i, "waiting_for": why, "place": None}
               for i in range(3)),
             {"step_slug": "render", "task_index": 0, "waiting_for": why, "place": None}]
    assert hold_lines(holds) == [("run", "concurrency k=1: 1 of 1 started (2nd in line)"),
                                 ("deliver: 3 tasks", why), ("render: 1 task", why)]
    eleventh = hold_lines([{**holds[1], "place": 11}])
    assert eleventh == [("run", "concurrency k=1: 1 of 1 started (11th in line)")]


def test_each_step_shows_the_last_error_of_its_own_tasks() -> None:
    run = {"run_id": "r1", "flow_slug": "f", "status": "started", "started_at": "2030-01-01 00:00:00+00"}
    steps = [{"step_slug": slug, "status": "started"} for slug in ("fetch", "store")]
    tasks = [{"step_slug": "fetch", "task_index": 0, "status": "queued", "attempts_count": 1,
              "error_message": "ValueError: bad page"},
             {"step_slug": "store", "task_index": 0, "status": "started", "attempts_count": 0}]
    text = render_run(RunState.from_json({"run": run, "steps": steps, "tasks": tasks, "attempts": []},
                                         holds=[]))
    fetch, store = (line for line in text.splitlines() if line.startswith(("fetch ", "store ")))
    assert fetch.endswith("ValueError: bad page")
    assert "bad page" not in store
