"""The crash matrix: a shared queue's load under injected faults, with real worker processes.

Each scenario drains the same load (a few thousand tasks over two flows on the shared queue
`rt_crash`, 3 workers, some long handlers) while injecting one kind of fault, then proves:
every run completed, every task completed exactly once (an audit table filled by triggers this
test creates, not the product), every dependency released once, handler executions minus
completions bounded by the faults injected, and the workers that were not killed on purpose
reconnected by themselves. A worker killed on purpose is replaced (what a supervisor does) and
its tasks are recovered by the live workers' stalled recovery after the test backdates them
(the stall threshold is timeout + 30 s; backdating instead of waiting, per CONTRIBUTING.md).
Faults are injected at progress points (completions), never after sleeps.

Recovered throughput, as a fraction of the fault-free baseline of the same run, is printed in
the terminal summary (`crash matrix:` lines).
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowlane.core import db, migrator
from flowlane.runtime.worker import tasks_held_at_most
from tests.conftest import Cluster, reachable_tmp_dir
from tests.runtime import rt_support
from tests.runtime.rt_support import WorkerProcess, wait_until

pytestmark = pytest.mark.slow

FAN_RUNS, WIDTH, CHAIN_RUNS, LONG_EVERY, LONG_WORK = 120, 8, 400, 20, 1.5
TASKS = FAN_RUNS * (WIDTH + 2) + CHAIN_RUNS * 2  # 2,000
WORKERS, MAX_CONCURRENT, BATCH_SIZE = 3, 8, 8  # the rt_crash_worker document's
# executions beyond one per task that a worker losing its database or its life may cause: the
# tasks it held (running, prefetched, or with a result waiting for its commit)
HELD = tasks_held_at_most(MAX_CONCURRENT, BATCH_SIZE)
SCENARIO_TIMEOUT = 50.0
IN_FLIGHT_LEFT = 0.5  # seconds of work a long handler chosen for SIGTERM has left at least

AUDIT = """
create table public.crash_audit (
  kind text not null, run_id uuid not null, step_slug text not null, task_index int
);
create function public.crash_audit_task() returns trigger language plpgsql as $$
begin
  if new.status = 'completed' and old.status is distinct from 'completed' then
    insert into public.crash_audit values ('completion', new.run_id, new.step_slug, new.task_index);
  end if;
  return null;
end $$;
create trigger crash_audit_task after update on flowlane.step_tasks
for each row execute function public.crash_audit_task();
create function public.crash_audit_release() returns trigger language plpgsql as $$
begin
  if old.status = 'created' and new.status <> 'created' then
    insert into public.crash_audit values ('release', new.run_id, new.step_slug, null);
  end if;
  return null;
end $$;
create trigger crash_audit_release after update on flowlane.step_states
for each row execute function public.crash_audit_release();
"""

# fan runs and chain runs interleaved; every LONG_EVERY-th chain run has long handlers
START_RUNS = """
select case when i %% 4 = 0 and i / 4 <= %(fan_runs)s::int
            then flowlane.start_flow('rt_crash_fan', jsonb_build_object(
                   'dir', %(dir)s::text, 'width', %(width)s::int))
            else flowlane.start_flow('rt_crash_chain', jsonb_build_object(
                   'dir', %(dir)s::text, 'work', case when i %% %(long_every)s::int = 1
                                                     then %(long_work)s::numeric else 0 end))
       end
from generate_series(1, %(fan_runs)s::int + %(chain_runs)s::int) i
"""

RESTART = ("import sys; from pathlib import Path; from flowlane.core import db; "
           "db.EmbeddedDatabase.start_at(Path(sys.argv[1]))")


def rows(dsn: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, application_name="crash-matrix") as conn:
        return conn.execute(query, params).fetchall()


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    found = rows(dsn, query, params)
    return found[0][0] if found else None


@dataclass
class Load:
    """The load of one scenario and its workers; ``faults`` bounds the extra executions."""

    dsn: str
    folder: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    retired: list[WorkerProcess] = field(default_factory=list)
    extra_allowed: int = 0
    began: float = 0.0

    def prepare(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(AUDIT)
            conn.execute(START_RUNS, {
                "dir": str(self.folder), "width": WIDTH, "fan_runs": FAN_RUNS,
                "chain_runs": CHAIN_RUNS, "long_every": LONG_EVERY, "long_work": LONG_WORK})
        assert scalar(self.dsn, "select count(*) from flowlane.runs") == FAN_RUNS + CHAIN_RUNS

    def spawn(self, ready: bool = True) -> WorkerProcess:
        worker = WorkerProcess(self.dsn, self.folder, "--queue", "rt_crash", "--log-level", "INFO",
                               "--requeue-interval", "1", "--shutdown-timeout", "0.2")
        self.workers.append(worker)
        return worker.wait_ready() if ready else worker

    def start(self) -> None:
        self.began = time.monotonic()
        for worker in [self.spawn(ready=False) for _ in range(WORKERS)]:
            worker.wait_ready()

    def ready_workers(self) -> list[WorkerProcess]:
        """The live workers that have started (a replacement may still be starting)."""
        return [worker for worker in self.workers if "worker_started" in worker.text()]

    def completions(self) -> int:
        return int(scalar(self.dsn, "select count(*) from public.crash_audit "
                                    "where kind = 'completion'"))

    def progress(self) -> float:
        return self.completions() / TASKS

    def finished(self) -> bool:
        for worker in self.workers:
            assert worker.proc.poll() is None, f"a worker died:\n{worker.text()[-3000:]}"
        return scalar(self.dsn, "select count(*) from flowlane.runs where status = 'started'") == 0

    def drain(self, inject: Callable[[], None] = lambda: None) -> float:
        """Wait until every run ended, calling ``inject`` between checks; return tasks/s."""
        def done() -> bool:
            if self.finished():
                return True
            inject()
            return False

        try:
            wait_until(done, timeout=SCENARIO_TIMEOUT, interval=0.05, message="the load to drain")
        except AssertionError:
            logs = "\n".join(w.text()[-2000:] for w in self.workers)
            raise AssertionError(f"{self.completions()} of {TASKS} completions\n{logs}") from None
        return TASKS / (time.monotonic() - self.began)

    def retire(self, worker: WorkerProcess, sig: signal.Signals) -> int:
        """Stop ``worker`` with ``sig``, make its unfinished tasks stalled, start a replacement;
        return how many tasks it left behind."""
        worker_id = worker_id_of(worker)
        worker.signal(sig)
        status = worker.wait(30)
        assert status == (0 if sig == signal.SIGTERM else -sig), worker.text()[-3000:]
        self.workers.remove(worker)
        self.retired.append(worker)
        # its backends may still be finishing a statement (a claim commits without its client):
        # backdate only once they are gone
        wait_until(lambda: scalar(
            self.dsn, "select count(*) = 0 from pg_stat_activity where application_name like %s",
            (f"flowlane-worker-{worker_id[:8]}%",)), message="the worker's backends to end")
        left = backdate(self.dsn, "t.last_worker_id = %s::uuid", (worker_id,))
        self.extra_allowed += HELD
        # as a supervisor does: the load goes on while the replacement starts (waiting for it
        # here would let the load drain before the next fault on a slow machine)
        self.spawn(ready=False)
        return left

    def stop(self) -> None:
        for worker in self.workers:
            worker.wait_ready()  # a replacement still starting when the load drained
            assert worker.stop() == 0, worker.text()[-3000:]

    def verify(self) -> int:
        """Every proof of the matrix; return the handler executions beyond one per task."""
        statuses = scalar(self.dsn, "select jsonb_object_agg(status, n) from (select status, "
                                    "count(*) n from flowlane.runs group by status) s")
        assert statuses == {"completed": FAN_RUNS + CHAIN_RUNS}
        assert scalar(self.dsn, "select count(*) filter (where status = 'completed') - count(*)"
                                " from flowlane.step_tasks") == 0
        assert scalar(self.dsn, "select count(*) from flowlane.step_tasks") == TASKS
        completions = scalar(self.dsn, """
            select jsonb_build_object('keys', count(*), 'max', max(n)) from (
              select count(*) n from public.crash_audit where kind = 'completion'
              group by run_id, step_slug, task_index) c""")
        assert completions == {"keys": TASKS, "max": 1}, "a task completed twice or never"
        releases = scalar(self.dsn, """
            select jsonb_build_object('dependents', count(*), 'released_once',
                                      count(*) filter (where n = 1)) from (
              select count(a.*) n from flowlane.all_step_states s
              left join public.crash_audit a on a.kind = 'release' and a.run_id = s.run_id
                   and a.step_slug = s.step_slug
              where exists (select 1 from flowlane.deps d where d.flow_slug = s.flow_slug
                            and d.step_slug = s.step_slug)
              group by s.run_id, s.step_slug) r""")
        assert releases["dependents"] == FAN_RUNS * 2 + CHAIN_RUNS
        assert releases["released_once"] == releases["dependents"], releases
        assert rt_support.queue_depth(self.dsn, "rt_crash") == 0
        assert scalar(self.dsn, "select count(*) from flowlane.stuck_runs()") == 0
        executions: Counter[str] = Counter()
        for log in self.folder.glob("exec-*.log"):
            for line in log.read_text().splitlines():
                run, step, index, _attempt = line.split()
                executions[f"{run} {step} {index}"] += 1
        assert len(executions) == TASKS  # every task ran
        extra = sum(executions.values()) - TASKS
        assert 0 <= extra <= self.extra_allowed, (extra, self.extra_allowed)
        return extra


def worker_id_of(worker: WorkerProcess) -> str:
    found = re.search(r"worker_started worker_id=([0-9a-f-]{36})", worker.text())
    assert found, worker.text()[-2000:]
    return found[1]


def backdate(dsn: str, where: str, params: tuple[Any, ...]) -> int:
    """Make started tasks look stalled (claimed an hour ago); rows are locked in key order, the
    engine's lock order, so that this never deadlocks with a live worker's transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "update flowlane.step_tasks s set started_at = s.started_at - interval '1 hour',"
            " queued_at = s.queued_at - interval '1 hour', lease_renewed_at = null"
            " from (select t.run_id, t.step_slug, t.task_index from flowlane.step_tasks t"
            f" where t.status = 'started' and {where}"
            " order by t.run_id, t.step_slug, t.task_index for update) k"
            " where (s.run_id, s.step_slug, s.task_index) = (k.run_id, k.step_slug, k.task_index)",
            params).rowcount


TASK_STARTED = re.compile(r"task_started run_id=(\S+) flow=\S+ step=(\S+) task_index=(\d+)"
                          r" attempt=(\d+)")


def recover_orphaned_claims(load: Load, before: Any) -> int:
    """Backdate tasks claimed before the restart that no worker started: their claim committed
    but its answer was lost with the connection, so no worker holds them and only stalled
    recovery (timeout + 30 s later) can; backdating stands in for that wait."""
    started = {m.groups() for w in load.workers for m in TASK_STARTED.finditer(w.text())}
    with psycopg.connect(load.dsn, autocommit=True) as conn:
        claimed = conn.execute(
            "select run_id::text, step_slug, task_index::text, attempts_count::text"
            " from flowlane.step_tasks where status = 'started' and started_at < %s"
            " and started_at > %s::timestamptz - interval '1 hour'", (before, before)).fetchall()
    orphaned = [c for c in claimed if tuple(c) not in started]
    for run_id, step, index, _attempt in orphaned:
        backdate(load.dsn, "t.run_id = %s::uuid and t.step_slug = %s and t.task_index = %s",
                 (run_id, step, int(index)))
    return len(orphaned)


def report(name: str, rate: float, baseline: float, detail: str) -> None:
    rt_support.REPORT.append(
        f"crash matrix: {name:<22} {rate:7.1f} tasks/s = {rate / baseline:5.2f} x fault-free"
        f" ({baseline:.1f} tasks/s); {detail}")


@pytest.fixture
def load(flows_dsn: str, tmp_path: Path) -> Iterator[Load]:
    scenario = Load(flows_dsn, tmp_path)
    scenario.prepare()
    yield scenario
    for worker in scenario.workers:
        worker.stop()


@pytest.fixture(scope="module")
def baseline(cluster: Cluster) -> float:
    """Tasks/s of the same load without faults (its own database), proved like the others."""
    dsn = cluster.clone()
    folder = reachable_tmp_dir("flowlane-crash-baseline-")
    try:
        rt_support.apply_flows(dsn)
        scenario = Load(dsn, folder)
        scenario.prepare()
        scenario.start()
        try:
            rate = scenario.drain()
        finally:
            scenario.stop()
        assert scenario.verify() == 0  # no fault, no duplicate execution
        report("fault-free", rate, rate, "0 extra executions")
        return rate
    finally:
        cluster.drop_database(str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]))
        shutil.rmtree(folder, ignore_errors=True)


def test_sigkill_mid_task_repeatedly(load: Load, baseline: float) -> None:
    points, left_behind = [0.1, 0.3, 0.5, 0.7], []

    def kill_at_progress_points() -> None:
        ready = load.ready_workers()
        if points and ready and load.progress() >= points[0]:
            points.pop(0)
            left_behind.append(load.retire(random.choice(ready), signal.SIGKILL))

    load.start()
    rate = load.drain(kill_at_progress_points)
    load.stop()
    extra = load.verify()
    assert len(left_behind) == 4 and sum(left_behind) > 0, left_behind  # killed mid-task
    report("SIGKILL x4", rate, baseline,
           f"{sum(left_behind)} tasks recovered, {extra} extra executions")


def test_terminated_backends_at_a_steady_rate(load: Load, baseline: float) -> None:
    terminated, last = [0], [0.0]

    def terminate_one_backend() -> None:
        # every 0.25 s, for the first 40 (about 10 s): the scenario stays bounded on a slow machine
        if terminated[0] >= 40 or time.monotonic() - last[0] < 0.25:
            return
        last[0] = time.monotonic()
        terminated[0] += int(scalar(load.dsn, """
            select count(*) filter (where pg_terminate_backend(pid)) from (
              select pid from pg_stat_activity
              where datname = current_database() and application_name like 'flowlane-worker-%%'
              order by random() limit 1) b"""))

    load.start()
    rate = load.drain(terminate_one_backend)
    load.extra_allowed = terminated[0] * HELD
    noticed = [w for w in load.workers if "database_unavailable" in w.text()
               or "notifications_lost" in w.text()]
    load.stop()  # the same processes: every worker reconnected by itself
    extra = load.verify()
    assert terminated[0] >= 5 and noticed, terminated
    report(f"{terminated[0]} backends killed", rate, baseline, f"{extra} extra executions")


def test_immediate_postgres_restart(tmp_path: Path, baseline: float) -> None:
    # its own server: restarting the session's cluster would break the other tests
    scratch = reachable_tmp_dir("flowlane-crash-restart-")
    pgdata = scratch / "pgdata"
    scenario: Load | None = None
    try:
        dsn = db.EmbeddedDatabase.start_at(pgdata)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # durable commits (unlike the session's cluster): with synchronous_commit off an
            # immediate shutdown loses acknowledged commits, and a completed task runs again
            migrator.migrate(conn)
        rt_support.apply_flows(dsn)
        scenario = Load(dsn, tmp_path)
        scenario.prepare()
        restarted: list[Any] = []  # the database's clock just before the restart
        orphans: list[int] = []

        def restart_at_a_third() -> None:
            if scenario is None or scenario.progress() < 0.3:
                return
            if not restarted:
                restarted.append(scalar(dsn, "select clock_timestamp()"))
                db.EmbeddedDatabase.stop_at(pgdata)  # immediate: connections die, no checkpoint
                subprocess.run([sys.executable, "-c", RESTART, str(pgdata)],
                               env=rt_support.env(), check=True, timeout=60)
            orphans.append(recover_orphaned_claims(scenario, restarted[0]))

        scenario.start()
        rate = scenario.drain(restart_at_a_third)
        assert restarted
        scenario.extra_allowed = WORKERS * HELD
        assert all("database_unavailable" in w.text() or "notifications_lost" in w.text()
                   for w in scenario.workers)
        scenario.stop()  # the same processes: every worker reconnected by itself
        extra = scenario.verify()
        report("PostgreSQL restart", rate, baseline,
               f"{sum(orphans)} orphaned claims recovered, {extra} extra executions")
    finally:
        if scenario is not None:
            for worker in scenario.workers:
                worker.stop()
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(scratch, ignore_errors=True)


def long_handler_in_flight(load: Load) -> WorkerProcess | None:
    """A live worker running a long handler that has work left: the handler recorded its
    execution (it began), its task is still started under this attempt (its result is not
    committed), and it was claimed less than ``LONG_WORK - IN_FLIGHT_LEFT`` seconds ago by the
    database's clock (a handler begins after its claim, so at least ``IN_FLIGHT_LEFT`` seconds
    of its work remain). None when no handler qualifies yet."""
    candidates = [tuple(row) for row in rows(load.dsn, """
        select t.last_worker_id::text, t.run_id::text, t.step_slug, t.task_index::text,
               t.attempts_count::text
        from flowlane.step_tasks t join flowlane.runs r using (run_id)
        where t.status = 'started' and (r.input ->> 'work')::numeric > 0
          and t.started_at > clock_timestamp() - make_interval(secs => %s)
        order by t.started_at desc""", (LONG_WORK - IN_FLIGHT_LEFT,))]
    for worker in load.ready_workers():
        log = load.folder / f"exec-{worker.proc.pid}.log"
        began = set(log.read_text().splitlines()) if log.exists() else set()
        holder = worker_id_of(worker)
        if any(w == holder and " ".join(task) in began for w, *task in candidates):
            return worker
    return None


def test_sigterm_during_long_handlers_with_a_short_shutdown_timeout(
    load: Load, baseline: float
) -> None:
    left_behind: list[int] = []

    def sigterm_a_worker_running_a_long_handler() -> None:
        # three times, the next worker seen running a long handler with work left (not at
        # progress points: long handlers are claimed in the first part of the load only)
        if len(left_behind) == 3:
            return
        victim = long_handler_in_flight(load)
        if victim is not None:  # otherwise: at the next check
            left_behind.append(load.retire(victim, signal.SIGTERM))

    load.start()
    rate = load.drain(sigterm_a_worker_running_a_long_handler)
    load.stop()
    extra = load.verify()
    assert len(left_behind) == 3 and sum(left_behind) > 0, left_behind
    # the handler chosen had work left, but a loaded machine may deliver the signal late: that
    # worker then leaves nothing behind; one that does leave tasks says which
    for worker, left in zip(load.retired, left_behind, strict=True):
        assert left == 0 or "task_abandoned" in worker.text(), (left, worker.text()[-3000:])
    report("SIGTERM x3 (0.2 s)", rate, baseline,
           f"{sum(left_behind)} tasks abandoned, {extra} extra executions")
