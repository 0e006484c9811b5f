"""Run a project's flows in a test: the real SQL Core, the real worker, a clock the test moves.

:class:`TestServer` makes databases on one PostgreSQL server: a template with the engine, the
test clock and the project's compiled SQL, built once, and a copy of it per test.
:class:`FlowTest` drives one such copy: it starts runs, serves the project's handlers with
:class:`~flowlane.runtime.worker.Worker` threads in the test's process until nothing is left to
do, signals wait steps, moves the clock and reads the runs back as :class:`RunResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from flowlane import errors
from flowlane.app import deploy
from flowlane.compiler import api
from flowlane.compiler.model import Project
from flowlane.core import migrator
from flowlane.core.queries import query
from flowlane.runtime.client import Client
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.registry import HandlerRegistry, Registered
from flowlane.runtime.run_state import RunState
from flowlane.runtime.serve import plan_workers
from flowlane.runtime.store import Store
from flowlane.runtime.worker import Worker

IDLE_TIMEOUT = 30.0  # seconds run_until_idle waits for the handlers before it gives up
LOOK_AGAIN = 0.002  # seconds between two looks at whether the runs are idle
# the test's workers poll this often when no notification wakes them (a retry without delay)
POLL_INTERVAL = 0.05
WORKER_TIMEOUT = 60.0  # seconds a worker may take to start, and to stop

Handler = Callable[[Any, Any], Any]


# -- databases ---------------------------------------------------------------------------


class TestServer:
    """Databases on the server ``admin_dsn`` names (its user may CREATE DATABASE)."""

    __test__ = False  # not a test class, whatever pytest's naming rules say

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.prefix = f"flowlane_test_{uuid.uuid4().hex[:8]}"
        self._made: list[str] = []

    def without_durability(self) -> None:
        """A throwaway server never needs to survive a power loss: without fsync, copying the
        template for each test costs a fraction (for servers the tests own, never another)."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                conn.execute(sql.SQL("alter system set {} = off").format(sql.Identifier(setting)))
            conn.execute("select pg_reload_conf()")

    def dsn_for(self, name: str) -> str:
        return make_conninfo(self.admin_dsn, dbname=name)

    def create(self, name: str, template: str | None = None) -> str:
        statement = sql.SQL("create database {}").format(sql.Identifier(name))
        if template is not None:
            statement = sql.SQL("{} template {}").format(statement, sql.Identifier(template))
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(statement)
        self._made.append(name)
        return self.dsn_for(name)

    def drop(self, name: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))

    def template(self, project_root: Path, sql_dir: Path | None = None) -> str:
        """A template database: the engine migrated, the test clock installed and the project's
        compiled SQL (``sql_dir``, default ``sql/``) applied, refused when it is stale."""
        name = f"{self.prefix}_template"
        dsn = self.create(name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrator.ensure_pgmq(conn)
            migrator.migrate(conn)
            install_clock(conn)
        with contextlib.chdir(project_root):
            deploy.apply([str(project_root / "flows")], out=sql_dir or project_root / "sql", dsn=dsn)
        return name

    def clone(self, template: str) -> str:
        """A new database copied from ``template``; dropped by :meth:`close`."""
        return self.create(f"{self.prefix}_{uuid.uuid4().hex[:12]}", template)

    def close(self) -> None:
        for name in reversed(self._made):
            self.drop(name)


def install_clock(conn: psycopg.Connection[Any]) -> None:
    """Give a throwaway database the test clock and helpers (database.sql): test databases only."""
    text = (resources.files("flowlane.testing") / "database.sql").read_text("utf-8")
    with conn.transaction():
        conn.execute(text.encode())


def database_name(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


# -- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """A step of a run: its status, output (a map step's: the list of its tasks' outputs),
    error and the attempts its tasks made."""

    slug: str
    status: str
    output: Any
    error: str | None
    attempts: int


@dataclass(frozen=True)
class RunResult:
    """A run as the test sees it once the runs are idle."""

    run_id: str
    flow: str
    status: str
    input: Any
    output: Any
    error: str | None
    steps: dict[str, StepResult]

    def step(self, slug: str) -> StepResult:
        try:
            return self.steps[slug]
        except KeyError:
            known = ", ".join(self.steps)
            raise KeyError(f"run {self.run_id} has no step {slug!r}; its steps: {known}") from None


def _result(state: RunState) -> RunResult:
    attempts: dict[str, int] = {}
    for task in state.tasks:
        attempts[task.step_slug] = attempts.get(task.step_slug, 0) + task.attempts_count
    steps = {s.step_slug: StepResult(s.step_slug, s.status, s.output, s.error_message,
                                     attempts.get(s.step_slug, 0)) for s in state.steps}
    run = state.run
    return RunResult(run.run_id, run.flow_slug, run.status, run.input, run.output, run.error_message, steps)


# -- fakes -------------------------------------------------------------------------------


@dataclass
class Recorder:
    """A handler that records every call's input and returns ``returns`` (called with the
    input and the context when it is callable)."""

    returns: Any = None
    calls: list[Any] = field(default_factory=list)

    def __call__(self, input: Any, ctx: Any) -> Any:
        self.calls.append(input)
        return self.returns(input, ctx) if callable(self.returns) else self.returns


@dataclass
class Failing:
    """A handler that raises ``error`` on its first ``times`` calls, then calls ``handler``."""

    handler: Handler
    times: int
    error: str = "failed on purpose by the test"
    calls: int = 0

    def __call__(self, input: Any, ctx: Any) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            raise RuntimeError(f"{self.error} ({self.calls} of {self.times})")
        if inspect.iscoroutinefunction(self.handler):  # this runs in one of the worker's threads
            return asyncio.run(self.handler(input, ctx))
        return self.handler(input, ctx)


class _Replaceable(HandlerRegistry):
    """The project's handlers, each replaced by the test's when the test set one."""

    def __init__(self, loaded: HandlerRegistry, replaced: dict[tuple[str, str], Handler]) -> None:
        super().__init__({pair: entry for pair in loaded.pairs if (entry := loaded.get(*pair))})
        self._replaced = replaced

    def get(self, flow_slug: str, step_slug: str) -> Registered | None:
        loaded = super().get(flow_slug, step_slug)
        func = self._replaced.get((flow_slug, step_slug))
        if loaded is None or func is None:
            return loaded
        return Registered(loaded.ref, func, is_async=inspect.iscoroutinefunction(func))


class _TestWorker(Worker):
    def __init__(self, replaced: dict[tuple[str, str], Handler], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._replaced = replaced

    def load_handlers(self) -> HandlerRegistry:
        return _Replaceable(super().load_handlers(), self._replaced)

    async def _tick(self, store: Store) -> None:
        """No maintenance tick of its own: the test's are the only ones (run_until_idle), so
        that none that began before the clock moved can hold a due schedule or run locked
        while the test looks whether anything is due."""


@dataclass
class _Running:
    worker: Worker
    thread: threading.Thread
    failure: list[BaseException]  # what stopped the worker, raised in the test's thread


# -- the test's handle on its database -----------------------------------------------------


class FlowTest:
    """One test's database (a copy of the session's template) and the project's workers."""

    __test__ = False

    def __init__(self, dsn: str, project: Project, project_root: Path) -> None:
        self.dsn = dsn
        self.project = project
        self.project_root = project_root
        self.client = Client(dsn)
        self._conn = psycopg.connect(dsn, autocommit=True, row_factory=dict_row)
        self._replaced: dict[tuple[str, str], Handler] = {}
        self._workers: list[_Running] = []

    # handlers

    def replace(self, flow: str, step: str, handler: Handler) -> Handler:
        """Serve ``step`` of ``flow`` (a flow or an alias) with ``handler`` in this test."""
        self._replaced[(self._slug(flow), step)] = handler
        return handler

    def fake(self, flow: str, step: str, returns: Any = None) -> Recorder:
        """Replace the step's handler with a :class:`Recorder` returning ``returns``."""
        recorder = Recorder(returns)
        self.replace(flow, step, recorder)
        return recorder

    def fail(self, flow: str, step: str, times: int, error: str = "failed on purpose by the test") -> Failing:
        """Make the step's handler (the project's, or the one the test set) raise on its first
        ``times`` calls."""
        failing = Failing(self._handler(flow, step), times, error)
        self.replace(flow, step, failing)
        return failing

    # runs

    def start(self, flow: str, input: Any = None, **options: Any) -> str:
        """Start a run (``options``: those of :meth:`Client.start`); returns its id."""
        run_id: str = self.client.start(flow, input, **options).run_id
        return run_id

    def run(self, flow: str, input: Any = None, **options: Any) -> RunResult:
        """Start a run, run the handlers until the runs are idle, return the run."""
        run_id = self.start(flow, input, **options)
        self.run_until_idle()
        return self.result(run_id)

    def result(self, run_id: str) -> RunResult:
        return _result(self.client.get_run(run_id))

    def signal(self, run_id: str, step: str, payload: Any = None) -> RunResult:
        """Signal a wait step, run until idle, return the run."""
        self.client.signal(run_id, step, payload)
        self.run_until_idle()
        return self.result(run_id)

    def runs(self, flow: str | None = None) -> list[RunResult]:
        """Every run of this test's database (of ``flow``'s versions), oldest first."""
        rows = self._conn.execute(query("testing_runs"), {"flow": flow}).fetchall()
        return [self.result(r["run_id"]) for r in rows]

    # the clock

    def now(self) -> datetime:
        """The engine's time in this test's database."""
        row = self._conn.execute(query("testing_now")).fetchone()
        assert row is not None
        now: datetime = row["now"]
        return now

    def advance(self, seconds: float = 0, *, minutes: float = 0, hours: float = 0, days: float = 0) -> None:
        """Let the runs go idle, move the clock forward, then run until idle again: what waited
        for the time (retry delays, delayed starts, deadlines, wait timeouts, schedule slots)
        happens as if the time had passed."""
        total = seconds + 60 * minutes + 3600 * hours + 86400 * days
        if total < 0:
            raise errors.UsageError(f"the test clock moves forward only, not by {total:g} s")
        self.run_until_idle()
        try:
            self._conn.execute(query("testing_advance"), {"seconds": total})
        except (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedFunction):
            raise errors.FlowlaneError(
                "this database has no test clock: only the test databases of flowlane's pytest "
                "plugin can move the time") from None
        self.run_until_idle()

    # serving

    def run_until_idle(self, timeout: float = IDLE_TIMEOUT) -> None:
        """Serve the project's handlers until no task is claimed or claimable and the
        maintenance tick (schedules, delayed starts, deadlines, wait timeouts) finds nothing
        due at the test's time. A queue's worker starts when the queue first has work."""
        give_up = time.monotonic() + timeout
        while True:
            self._check_workers()
            busy = self._busy()
            if busy == [] and self._tick_did_nothing() and self._busy() == []:
                return
            self._serve_queues({queue for queue, _ in busy if queue is not None})
            if time.monotonic() > give_up:
                still = "; ".join(line for _, line in self._busy())
                raise errors.FlowlaneError(
                    f"the runs are not idle after {timeout:g} s: {still}",
                    hint="a handler that never returns, or a queue no worker of the project serves")
            time.sleep(LOOK_AGAIN)

    def _tick_did_nothing(self) -> bool:
        row = self._conn.execute(query("testing_tick")).fetchone()
        return not any((row or {}).get("done", {}).values())

    def _busy(self) -> list[tuple[str | None, str]]:
        rows = self._conn.execute(query("testing_busy")).fetchall()
        return [(row["queue_name"], row["line"]) for row in rows]

    def _serve_queues(self, queues: set[str]) -> None:
        """Start the project's workers (as `flowlane serve` plans them) for these queues, once."""
        options = WorkerConfig(dsn=self.dsn, handle_signals=False, poll_interval=POLL_INTERVAL,
                               import_paths=(str(self.project_root),))
        served = {running.worker.queue for running in self._workers}
        started = []
        for spec in plan_workers(self.project, options):
            if spec.queue not in queues or spec.queue in served:
                continue
            worker = _TestWorker(self._replaced, self.project, spec.config)
            failure: list[BaseException] = []
            thread = threading.Thread(target=self._serve, args=(worker, failure), daemon=True,
                                      name=f"flowlane-test-{spec.name}")
            running = _Running(worker, thread, failure)
            started.append(running)
            self._workers.append(running)
            running.thread.start()
        give_up = time.monotonic() + WORKER_TIMEOUT
        for running in started:
            while not running.worker.ready.wait(0.01):
                self._check_workers()
                if time.monotonic() > give_up:
                    queue = running.worker.queue
                    raise errors.FlowlaneError(f"the worker of queue {queue} did not start "
                                               f"in {WORKER_TIMEOUT:g} s")

    @staticmethod
    def _serve(worker: Worker, failure: list[BaseException]) -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test's thread raises it (_check_workers)
            failure.append(exc)

    def _check_workers(self) -> None:
        for running in self._workers:
            if running.failure:
                raise errors.FlowlaneError(f"a worker of queue {running.worker.queue} stopped: "
                                           f"{running.failure[0]}") from running.failure[0]

    def close(self) -> None:
        for running in self._workers:
            running.worker.stop()
        for running in self._workers:
            running.thread.join(WORKER_TIMEOUT)
        self.client.close()
        self._conn.close()

    def _slug(self, flow: str) -> str:
        try:
            return self.project.resolve(flow).slug
        except KeyError:
            raise errors.UsageError(f"the project has no flow or alias {flow!r}") from None

    def _handler(self, flow: str, step: str) -> Handler:
        pair = (self._slug(flow), step)
        if pair in self._replaced:
            return self._replaced[pair]
        for spec in plan_workers(self.project):
            worker = Worker(self.project, spec.config, import_paths=(str(self.project_root),))
            registered = worker.load_handlers().get(*pair)
            if registered is not None:
                return registered.func
        raise errors.UsageError(f"flow {flow!r} has no step {step!r} with a handler")


@contextlib.contextmanager
def flow_test(server: TestServer, template: str, project_root: Path) -> Iterator[FlowTest]:
    """A :class:`FlowTest` on a fresh copy of ``template``, closed and dropped afterwards."""
    dsn = server.clone(template)
    test = FlowTest(dsn, api.load_project([str(project_root / "flows")]), project_root)
    try:
        yield test
    finally:
        test.close()
        server.drop(database_name(dsn))
