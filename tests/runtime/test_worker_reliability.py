"""Reliability with real worker processes: poison input, refused results, stalls, backpressure,
leases, and queued load without deadlocks or duplicate executions."""

from __future__ import annotations

import json
import re
import signal
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.runtime import rt_support
from tests.runtime.rt_support import WorkerProcess, start_run, wait_run, wait_until

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]
DEEP = "[" * 1000 + "1" + "]" * 1000  # 2 KB, past Python's json recursion limit


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def test_poison_input_fails_its_run_and_the_worker_goes_on(flows_dsn: str, spawn: Spawn) -> None:
    # start_flow refuses such input since 0006; older rows (or direct writes) can still hold it
    poison = start_run(flows_dsn, "rt_diamond", {"numbers": [1]})
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        conn.execute(
            "update flowlane.runs set input = jsonb_build_object('numbers', '[1]'::jsonb, "
            "'deep', %s::jsonb) where run_id = %s",
            (DEEP, poison),
        )
    neighbours = [start_run(flows_dsn, "rt_diamond", {"numbers": [2, 3]}) for _ in range(2)]
    worker = spawn("--flow", "rt_diamond")  # all three runs' first tasks in one batch

    def poison_failed() -> str | None:
        assert worker.proc.poll() is None, worker.text()[-3000:]
        return scalar(  # (this test's own psycopg cannot decode the input either)
            flows_dsn,
            "select error_message from flowlane.runs where run_id = %s and status = 'failed'",
            (poison,),
        )

    error = wait_until(poison_failed, message="the poison run to fail")
    assert "the task input cannot be decoded: it is nested deeper than" in error
    for run_id in neighbours:
        assert wait_run(flows_dsn, run_id, workers=[worker])["run"]["status"] == "completed"
    assert worker.proc.poll() is None


def test_an_output_nested_too_deep_fails_its_task_and_json_logs_stay_json(
    flows_dsn: str, spawn: Spawn
) -> None:
    # before: the RecursionError of json.dumps escaped the output check and the worker's
    # JSON log formatter; the task was never answered and stalled until exhausted
    worker = spawn("--flow", "rt_deep_output", "--log-format", "json")
    run_id = start_run(flows_dsn, "rt_deep_output", {"depth": 5000})
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "failed"
    assert "nested deeper than 100 levels" in state["run"]["error_message"]
    assert worker.stop() == 0
    for line in worker.text().splitlines():
        json.loads(line)


def test_a_result_the_database_refuses_fails_only_its_task(flows_dsn: str, spawn: Spawn) -> None:
    # a program limit (54000, e.g. a map output past jsonb's 255 MB) is permanent: before the
    # fix it was retried as an OperationalError forever and nothing else committed
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        conn.execute("""
            create function public.refuse() returns trigger language plpgsql as $$
            begin
              if new.status = 'completed' and new.output ->> 'value' = 'too big' then
                raise exception 'total size of jsonb array elements exceeds the maximum'
                  using errcode = '54000';
              end if;
              return new;
            end $$;
            create trigger refuse before update on flowlane.step_tasks
            for each row execute function public.refuse();
        """)
    bad = start_run(flows_dsn, "rt_shared_b", {"value": "too big"})
    good = [start_run(flows_dsn, "rt_shared_b", {"value": n}) for n in range(3)]
    worker = spawn("--queue", "rt_jobs")  # the rt_jobs_worker document: both shared flows
    for run_id in good:
        assert wait_run(flows_dsn, run_id, workers=[worker])["run"]["status"] == "completed"
    state = wait_run(flows_dsn, bad, workers=[worker])
    assert state["run"]["status"] == "failed"
    assert "the database refused the handler output: total size of jsonb" in (
        state["run"]["error_message"]
    )
    assert worker.proc.poll() is None


def test_a_map_output_past_jsonb_limit_fails_its_run_and_the_rest_commits(
    flows_dsn: str, spawn: Spawn
) -> None:
    # 90 x 3 MB; the aggregate is refused with 54000, which was retried as an
    # OperationalError for minutes while nothing else committed and the run never failed
    big = start_run(flows_dsn, "rt_big_map", [3] * 90)
    small = start_run(flows_dsn, "rt_big_map", [1, 1])
    # (batches of 4: a refused batch is sent again result by result, 3 MB each)
    worker = spawn("--flow", "rt_big_map", "--max-concurrent", "4", "--batch-size", "4")
    assert wait_run(flows_dsn, small, workers=[worker])["run"]["status"] == "completed"
    failed = wait_until(lambda: scalar(
        flows_dsn,
        "select error_message from flowlane.runs where run_id = %s and status = 'failed'",
        (big,)), timeout=120, message="the oversized map to fail")
    assert "the database refused the handler output: total size of jsonb array elements" in failed
    completed = scalar(flows_dsn, "select count(*) from flowlane.step_tasks where run_id = %s "
                                  "and status = 'completed'", (big,))
    assert completed == 89  # every other result of the map committed
    assert worker.proc.poll() is None


def test_repeated_stalls_fail_the_run_within_max_attempts(
    flows_dsn: str, tmp_path: Path
) -> None:
    # a handler that kills its worker: before the fix the task stayed started and the run
    # started forever after the fourth stall, with max_attempts 2
    run_id = start_run(flows_dsn, "rt_suicide", {})
    for attempt in (1, 2):
        worker = WorkerProcess(flows_dsn, tmp_path, "--flow", "rt_suicide")
        assert worker.wait(60) == -signal.SIGKILL
        rt_support.backdate_started(flows_dsn, run_id, "die")
        assert rt_support.requeue_stalled(flows_dsn) == 1, attempt
    state = rt_support.run_state(flows_dsn, run_id)
    assert state["run"]["status"] == "failed"
    assert state["run"]["error_message"].endswith("no result within 3 s, 2 attempts")
    assert rt_support.queue_depth(flows_dsn, "rt_suicide") == 0
    assert scalar(flows_dsn, "select count(*) from flowlane.stuck_runs()") == 0


def test_results_waiting_for_their_commit_stay_bounded(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    # at most the larger of max_concurrent and batch_size results wait for their commit
    worker = spawn("--flow", "rt_slow", "--max-concurrent", "2", "--batch-size", "2")
    blocked = [
        start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path), "only_first": True})
        for _ in range(2)
    ]
    for run_id in blocked:
        wait_until(lambda run_id=run_id: (tmp_path / f"started-{run_id}-1").exists(),
                   message="the claims")
    with psycopg.connect(flows_dsn) as lock:
        # the flusher (both of its commits in flight) cannot commit these runs' results while
        # the test holds their rows
        lock.execute("select 1 from flowlane.runs where run_id = any (%s) for update", (blocked,))
        (tmp_path / "release").touch()
        others = [
            start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path), "only_first": True})
            for _ in range(5)
        ]

        # the slots are free, but two results (the bound) wait for their commit: the poller
        # stops claiming. Without that bound the worker claimed all seven tasks while their
        # results piled up behind the blocked flushes
        wait_until(lambda: re.search(r"poller_full held=\d+ uncommitted=([2-9]|\d\d)", worker.text()),
                   message="the worker to stop claiming for the results waiting for their commit")
        with psycopg.connect(flows_dsn, autocommit=True) as conn:
            started, queued = conn.execute(
                "select count(*) filter (where status = 'started'), "
                "count(*) filter (where status = 'queued') from flowlane.step_tasks").fetchone() or (0, 0)
        # held: the two blocked results, and at most one task claimed while only one of them
        # waited (claimed with a slot free, its result joins them)
        assert (started, queued) in ((2, 5), (3, 4)), (started, queued)
        lock.rollback()
    for run_id in [*blocked, *others]:
        assert wait_run(flows_dsn, run_id, workers=[worker])["run"]["status"] == "completed"


def test_a_slot_is_free_while_its_result_waits_for_its_commit(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_slow", "--max-concurrent", "2")
    first, busy, late = (tmp_path / name for name in ("first", "busy", "late"))
    for folder in (first, busy, late):
        folder.mkdir()
    (late / "release").touch()  # the late run's handler returns at once
    held_run = start_run(flows_dsn, "rt_slow", {"dir": str(first)})
    busy_run = start_run(flows_dsn, "rt_slow", {"dir": str(busy)})
    for folder, run_id in ((first, held_run), (busy, busy_run)):
        wait_until(lambda f=folder, r=run_id: (f / f"started-{r}-1").exists(), message="the claims")
    with psycopg.connect(flows_dsn) as lock:
        lock.execute("select 1 from flowlane.runs where run_id = %s for update", (held_run,))
        (first / "release").touch()
        wait_until(  # the first result's commit waits for the test's lock
            lambda: scalar(
                flows_dsn,
                "select exists (select 1 from pg_stat_activity where %s = any (pg_blocking_pids(pid)))",
                (lock.info.backend_pid,),
            ),
            message="the first result's commit",
        )
        # one slot runs the busy handler, the other's result is not committed: the slot is free
        late_run = start_run(flows_dsn, "rt_slow", {"dir": str(late)})
        assert wait_run(flows_dsn, late_run, workers=[worker])["run"]["status"] == "completed"
        assert rt_support.run_state(flows_dsn, held_run)["run"]["status"] == "started"
        lock.rollback()
    (busy / "release").touch()
    for run_id in (held_run, busy_run):
        assert wait_run(flows_dsn, run_id, workers=[worker])["run"]["status"] == "completed"


def test_a_running_handler_keeps_its_lease(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_slow")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path)})
    wait_until(lambda: (tmp_path / f"started-{run_id}-1").exists(), message="the claim")
    wait_until(
        lambda: scalar(
            flows_dsn,
            "select lease_renewed_at from flowlane.step_tasks where run_id = %s "
            "and step_slug = 'hold'",
            (run_id,),
        ),
        timeout=20,
        message="the worker to extend the lease",
    )
    (tmp_path / "release").touch()
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert [t["attempts_count"] for t in rt_support.tasks(state, "hold")] == [1]


def test_queued_load_has_no_deadlocks_and_no_duplicate_executions(
    flows_dsn: str, tmp_path: Path, spawn: Spawn
) -> None:
    # three workers drain a backlog of fan-out runs while a producer starts more: claims,
    # completions and starts lock the same runs' rows, so any two of them taking those locks
    # in different orders deadlock (failing the producer's start_flow), and a task whose
    # claim is not fenced runs its handler more than once
    from flowlane.runtime.client import Client

    width, queued, arriving = 10, 600, 200
    payload = {"dir": str(tmp_path), "width": width}
    failures: list[BaseException] = []

    def produce() -> None:  # new runs arrive while the workers drain the backlog
        try:
            with Client(flows_dsn) as client:
                for _ in range(arriving):
                    client.start("rt_load", payload)
        except BaseException as exc:
            failures.append(exc)

    deadlocks_before = scalar(
        flows_dsn, "select deadlocks from pg_stat_database where datname = current_database()")
    with Client(flows_dsn) as client:
        for _ in range(queued):
            client.start("rt_load", payload)
    workers = [spawn("--flow", "rt_load") for _ in range(3)]
    producer = threading.Thread(target=produce)
    producer.start()

    def finished() -> bool:
        for w in workers:
            assert w.proc.poll() is None, w.text()[-3000:]
        return not producer.is_alive() and scalar(
            flows_dsn, "select count(*) from flowlane.runs where status = 'started'") == 0

    wait_until(finished, timeout=240, interval=0.05, message="every run to finish")
    assert failures == []
    statuses = scalar(
        flows_dsn,
        "select jsonb_object_agg(status, n) from "
        "(select status, count(*) n from flowlane.runs group by status) s")
    assert statuses == {"completed": queued + arriving}
    executions: Counter[str] = Counter()
    for log in tmp_path.glob("exec-*.log"):
        for line in log.read_text().splitlines():
            run, step, index, _attempt = line.split()
            executions[f"{run} {step} {index}"] += 1
    assert len(executions) == (queued + arriving) * (width + 2)
    assert [k for k, n in executions.items() if n > 1] == []
    deadlocks_after = scalar(
        flows_dsn, "select deadlocks from pg_stat_database where datname = current_database()")
    assert deadlocks_after - deadlocks_before == 0
