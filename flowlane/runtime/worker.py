"""The worker: poll one PGMQ queue, run handlers, report results.

Lifecycle: ``run()`` validates and imports every handler routed to the
queue, verifies every flow it serves against the database (read-only: a
missing or different flow refuses the start; ``compile=True`` creates missing
ones through the SQL ``apply`` runs), checks that it covers every (flow, step)
the database routes to the queue, enables PGMQ insert notifications,
registers the worker under its deployment (refused while the deployment is
disabled), then serves until ``stop()``, SIGTERM or SIGINT. Serving is five
asyncio tasks on one loop (the listener only with notifications), beside the handlers:

- poller: read and claim a batch (at most the free handler slots) in one
  round trip, ``claim_tasks`` with the exact (flow, step) pairs served, start
  one handler per claimed task. A batch with unsupported work is handed back
  whole; when the definitions route those pairs to the queue, the worker
  stops for a restart with the current YAML (exit status 4), otherwise it
  disables its deployment and stops (exit status 3). It wakes on PGMQ's
  insert notification and polls every ``poll_interval`` as a fallback. A queue
  has one notification on its way at a time (inserts made meanwhile send none),
  so before it waits the poller waits for the queue's inserting transactions to
  end (``await_queue_inserts``, briefly) and claims once more; while
  the notification connection is down it uses ``pgmq.read_with_poll``. On a
  queue with limits (``kind: queue``) a claim the limits refuse says so: at
  its concurrency the poller waits for the end of a started task (notified on
  the same channel); rate-limited it sleeps exactly until the next start is
  allowed;
- flusher: sends results as they finish, completions batched through
  ``complete_tasks``, failures through ``fail_tasks``, both fenced by worker id
  and attempt; up to two commits in flight;
- maintenance: heartbeat (a worker a rollout deprecated stops and exits 4), and every
  ``requeue_interval`` seconds ``requeue_stalled_tasks`` (cheap and SKIP
  LOCKED, so every worker does it) and a coverage re-check; every ``TICK_INTERVAL`` the
  maintenance tick (due schedules fire, delayed runs begin, runs past their deadline fail);
- leases: every ``LEASE_INTERVAL``, ``extend_leases`` for the tasks held longer
  than that, until the last results are committed (shutdown included);
- listener: LISTEN on the queue's insert channel and on definition changes
  (``flowlane_definitions``): the poller re-checks coverage before its next
  claim and, when the queue is now routed pairs this registry does not serve,
  stops claiming and exits with status 4.

Backpressure: a handler slot is free as soon as its handler returns, and the
result waits for its commit without it; the poller claims nothing while the
larger of ``max_concurrent`` and ``batch_size`` results wait for their commit,
so the results not yet committed stay bounded and a slow database throttles
the claims. While handlers are short (their recent durations average under
``PREFETCH_BELOW``) the poller claims tasks beyond the slots, as many as the slots
run in ``PREFETCH_BELOW`` at their pace (at most a batch), so a slot whose handler
returns starts the next task at once; a prefetched task's lease is kept like
a running one's, and on a graceful stop it runs like the others. Sync
handlers run in daemon threads, ``async def`` handlers on the loop. Any
database error that a retry can fix (``store.is_transient``: a restart, a
killed backend, a deadlock) is retried with backoff. Stopping:
stop reading, set ``ctx.shutdown``, wait up to ``shutdown_timeout`` for
in-flight handlers, send their results, mark the worker stopped. Handlers
still running are abandoned: their tasks stay ``started`` and stalled
recovery requeues them (a stall counts as an attempt); nothing is lost.

A disabled deployment ends ``run()`` with exit status 3, or with ``when_disabled="wait"``
(Kubernetes, systemd: supervisors that restart it) keeps the process up, claiming nothing,
until the deployment is enabled, then ends it with exit status 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import signal
import threading
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from flowlane import defaults, errors, project_root
from flowlane.compiler import api
from flowlane.compiler.model import Project
from flowlane.core import db
from flowlane.runtime import log, metrics
from flowlane.runtime.backoff import Backoff
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.context import TaskContext
from flowlane.runtime.registry import HandlerRegistry
from flowlane.runtime.results import Counters, ResultFlusher, ResultSender, UncommittedResult
from flowlane.runtime.selection import Selection, select
from flowlane.runtime.startup import StartupChecks, gap_line
from flowlane.runtime.store import (
    DATABASE_ERRORS,
    TRANSIENT,
    Claim,
    Store,
    Unsupported,
    channel,
    is_transient,
)
from flowlane.runtime.tasks import (
    ClaimedTask,
    HandlerThreads,
    TaskResult,
    describe,
    execute,
    first_line,
)
from flowlane.runtime.tracing import Tracing

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
MAX_POLL_WINDOW = 2  # seconds
DISABLED_POLL = 2.0  # seconds between looks at a disabled deployment's flag (--when-disabled wait)
STOP_CHECK = 0.1  # seconds: how soon a waiting worker notices a stop request
# leases of tasks held this long are extended, every LEASE_INTERVAL: far inside the stall
# threshold (timeout + 30 s, timeout >= 3 s)
LEASE_INTERVAL = 2.0  # seconds
PROGRESS_INTERVAL = 5.0  # seconds between INFO counter lines (per-task lines are DEBUG)
# a worker claims tasks beyond its slots (a slot whose handler returns starts the next at once)
# while its handlers' recent durations average under PREFETCH_BELOW: as many as its slots run
# in PREFETCH_BELOW at that pace, up to a batch. A prefetched task's timeout runs from its
# claim, so it must not wait long for its slot: about PREFETCH_BELOW at most
PREFETCH_BELOW = 0.1  # seconds
PREFETCH_WEIGHT = 0.2  # of each new duration in the average


def uncommitted_bound(max_concurrent: int, batch_size: int) -> int:
    """Results waiting for their commit before the poller stops claiming."""
    return max(max_concurrent, batch_size)


def prefetch_at_most(max_concurrent: int, batch_size: int) -> int:
    """Tasks claimed beyond the slots while handlers are short."""
    return batch_size


def prefetch_for(max_concurrent: int, batch_size: int, handler_seconds: float) -> int:
    """Tasks claimed beyond the slots when handlers take ``handler_seconds`` on average: what
    the slots run in ``PREFETCH_BELOW`` at that pace, at most ``prefetch_at_most``."""
    if handler_seconds >= PREFETCH_BELOW:
        return 0
    pace = max_concurrent * PREFETCH_BELOW / max(handler_seconds, 1e-6)
    return min(prefetch_at_most(max_concurrent, batch_size), int(pace))


def tasks_held_at_most(max_concurrent: int, batch_size: int) -> int:
    """The claimed tasks a worker holds at most (running, prefetched, or with a result waiting
    for its commit): what a worker that loses its database or its life may leave to run again."""
    return max_concurrent + prefetch_at_most(max_concurrent, batch_size) + uncommitted_bound(
        max_concurrent, batch_size)


@dataclass
class InFlightTask:
    """A claimed task from its claim until its result is committed: waiting for a handler slot
    (prefetched), its handler running, or its result waiting for its commit."""

    task: ClaimedTask
    claimed_at: float
    running: bool = True  # False once the handler returned and the result waits for its commit
    started: bool = False  # its handler has a slot (a prefetched task waits for one)

    def begin(self, at: float) -> None:
        """Its handler has a slot now (called by the handler's thread when the threads are
        the slots)."""
        self.started = True

    def lease_item(self) -> dict[str, Any]:
        return {
            "run_id": self.task.run_id,
            "step_slug": self.task.step_slug,
            "task_index": self.task.task_index,
            "attempt": self.task.attempt,
            "running": self.running,
        }


# -- lifecycle ----------------------------------------------------------------
#
# Every stop goes through ``Worker._request_stop(Stop(reason, ...), abandon=...)``:
#   SIGTERM/SIGINT, ``stop()``   -> DRAINING, reason SIGNAL/REQUESTED        -> exit 0
#   a second signal, stop(force) -> ABANDONING (running handlers abandoned) -> exit 0
#   a rollout deprecated it      -> DRAINING, reason DEPRECATED             -> exit 4
#   new routing it does not serve -> DRAINING, reason OUTDATED              -> exit 4
#   work nobody routes here      -> deployment disabled, UNSUPPORTED_WORK   -> exit 3
#   a component crashed          -> DRAINING, reason CRASHED                -> exit 1
# A lost database is no stop: every loop retries it with backoff. Before SERVING, startup
# refusals (a handler that cannot be imported, no database, a disabled deployment) are raised
# as they are: ``run()`` never serves. DRAINING and ABANDONING end in STOPPED once the results
# of finished handlers are sent and the worker is marked stopped.


class Phase(enum.Enum):
    """Where a worker is in its life; it only moves down this list."""

    STARTING = "starting"  # importing handlers, checking the database, registering
    SERVING = "serving"  # claiming and running tasks
    DRAINING = "draining"  # claims nothing more; running handlers get ``shutdown_timeout``
    ABANDONING = "abandoning"  # running handlers are abandoned at once (stalled recovery's)
    STOPPED = "stopped"  # results sent, the worker marked stopped


class StopReason(enum.Enum):
    REQUESTED = "stop() was called"
    SIGNAL = "SIGTERM or SIGINT"
    CRASHED = "a component of the worker crashed"
    DEPRECATED = "a rollout deprecated the worker"
    OUTDATED = "the queue is routed pairs the worker does not serve"
    UNSUPPORTED_WORK = "work no definition routes here: the deployment is disabled"


# what ``run()`` raises for a reason (the error's ``exit_code`` is the exit status); for the
# others it returns (exit status 0)
RAISES: dict[StopReason, type[errors.WorkerError]] = {
    StopReason.CRASHED: errors.WorkerError,
    StopReason.DEPRECATED: errors.WorkerDeprecated,
    StopReason.OUTDATED: errors.WorkerOutdated,
    StopReason.UNSUPPORTED_WORK: errors.WorkerDisabled,
}
# when reasons meet, the heavier one is kept (the first of equal weight): a stop for new
# definitions or a disabled deployment tells the supervisor more than a crash, a crash more
# than a request
WEIGHT: dict[StopReason, int] = {reason: 1 if reason is StopReason.CRASHED else 2 for reason in RAISES}


@dataclass(frozen=True)
class Stop:
    """Why a worker stops, as its supervisor is told."""

    reason: StopReason
    message: str = ""
    hint: str | None = None

    @property
    def exit_status(self) -> errors.WorkerExit:
        raised = RAISES.get(self.reason)
        return errors.WorkerExit(raised.exit_code) if raised else errors.WorkerExit.STOPPED

    def outweighs(self, other: Stop | None) -> bool:
        return other is None or WEIGHT.get(self.reason, 0) > WEIGHT.get(other.reason, 0)

    def raise_unless_requested(self) -> None:
        raised = RAISES.get(self.reason)
        if raised is not None:
            raise raised(self.message, hint=self.hint)


@dataclass
class Session:
    """The state of one ``run()`` while it serves: created once the worker is registered,
    read by its four loops; ``counters`` outlives it (``Worker.stats``)."""

    store: Store
    registry: HandlerRegistry
    sender: ResultSender
    threads: HandlerThreads
    counters: Counters = field(default_factory=Counters)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # the loop's view of the stop
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # something may be claimable
    capacity: asyncio.Event = field(default_factory=asyncio.Event)  # a handler slot freed
    results: asyncio.Queue[UncommittedResult | None] = field(default_factory=asyncio.Queue)
    held: dict[asyncio.Task[None], InFlightTask] = field(default_factory=dict)  # the in-flight tasks
    slots: asyncio.Semaphore = field(default_factory=asyncio.Semaphore)  # the handler slots
    handler_seconds: float | None = None  # recent handler durations, averaged (prefetch's guide)
    notify_live: bool = False
    definitions: asyncio.Event = field(default_factory=asyncio.Event)  # notified: re-check coverage
    tracing: Tracing | None = None  # spans of task attempts, when an OpenTelemetry SDK is set up
    # every handler is sync: the handler threads, one per slot, are the slots (a thread whose
    # handler returns takes the next task without a turn of the event loop)
    threads_are_slots: bool = False

    async def pause(self, seconds: float, event: asyncio.Event | None = None) -> None:
        """Sleep ``seconds``, returning early when stopping (or when ``event`` is set)."""
        waiters = {asyncio.ensure_future(self.stopping.wait())}
        if event is not None:
            waiters.add(asyncio.ensure_future(event.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def claim_mates_running(self, results: list[TaskResult]) -> bool:
        """Whether a handler still runs that was claimed together with one of ``results``'
        tasks (the flusher waits a moment for its result: claimed together, they often
        finish together)."""
        tasks = {id(result.task) for result in results}
        claims: set[float] = set()
        running: set[float] = set()
        for held in self.held.values():
            if id(held.task) in tasks:
                claims.add(held.claimed_at)
            elif held.running and held.started:
                running.add(held.claimed_at)
        return not claims.isdisjoint(running)

    def finished(self, handle: asyncio.Task[None]) -> None:
        """A task has left the worker: its result is committed (or it was abandoned)."""
        self.held.pop(handle, None)
        self.capacity.set()

    def unfinished(self) -> int:
        """Claimed tasks whose handler has not returned (prefetched ones included)."""
        return sum(1 for held in self.held.values() if held.running)

    def handler_returned(self, seconds: float) -> None:
        """A slot is free (its result waits for its commit without it)."""
        last = self.handler_seconds
        self.handler_seconds = seconds if last is None else last + PREFETCH_WEIGHT * (seconds - last)
        self.capacity.set()


class Worker:
    """Serve the handlers routed to one queue. ``run()`` blocks; ``stop()`` is thread-safe.

    ``Worker(project, config)`` or ``Worker(project, queue=..., **options)``: the
    options are :class:`WorkerConfig`'s fields (given both, the options replace the
    config's values)."""

    def __init__(
        self, project: Project | str | Path, config: WorkerConfig | None = None, **options: Any
    ) -> None:
        self.project = _as_project(project)
        config = WorkerConfig.from_options(config, **options)
        self.selection: Selection = select(
            self.project,
            queue=config.queue,
            flow=config.flow,
            step=config.step,
            flows=None if config.flows is None else list(config.flows),
            name=config.name,
        )
        self.queue = self.selection.queue
        self.name = config.name or self.selection.default_name  # also the deployment name
        self.pairs = sorted({(h.flow_slug, h.step_slug) for h in self.selection.handlers})
        self.max_concurrent, self.batch_size = config.limits(self.selection.deployment)
        # the settings as served: the deployment's name and limits filled in
        self.config = dataclasses.replace(
            config, name=self.name, max_concurrent=self.max_concurrent, batch_size=self.batch_size
        )
        self._min_read = defaults.claim_threshold(self.max_concurrent, self.batch_size)
        # results waiting for their commit before the poller stops claiming
        self._uncommitted_bound = uncommitted_bound(self.max_concurrent, self.batch_size)
        # read_with_poll's window while notifications are off or down: short, so a stop or a
        # recovered notification connection is noticed quickly
        self._poll_window = max(1, min(int(config.poll_interval), MAX_POLL_WINDOW))
        # handlers import from the current directory and the project root
        self.import_paths = list(
            dict.fromkeys(
                [str(Path.cwd().resolve()), str(project_root.find_root()), *config.import_paths]
            )
        )
        self.worker_id = str(uuid.uuid4())
        self.ready = threading.Event()  # set once registered and serving
        self.phase = Phase.STARTING
        self.stopped_by: Stop | None = None  # set by the first stop request, then the heaviest
        self._shutdown = threading.Event()  # the stop, for every thread: ctx.shutdown of every task
        self._lock = threading.Lock()  # phase and stopped_by change from any thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: Session | None = None
        self._waiting = ""  # why a disabled worker waits (--when-disabled wait)

    @property
    def compile(self) -> bool:
        return self.config.compile

    @property
    def stats(self) -> dict[str, int]:
        """Tasks claimed, completed, failed and rejected by the last (or current) ``run()``."""
        return (self._session.counters if self._session else Counters()).as_dict()

    # -- public -----------------------------------------------------------

    def run(self) -> None:
        """Start up, serve until stopped, shut down gracefully."""
        asyncio.run(self._main())

    def stop(self, *, force: bool = False) -> None:
        """Begin a graceful stop (``force``: abandon in-flight handlers at once)."""
        self._request_stop(Stop(StopReason.REQUESTED), abandon=force)

    def not_ready(self) -> list[str]:
        """Why this worker should not count as ready, as far as it knows without asking the
        database (its deployment's flag and the database itself are asked by the probe)."""
        if self._waiting:
            return [f"waiting until the deployment is enabled: {self._waiting}"]
        if self._shutdown.is_set():
            return ["the worker is stopping"]
        if self.phase is not Phase.SERVING:
            return ["the worker has not registered yet (startup checks still running or refused)"]
        return []

    def alive(self) -> list[str]:
        """Why this worker is broken beyond a restart's help, if it is ([] when alive)."""
        stop = self.stopped_by
        if stop is not None and stop.reason is StopReason.CRASHED:
            return [stop.message]
        return []

    def load_handlers(self) -> HandlerRegistry:
        """Import the handlers this worker serves (before it connects); raises a
        :class:`~flowlane.errors.WorkerError` listing every one that cannot be imported."""
        return HandlerRegistry.load(self.selection.handlers, self.import_paths)

    # -- lifecycle --------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._install_signal_handlers()
        try:
            await self._serve_once()
        except errors.WorkerDisabled as disabled:
            if self.config.when_disabled != "wait":
                raise
            await self._wait_until_enabled(disabled)

    async def _wait_until_enabled(self, disabled: errors.WorkerDisabled) -> None:
        """``--when-disabled wait`` (a supervisor that restarts every exit): claim nothing and
        stay up until the deployment is enabled, then exit 4 to be restarted with the current
        YAML and definitions; a stop request while waiting is a plain stop (exit 0)."""
        self._waiting = first_line(disabled)
        log.event(WARNING, "deployment_disabled", name=self.name, reason=self._waiting,
                  action="wait until it is enabled, then exit for a restart")
        store = Store(db.resolve(self.config.dsn).dsn, min_size=1, max_size=1,
                      application_name=f"flowlane-worker-{self.worker_id[:8]}")
        opened = False
        try:
            while not self._shutdown.is_set():
                try:
                    if not opened:
                        await store.open()
                        opened = True
                    found = await store.deployment(self.name)
                except TRANSIENT as exc:
                    log.event(WARNING, "database_unavailable", component="disabled_wait",
                              error=describe(exc), retry_in=DISABLED_POLL)
                else:
                    if found is None or found.enabled:
                        raise errors.DeploymentEnabled(
                            f"deployment {self.name} is enabled again: exiting to be restarted "
                            "with the current definitions")
                await self._stopped_within(DISABLED_POLL)
        finally:
            await store.close()

    async def _stopped_within(self, seconds: float) -> None:
        """Sleep up to ``seconds``, returning soon after a stop request."""
        deadline = time.monotonic() + seconds
        while not self._shutdown.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(STOP_CHECK, max(0.0, deadline - time.monotonic())))

    async def _serve_once(self) -> None:
        try:
            registry = self.load_handlers()
        except errors.FlowlaneError as refused:
            registry_error: errors.FlowlaneError | None = refused
        else:
            registry_error = None
        target = db.resolve(self.config.dsn)
        dsn = target.dsn
        if target.pooled and self.config.notify:
            self._poll_through_pooler()
        store = Store(dsn, application_name=f"flowlane-worker-{self.worker_id[:8]}")
        try:
            await store.open()
        except psycopg.ProgrammingError as exc:  # libpq cannot parse the DSN
            await store.close()
            raise db.invalid_dsn(target, exc) from exc
        except psycopg.Error as exc:
            await store.close()
            if registry_error is not None:
                raise registry_error from None
            raise errors.DatabaseUnavailable(
                f"worker cannot connect to {db.redact(dsn)}: {first_line(exc)}",
                hint="start the server or fix --dsn / FLOWLANE_DSN / DATABASE_URL",
            ) from exc
        except Exception:
            await store.close()
            raise
        try:
            try:
                if registry_error is not None:
                    raise registry_error
                await self._startup(store)
            except (errors.WorkerDisabled, errors.DatabaseUnavailable):
                raise  # the deployment's flag says why already; or nowhere to record it
            except errors.FlowlaneError as refused:
                await self._record_refusal(store, refused)
                raise
            session = self._session = self._open_session(store, registry)
            self.ready.set()
            await self._serve(session)
        finally:
            await store.close()
        if self.stopped_by is not None:
            self.stopped_by.raise_unless_requested()

    async def _record_refusal(self, store: Store, refused: errors.FlowlaneError) -> None:
        """Leave why this worker refuses to start where waits are explained (``run``,
        ``queue list``, the console); the refusal itself is what the caller sees, so a
        failure to record it is only logged."""
        reason = "\n".join(line.rstrip() for line in str(refused).splitlines() if line.strip())
        try:
            await store.record_refusal(self.queue, self.name, reason, refused.hint)
        except (psycopg.Error, OSError) as exc:
            log.event(WARNING, "refusal_not_recorded", error=first_line(exc))

    def _open_session(self, store: Store, registry: HandlerRegistry) -> Session:
        session = Session(
            store,
            registry,
            ResultSender(store, self.worker_id),
            # a thread per slot, started now: a thread started while tasks drain costs them
            # the time the loop waits for it; none when every handler is ``async def``
            HandlerThreads(self.max_concurrent if registry.serves_sync else 0),
            slots=asyncio.Semaphore(self.max_concurrent),
            tracing=Tracing.configured(),  # after the handler modules, which may set up the SDK
            threads_are_slots=registry.serves_only_sync,
        )
        with self._lock:
            if self.phase is Phase.STARTING:
                self.phase = Phase.SERVING
        if self._shutdown.is_set():  # stop() or a signal during startup
            session.stopping.set()
        return session

    def _install_signal_handlers(self) -> None:
        if not self.config.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        again = self._shutdown.is_set()
        log.event(
            WARNING if again else INFO,
            "signal_received",
            signal=sig.name,
            action="abandon in-flight tasks" if again else "graceful stop",
        )
        self._request_stop(Stop(StopReason.SIGNAL), abandon=again)

    def _request_stop(self, stop: Stop, *, abandon: bool = False) -> bool:
        """Every stop, from any thread: keep the heaviest reason, move to DRAINING (or
        ABANDONING), set ``ctx.shutdown``, wake the loops. Whether ``stop`` is the reason now."""
        with self._lock:
            recorded = stop.outweighs(self.stopped_by)
            if recorded:
                self.stopped_by = stop
            if abandon and self.phase is not Phase.STOPPED:
                self.phase = Phase.ABANDONING
            elif self.phase in (Phase.STARTING, Phase.SERVING):
                self.phase = Phase.DRAINING
        self._shutdown.set()
        loop = self._loop
        if loop is not None and _running_loop() is loop:  # the loops see it before they go on
            self._wake_loops()
        elif loop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(self._wake_loops)
        return recorded

    def _wake_loops(self) -> None:
        """On the loop, after a stop request: every loop ends its wait; when abandoning, the
        running handlers are abandoned now."""
        session = self._session
        if session is None:  # still starting: the session starts stopped
            return
        session.stopping.set()
        session.wake.set()
        session.capacity.set()
        if self.phase is Phase.ABANDONING:
            _abandon_running(session)

    def _poll_through_pooler(self) -> None:
        """A transaction-mode pooler hands each transaction to any server session, and a
        LISTEN stays behind in one: the notifications would never arrive. Poll instead."""
        self.config = dataclasses.replace(self.config, notify=False)
        log.event(INFO, "notifications_off", reason="the DSN goes through a transaction-mode pooler "
                  "(pooler=transaction), where LISTEN cannot work",
                  fallback=f"read_with_poll every {defaults.READ_POLL_MS}ms")

    async def _startup(self, store: Store) -> None:
        await StartupChecks(
            project=self.project,
            flows=self.selection.flows,
            queue=self.queue,
            name=self.name,
            pairs=self.pairs,
            worker_id=self.worker_id,
            compile=self.compile,
            notify=self.config.notify,
        ).run(store)
        log.event(
            INFO,
            "worker_started",
            worker_id=self.worker_id,
            name=self.name,
            queue=self.queue,
            flows=",".join(self.selection.flows),
            pairs=len(self.pairs),
            max_concurrent=self.max_concurrent,
            batch_size=self.batch_size,
            notify=self.config.notify,
        )

    async def _serve(self, session: Session) -> None:
        notify = self.config.notify
        # LISTEN before the first read, so that nothing inserted after that read goes unnoticed
        listening = await self._listen(session) if notify else None
        session.notify_live = listening is not None
        poller = self._background(session, self._poll_loop(session), "poller")
        flusher = self._background(session, self._flush_loop(session), "flusher")
        helpers = [
            self._background(session, self._maintenance_loop(session), "maintenance"),
            self._background(session, self._lease_loop(session), "leases"),
        ]
        if notify:
            helpers.append(
                self._background(session, self._listen_loop(session, listening), "listener")
            )
        await session.stopping.wait()
        log.event(INFO, "worker_stopping", worker_id=self.worker_id, in_flight=len(session.held),
                  reason=self.stopped_by.reason.name if self.stopped_by else None)
        await asyncio.wait({poller}, timeout=self.config.poll_interval + 5)
        poller.cancel()
        await self._drain_in_flight(session)
        session.results.put_nowait(None)
        done, _ = await asyncio.wait({flusher}, timeout=max(5.0, self.config.shutdown_timeout / 2))
        if not done:
            log.event(
                WARNING,
                "results_abandoned",
                pending=session.results.qsize(),
                note="left for stalled recovery",
            )
            flusher.cancel()
        unsent = list(session.held)  # results not committed (the flusher gave up): stalled recovery's
        for handle in [*unsent, *helpers]:
            handle.cancel()
        await asyncio.gather(poller, flusher, *helpers, *unsent, return_exceptions=True)
        session.threads.close()
        try:
            with contextlib.suppress(*TRANSIENT):
                await asyncio.wait_for(session.store.mark_stopped(self.worker_id), timeout=5)
        except TimeoutError:
            pass
        with self._lock:
            self.phase = Phase.STOPPED
        log.event(INFO, "worker_stopped", worker_id=self.worker_id, **session.counters.as_dict())

    async def _drain_in_flight(self, session: Session) -> None:
        """Wait up to ``shutdown_timeout`` for running handlers (none when ABANDONING: a
        second signal cancels them, which ends this wait), then abandon those still running."""
        abandoning = self.phase is Phase.ABANDONING
        deadline = time.monotonic() + (0.0 if abandoning else self.config.shutdown_timeout)
        while session.held and self.phase is not Phase.ABANDONING:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.wait(session.held, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        _abandon_running(session)

    def _background(
        self, session: Session, coro: Awaitable[None], name: str
    ) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a crashed component stops the worker
                log.event(
                    ERROR, "worker_crashed", component=name, error=describe(exc), exc_info=exc
                )
                self._request_stop(Stop(
                    StopReason.CRASHED,
                    f"the worker stopped after an internal error in its {name}: {describe(exc)}",
                    hint="in-flight tasks were finished or left for stalled recovery; "
                    "see the worker_crashed log line and restart the worker",
                ))

        return asyncio.create_task(guarded(), name=f"flowlane-{name}")

    # -- poller -----------------------------------------------------------

    async def _poll_loop(self, session: Session) -> None:
        backoff = Backoff()
        # before an idle wait: whether the queue's inserting transactions were all waited for
        # since the last claim that found work
        settled = False
        while not session.stopping.is_set():
            session.capacity.clear()  # before counting: a handler finishing now sets it again
            unfinished = session.unfinished()
            prefetch = self._prefetch(session)
            free = self.max_concurrent + prefetch - unfinished
            uncommitted = len(session.held) - unfinished
            # busy: wait for a worthwhile batch instead of a trickle (prefetching, half of what
            # is prefetched: the slots still have the other half); or enough results wait for
            # their commit: a slow database throttles the claims
            if free < max(self._min_read, prefetch // 2) or uncommitted >= self._uncommitted_bound:
                log.event(DEBUG, "poller_full", held=len(session.held), uncommitted=uncommitted)
                await session.pause(60.0, session.capacity)
                continue
            notified = session.notify_live
            session.wake.clear()
            try:
                if session.definitions.is_set():  # before the next claim can meet new work
                    session.definitions.clear()
                    await self._recheck_coverage(session)
                    if session.stopping.is_set():
                        return
                claim = await self._claim(session.store, min(free, self.batch_size), notified)
            except TRANSIENT as exc:
                if not is_transient(exc):  # e.g. a dropped queue: stop loudly, not spin
                    raise
                await backoff.retry_later("poller", exc, session.pause)
                continue
            backoff.reset()
            if claim.batch:
                settled = False
            if claim.unsupported:
                await self._unsupported(session, claim.batch, claim.unsupported)
                return
            parents = await self._trace_parents(session, claim.tasks)
            claimed_at = time.monotonic()  # shared by the claim's tasks: they were claimed together
            for task in claim.tasks:
                self._spawn(session, task, claimed_at, parents.get(task.run_id))
            if claim.rate_limited_ms is not None:
                # the queue's rate limit allows the next start then: sleep exactly until it
                # (a new message's notification cannot make it sooner)
                log.event(DEBUG, "poller_rate_limited", wait=f"{claim.rate_limited_ms}ms")
                await session.pause(claim.rate_limited_ms / 1000)
                continue
            if claim.at_capacity and not notified:  # nothing wakes this poller: poll
                await session.pause(self.config.poll_interval, session.wake)
                continue
            # (at capacity: the end of a started task on the queue notifies its listeners)
            if not claim.batch and notified and not session.stopping.is_set():
                if not settled:  # an insert's notification may be left to one on its way
                    settled = await self._await_inserts(session)
                    continue  # claim once more: what they committed is visible now
                settled = False
                log.event(DEBUG, "poller_idle", wait=f"{self.config.poll_interval:g}s")
                await session.pause(self.config.poll_interval, session.wake)

    async def _await_inserts(self, session: Session) -> bool:
        """Wait for the transactions inserting into the queue to end (a queue has one
        notification on its way at a time: an insert made meanwhile sends none, and this wait
        is what finds its message); False when they did not end in time (the poller claims
        and waits again) or the database could not be asked (after a pause)."""
        try:
            return await session.store.await_inserts(self.queue, defaults.AWAIT_INSERTS_MS)
        except TRANSIENT as exc:
            if not is_transient(exc):
                raise
            log.event(WARNING, "database_unavailable", component="poller", error=describe(exc))
            await session.pause(defaults.AWAIT_INSERTS_MS / 1000, session.wake)
            return False

    def _prefetch(self, session: Session) -> int:
        """Tasks claimed beyond the slots: while handlers are short, what the slots run in
        ``PREFETCH_BELOW`` (at most a batch), else none."""
        recent = session.handler_seconds
        if recent is None:
            return 0
        return prefetch_for(self.max_concurrent, self.batch_size, recent)

    async def _trace_parents(self, session: Session, tasks: list[ClaimedTask]) -> dict[str, str]:
        """The trace contexts the tasks' runs were started in (asked only when tracing)."""
        if session.tracing is None or not tasks:
            return {}
        return await session.store.trace_parents(sorted({t.run_id for t in tasks}))

    async def _claim(self, store: Store, qty: int, notified: bool) -> Claim:
        """One round trip (``claim_tasks``) while notifications wake the poller; without
        them, ``read_with_poll`` waits in the database for messages, then ``start_tasks``."""
        if notified:
            return await store.claim_tasks(self.queue, qty, self.worker_id, self.pairs)
        msg_ids = await store.read(
            self.queue, vt=self.config.read_vt, qty=qty, poll_seconds=self._poll_window
        )
        if not msg_ids:
            return Claim()
        return await store.start_tasks(self.queue, msg_ids, self.worker_id, self.pairs)

    async def _unsupported(
        self, session: Session, batch: list[int], unsupported: list[Unsupported]
    ) -> None:
        """The batch was handed back whole. Work of pairs that the definitions route to this
        queue means they changed since this registry was loaded: exit for a restart. Work
        that no definition explains disables the deployment."""
        try:
            gaps = await session.store.coverage(self.queue, self.pairs)
        except TRANSIENT as exc:  # cannot tell: a restart is harmless, a disable is not
            log.event(WARNING, "database_unavailable", component="poller", error=describe(exc))
            self._outdated([u.pair for u in unsupported])
            return
        routed = {(g.flow_slug, g.step_slug): g for g in gaps}
        if all((u.flow_slug, u.step_slug) in routed for u in unsupported):
            self._outdated([gap_line(g) for g in routed.values()])
        else:
            await self._refuse_unsupported(session, batch, unsupported)

    async def _refuse_unsupported(
        self, session: Session, batch: list[int], unsupported: list[Unsupported]
    ) -> None:
        """``start_tasks`` claimed nothing and made the whole batch visible again: stop, and
        disable the deployment so that a supervisor's restarts refuse until it is enabled."""
        pairs = sorted({u.pair for u in unsupported})
        reason = (
            f"unsupported work on queue {self.queue}: message(s) "
            f"{', '.join(str(u.msg_id) for u in unsupported)} of {', '.join(pairs)} "
            f"(worker {self.worker_id})"
        )
        log.event(
            ERROR,
            "unsupported_work",
            queue=self.queue,
            msg_ids=",".join(map(str, batch)),
            unsupported=",".join(str(u.msg_id) for u in unsupported),
            pairs=",".join(pairs),
            action="disable deployment and stop",
        )
        backoff = Backoff()
        for _ in range(5):  # the stop matters more than the flag: give up after a few tries
            try:
                await session.store.disable_deployment(self.name, reason)
                break
            except TRANSIENT as exc:
                await backoff.retry_later("poller", exc, session.pause)
        self._request_stop(Stop(
            StopReason.UNSUPPORTED_WORK,
            f"stopped: {reason}; deployment {self.name} is disabled",
            hint="deploy a worker that serves these pairs (or fix the routing), then "
            f"`flowlane worker enable {self.name}`",
        ))

    def _spawn(
        self, session: Session, task: ClaimedTask, claimed_at: float, trace_parent: str | None = None
    ) -> None:
        session.counters.claimed += 1
        metrics.task_started(task)
        registered = session.registry.get(task.flow_slug, task.step_slug)
        if registered is None:  # start_tasks claims only the pairs this registry serves
            raise RuntimeError(f"claimed {task.flow_slug}.{task.step_slug} without its handler")
        ctx = TaskContext(
            run_id=task.run_id,
            flow_slug=task.flow_slug,
            step_slug=task.step_slug,
            task_index=task.task_index,
            attempt=task.attempt,
            flow_input=task.flow_input,
            queue_name=task.queue_name,
            msg_id=task.msg_id,
            worker_id=self.worker_id,
            shutdown=self._shutdown,
            log=logging.LoggerAdapter(
                logging.getLogger(f"flowlane.handler.{task.flow_slug}"), dict(task.fields)
            ),
            deadline=task.deadline,
        )

        async def run_one(held: InFlightTask) -> None:
            tracing = session.tracing
            if session.threads_are_slots:  # a prefetched task waits in the threads' queue
                span = tracing.start(task, trace_parent, self._is_map(task)) if tracing else None
                result = await execute(task, registered, ctx, session.threads, held.begin)
            else:
                async with session.slots:  # a prefetched task waits here for a slot
                    held.begin(time.perf_counter())
                    span = tracing.start(task, trace_parent, self._is_map(task)) if tracing else None
                    result = await execute(task, registered, ctx, session.threads)
            held.running = False
            session.handler_returned(result.seconds)
            metrics.task_finished(task, result)
            if tracing is not None:
                tracing.finish(span, result)
            committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            session.results.put_nowait((result, committed))
            await committed  # held (leased) until the result is in the database; the slot is free

        held = InFlightTask(task, claimed_at)
        handle = asyncio.create_task(run_one(held))
        session.held[handle] = held
        handle.add_done_callback(session.finished)

    def _is_map(self, task: ClaimedTask) -> bool:
        return self.project.flow(task.flow_slug).step(task.step_slug).type == "map"

    # -- flusher ----------------------------------------------------------

    async def _flush_loop(self, session: Session) -> None:
        await ResultFlusher(
            session.sender, session.results, session.counters,
            claim_mates_running=session.claim_mates_running, committed=session.wake.set,
        ).run()

    # -- maintenance and notifications ------------------------------------

    async def _maintenance_loop(self, session: Session) -> None:
        store = session.store
        next_heartbeat = next_requeue = next_progress = next_tick = time.monotonic()
        reported = dataclasses.replace(session.counters)
        while not session.stopping.is_set():
            now = time.monotonic()
            if now >= next_progress:
                next_progress = now + PROGRESS_INTERVAL
                reported = _report_progress(session, reported)
            try:
                if now >= next_heartbeat:
                    next_heartbeat = now + self.config.heartbeat_interval
                    if await store.heartbeat(self.worker_id):
                        self._deprecated()
                if now >= next_requeue:
                    next_requeue = now + self.config.requeue_interval
                    requeued = await store.requeue_stalled()
                    if requeued:
                        log.event(WARNING, "stalled_tasks_requeued", count=requeued)
                        metrics.stalls_recovered(requeued)
                    await self._recheck_coverage(session)
                if now >= next_tick:
                    next_tick = now + defaults.TICK_INTERVAL
                    await self._tick(store)
            except DATABASE_ERRORS as exc:
                _maintenance_error(exc)
            wake_at = min(next_heartbeat, next_requeue, next_progress, next_tick)
            await session.pause(max(0.05, wake_at - time.monotonic()))

    def _deprecated(self) -> None:
        if self._request_stop(Stop(
            StopReason.DEPRECATED,
            f"worker {self.name} was deprecated by a rollout: stopped gracefully "
            "to be restarted with the definitions the rollout applies",
            hint="a supervisor restarts it (exit status 4); while the rollout "
            "keeps the deployment disabled, the restarted worker waits "
            "(--when-disabled wait) or exits 3",
        )):
            log.event(WARNING, "worker_deprecated", worker_id=self.worker_id,
                      action="graceful stop, then exit for a restart")

    async def _tick(self, store: Store) -> None:
        """The maintenance tick every worker runs (safe with any number at once)."""
        done = await store.maintenance_tick()
        if any(done.values()):
            log.event(INFO, "maintenance_tick", **done)

    async def _lease_loop(self, session: Session) -> None:
        """Renew the leases of held tasks until ``_serve`` cancels this loop, after the last
        results are committed: through a shutdown's drain and final flush as well, so that
        no claim outlives its lease while its result is still on the way."""
        while True:
            await asyncio.sleep(LEASE_INTERVAL)
            try:
                await self._extend_leases(session, time.monotonic())
            except DATABASE_ERRORS as exc:
                _maintenance_error(exc)

    async def _extend_leases(self, session: Session, now: float) -> None:
        """Keep the leases of tasks held for a while (handler running or result pending)."""
        items = [
            h.lease_item() for h in session.held.values() if now - h.claimed_at >= LEASE_INTERVAL
        ]
        if items:
            extended = await session.store.extend_leases(self.worker_id, items)
            log.event(DEBUG, "leases_extended", held=len(items), extended=extended)

    async def _recheck_coverage(self, session: Session) -> None:
        """Routing state changed (an alias moved, a new version was applied, a run of another
        version started): when the database now routes pairs here that this registry does
        not serve, stop claiming and ask to be restarted with the current YAML."""
        gaps = await session.store.coverage(self.queue, self.pairs)
        if gaps:
            self._outdated([gap_line(g) for g in gaps])

    def _outdated(self, missing: list[str]) -> None:
        if self._request_stop(Stop(
            StopReason.OUTDATED,
            f"queue {self.queue} is now routed pairs this worker does not serve: "
            + "; ".join(missing),
            hint="restart the worker from the project's current YAML (`flowlane serve` does); "
            "a separate deployment for them needs `flowlane rollout`",
        )):
            log.event(
                WARNING,
                "definitions_changed",
                queue=self.queue,
                missing="; ".join(missing),
                action="stop claiming and exit for a restart with the current registry",
            )

    async def _listen(self, session: Session) -> psycopg.AsyncConnection[Any] | None:
        try:
            return await session.store.listen_connection(self.queue)
        except TRANSIENT as exc:
            log.event(WARNING, "database_unavailable", component="listener", error=describe(exc))
            return None

    async def _listen_loop(
        self, session: Session, first: psycopg.AsyncConnection[Any] | None
    ) -> None:
        backoff = Backoff()
        insert_channel = channel(self.queue)
        while not session.stopping.is_set():
            try:
                conn = first or await session.store.listen_connection(self.queue)
                first = None
            except TRANSIENT as exc:
                await backoff.retry_later("listener", exc, session.pause)
                continue
            try:
                session.notify_live = True
                session.wake.set()  # something may have arrived while we were not listening
                backoff.reset()
                while not session.stopping.is_set():
                    async for note in conn.notifies(timeout=1.0):
                        if note.channel == insert_channel:
                            session.wake.set()
                        else:  # a definition changed: re-check coverage before claiming more
                            session.definitions.set()
                            session.wake.set()
            except TRANSIENT as exc:
                log.event(
                    WARNING, "notifications_lost", error=describe(exc), fallback="read_with_poll"
                )
            finally:
                session.notify_live = False
                with contextlib.suppress(Exception):
                    await conn.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # called from a thread without one
        return None


def _abandon_running(session: Session) -> None:
    """Cancel the handlers still running: their tasks stay ``started`` for stalled recovery.
    A finished handler's task stays held (leased) until its result commits."""
    for handle, held in list(session.held.items()):
        if held.running and not handle.cancelling():
            log.event(WARNING, "task_abandoned", **held.task.fields, note="left for stalled recovery")
            handle.cancel()


def _report_progress(session: Session, reported: Counters) -> Counters:
    """Per-task lines are DEBUG; INFO gets the counters every few seconds, when they moved."""
    now = session.counters.as_dict()
    if now != reported.as_dict():
        before = reported.as_dict()
        log.event(
            INFO,
            "worker_progress",
            **{f"{key}_total": value for key, value in now.items()},
            **{key: value - before[key] for key, value in now.items()},
            held=len(session.held),
        )
    return dataclasses.replace(session.counters)


def _maintenance_error(exc: BaseException) -> None:
    if is_transient(exc):
        log.event(WARNING, "database_unavailable", component="maintenance", error=describe(exc))
    else:
        log.event(ERROR, "maintenance_failed", error=describe(exc))


def _as_project(project: Project | str | Path) -> Project:
    """The validated project: as given, or loaded from a path (``CompileError`` if invalid)."""
    if isinstance(project, Project):
        return project
    if isinstance(project, str | Path):
        return api.load_project(project)
    raise errors.ProjectError(f"cannot use {type(project).__name__} as a flowlane project")
