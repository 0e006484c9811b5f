"""The worker: poll one PGMQ queue, run handlers, report results.

Lifecycle: ``run()`` validates and imports every handler routed to the
queue, verifies every flow it serves against the database (read-only: a
missing or different flow refuses the start; ``compile=True`` creates missing
ones through the SQL ``apply`` runs), checks that it covers every (flow, step)
the database routes to the queue, enables PGMQ insert notifications,
registers the worker under its deployment (refused while the deployment is
disabled), then serves until ``stop()``, SIGTERM or SIGINT. Serving is four
asyncio tasks on one loop:

- poller: read and claim a batch (at most the free handler slots) in one
  round trip, ``claim_tasks`` with the exact (flow, step) pairs served, start
  one handler per claimed task. A batch with unsupported work is handed back
  whole; the worker then disables its deployment and stops (exit
  status 3). It wakes on PGMQ's
  insert notification and polls every ``poll_interval`` as a fallback; while
  the notification connection is down it uses ``pgmq.read_with_poll``;
- flusher: sends results, completions batched through ``complete_tasks``,
  failures through ``fail_tasks``, both fenced by worker id and attempt;
- maintenance: heartbeat (a deprecated worker stops), lease extension
  (``extend_leases``) for the tasks held longer than ``LEASE_INTERVAL``, and
  every ``requeue_interval`` seconds ``requeue_stalled_tasks`` (cheap and SKIP
  LOCKED, so every worker does it) and a coverage re-check;
- listener: LISTEN on the queue's insert channel.

Backpressure: a handler slot is held from the claim until the task's result
is committed (not until the handler returns), so the result backlog never
exceeds ``max_concurrent`` and a worker claims only what it can finish within
its leases. Sync handlers run in daemon threads, ``async def`` handlers on the
loop. Any database error that a retry can fix (``store.is_transient``: a
restart, a killed backend, a deadlock) is retried with backoff. Stopping:
stop reading, set ``ctx.shutdown``, wait up to ``shutdown_timeout`` for
in-flight handlers, send their results, mark the worker stopped. Handlers
still running are abandoned: their tasks stay ``started`` and stalled
recovery requeues them (a stall counts as an attempt); nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from flowlane import errors, project_root
from flowlane.compiler.model import Project
from flowlane.compiler.shape import flow_shape
from flowlane.core import db, definitions
from flowlane.runtime import hints, log
from flowlane.runtime.backoff import Backoff
from flowlane.runtime.context import TaskContext
from flowlane.runtime.registry import HandlerRegistry, source_line
from flowlane.runtime.results import ResultSender
from flowlane.runtime.selection import Selection, select
from flowlane.runtime.store import (
    DATABASE_ERRORS,
    TRANSIENT,
    Claim,
    Store,
    Unsupported,
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

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
MAX_POLL_WINDOW = 2  # seconds
# leases of tasks held this long are extended, every LEASE_INTERVAL: far inside the stall
# threshold (timeout + 30 s, timeout >= 3 s)
LEASE_INTERVAL = 2.0  # seconds
# defaults measured with benchmarks/worker_throughput.py (benchmarks/RESULTS.md): 10/10 left
# the database idle between small claims; 50/50 drains about 1.5x faster
DEFAULT_MAX_CONCURRENT = 100  # two claims of 50 in flight: one overlaps the other's result commit
DEFAULT_BATCH_SIZE = 50
PROGRESS_INTERVAL = 5.0  # seconds between INFO counter lines (per-task lines are DEBUG)


@dataclass
class Held:
    """A claimed task from its claim until its result is committed (one handler slot)."""

    task: ClaimedTask
    claimed_at: float
    running: bool = True  # False once the handler returned and the result waits for the flusher

    def lease_item(self) -> dict[str, Any]:
        return {
            "run_id": self.task.run_id,
            "step_slug": self.task.step_slug,
            "task_index": self.task.task_index,
            "attempt": self.task.attempt,
            "running": self.running,
        }


class Worker:
    """Serve the handlers routed to one queue. ``run()`` blocks; ``stop()`` is thread-safe."""

    def __init__(
        self,
        project: Project | str | Path,
        *,
        queue: str | None = None,
        flow: str | None = None,
        step: str | None = None,
        flows: list[str] | None = None,
        dsn: str | None = None,
        name: str | None = None,
        max_concurrent: int | None = None,
        batch_size: int | None = None,
        notify: bool = True,
        poll_interval: float = 2.0,
        read_vt: int = 5,
        shutdown_timeout: float = 30.0,
        heartbeat_interval: float = 5.0,
        requeue_interval: float = 15.0,
        import_paths: Sequence[str] = (),
        handle_signals: bool = True,
        compile: bool = False,
    ) -> None:
        self.project = _as_project(project)
        self.selection: Selection = select(
            self.project, queue=queue, flow=flow, step=step, flows=flows, name=name
        )
        deployment = self.selection.deployment
        self.queue = self.selection.queue
        self.name = name or self.selection.default_name  # also the deployment name
        self.pairs = sorted({(h.flow_slug, h.step_slug) for h in self.selection.handlers})
        self.compile = compile
        # None = the deployment's value; 0 is refused below, never taken for "unset"
        if max_concurrent is None:
            max_concurrent = deployment.max_concurrent if deployment else DEFAULT_MAX_CONCURRENT
        if batch_size is None:
            batch_size = deployment.batch_size if deployment else DEFAULT_BATCH_SIZE
        self.max_concurrent = max_concurrent
        self.batch_size = batch_size
        if self.max_concurrent < 1 or self.batch_size < 1:
            raise errors.UsageError(
                "max_concurrent and batch_size must be at least 1",
                hint="--max-concurrent N and --batch-size N take a positive number",
            )
        for option, seconds in (
            ("poll_interval", poll_interval),
            ("heartbeat_interval", heartbeat_interval),
            ("requeue_interval", requeue_interval),
        ):
            if not seconds > 0:  # also NaN; 0 would make the worker spin on the database
                raise errors.UsageError(
                    f"{option} must be a positive number of seconds, not {seconds:g}",
                    hint=f"--{option.replace('_', '-')} takes seconds greater than 0",
                )
        if not shutdown_timeout >= 0:
            raise errors.UsageError(
                f"shutdown_timeout must be 0 or more seconds, not {shutdown_timeout:g}",
                hint="--shutdown-timeout 0 abandons in-flight handlers at once",
            )
        self.dsn = dsn
        self.notify = notify
        self.poll_interval = poll_interval
        self.read_vt = read_vt
        self.shutdown_timeout = shutdown_timeout
        self.heartbeat_interval = heartbeat_interval
        # read_with_poll's window while notifications are off or down: short, so a stop or a
        # recovered notification connection is noticed quickly
        # while handlers run, read only once at least half a batch of slots is free
        self._min_read = max(1, min(self.batch_size, self.max_concurrent) // 2)
        self._poll_window = max(1, min(int(poll_interval), MAX_POLL_WINDOW))
        self.requeue_interval = requeue_interval
        # handlers import from the current directory and the project root
        self.import_paths = list(
            dict.fromkeys([str(Path.cwd().resolve()), str(project_root.find_root()), *import_paths])
        )
        self.handle_signals = handle_signals
        self.worker_id = str(uuid.uuid4())
        self.ready = threading.Event()  # set once registered and serving
        self.stats = {"claimed": 0, "completed": 0, "failed": 0, "rejected": 0}
        self._stop_requested = threading.Event()
        self._shutdown = threading.Event()  # ctx.shutdown of every task
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- public -----------------------------------------------------------

    def run(self) -> None:
        """Start up, serve until stopped, shut down gracefully."""
        asyncio.run(self._main())

    def stop(self, *, force: bool = False) -> None:
        """Begin a graceful stop (``force``: abandon in-flight handlers at once)."""
        self._stop_requested.set()
        if force:
            self.shutdown_timeout = 0
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(self._request_stop, force)

    # -- lifecycle --------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._wake = asyncio.Event()
        self._capacity = asyncio.Event()
        self._results: asyncio.Queue[tuple[TaskResult, asyncio.Future[None]] | None] = (
            asyncio.Queue()
        )
        self._in_flight: set[asyncio.Task[None]] = set()
        self._notify_live = False
        self._held: dict[asyncio.Task[None], Held] = {}
        self._crash: str | None = None
        self._fatal: errors.WorkerDisabled | None = None
        self._gaps: set[str] = set()
        if self._stop_requested.is_set():
            self._stopping.set()
        self._install_signal_handlers()
        registry = HandlerRegistry.load(self.selection.handlers, self.import_paths)
        target = db.resolve(self.dsn)
        dsn = target.dsn
        store = Store(dsn, application_name=f"flowlane-worker-{self.worker_id[:8]}")
        try:
            await store.open()
        except psycopg.ProgrammingError as exc:  # libpq cannot parse the DSN
            await store.close()
            raise db.invalid_dsn(target, exc) from exc
        except psycopg.Error as exc:
            await store.close()
            raise errors.DatabaseUnavailable(
                f"worker cannot connect to {db.redact(dsn)}: {first_line(exc)}",
                hint="start the server or fix --dsn / FLOWLANE_DSN / DATABASE_URL",
            ) from exc
        except Exception:
            await store.close()
            raise
        try:
            await self._startup(store)
            self.ready.set()
            await self._serve(store, registry)
        finally:
            await store.close()
        if self._fatal:
            raise self._fatal
        if self._crash:
            raise errors.WorkerError(
                f"the worker stopped after an internal error in its {self._crash}",
                hint="in-flight tasks were finished or left for stalled recovery; "
                "see the worker_crashed log line and restart the worker",
            )

    def _install_signal_handlers(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        again = self._stopping.is_set()
        log.event(
            WARNING if again else INFO,
            "signal_received",
            signal=sig.name,
            action="abandon in-flight tasks" if again else "graceful stop",
        )
        self._request_stop(again)

    def _request_stop(self, force: bool = False) -> None:
        self._stopping.set()
        self._shutdown.set()
        self._wake.set()
        self._capacity.set()
        if force:
            self._force.set()

    async def _startup(self, store: Store) -> None:
        with hints.migrate_hint(), db.wrap_errors("worker startup"):
            await self._refuse_if_disabled(store)  # first: a supervisor must see exit status 3
            await self._verify_flows(store)
            await self._check_coverage(store)
            if self.notify:
                await store.enable_notify(self.queue)
            await self._register(store)
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
            notify=self.notify,
        )

    async def _verify_flows(self, store: Store) -> None:
        """Every flow served must be in the database with the YAML's shape. Workers never
        write definitions; ``compile=True`` creates missing flows through ``apply``'s SQL."""
        missing, problems = [], []
        for slug in self.selection.flows:
            flow = self.project.flow(slug)
            result = await store.verify_flow(slug, flow_shape(flow))
            status = result.get("status")
            if status == "missing":
                missing.append(slug)
            elif status == "mismatch":
                differences = result.get("differences") or ["(no details)"]
                problems.append(f"flow {slug} ({source_line(flow.location, slug)}):\n    "
                                + "\n    ".join(map(str, differences)))
            else:
                log.event(INFO, "flow_checked", flow=slug, status=status)
        if problems:
            raise errors.WorkerError(
                "the database holds flows whose shape differs from the YAML:\n  "
                + "\n  ".join(problems),
                hint="a structural change needs a new flow slug (e.g. _v2) and an alias move; "
                "`flowlane plan` shows every difference",
            )
        if missing:
            await self._create_missing(store, missing)

    async def _create_missing(self, store: Store, missing: list[str]) -> None:
        if not self.compile:
            raise errors.WorkerError(
                "flows missing from the database: " + ", ".join(missing),
                hint="apply the reviewed SQL first: `flowlane compile`, review, `flowlane apply` "
                "(on a development database, `flowlane worker --compile` creates them)",
            )
        created = await asyncio.to_thread(definitions.create_flows, self.project, missing, store.dsn)
        log.event(INFO, "flows_compiled", flows=",".join(created))

    async def _check_coverage(self, store: Store) -> None:
        gaps = await store.coverage(self.queue, self.pairs)
        if gaps:
            raise errors.WorkerError(
                f"this worker does not serve every (flow, step) routed to queue {self.queue}:\n  "
                + "\n  ".join(_gap_line(g) for g in gaps),
                hint="serve them too (list the flows in the queue's `kind: worker` document or "
                "--flows), or start another deployment for them before this one",
            )

    async def _refuse_if_disabled(self, store: Store) -> None:
        found = await store.deployment(self.name)
        if found is not None and not found["enabled"]:
            raise self._disabled(found["reason"] or "no reason given")

    async def _register(self, store: Store) -> None:
        """Registration checks the flag again, atomically (it may change during startup)."""
        try:
            await store.register(self.worker_id, self.queue, self.name, self.name, self.pairs)
        except psycopg.errors.ObjectNotInPrerequisiteState as exc:
            if "FLOWLANE_DEPLOYMENT_DISABLED" not in str(exc):
                raise
            raise self._disabled(_disabled_reason(exc)) from exc

    def _disabled(self, reason: str) -> errors.WorkerDisabled:
        return errors.WorkerDisabled(
            f"worker deployment {self.name} is disabled: {reason}",
            hint=f"after fixing the cause, run `flowlane worker enable {self.name}`",
        )

    async def _serve(self, store: Store, registry: HandlerRegistry) -> None:
        self._store = store
        self._registry = registry
        self._sender = ResultSender(store, self.worker_id, self.stats)
        self._threads = HandlerThreads(self.max_concurrent)
        # LISTEN before the first read, so that nothing inserted after that read goes unnoticed
        listening = await self._listen() if self.notify else None
        self._notify_live = listening is not None
        poller = self._background(self._poll_loop(), "poller")
        flusher = self._background(self._flush_loop(), "flusher")
        helpers = [self._background(self._maintenance_loop(), "maintenance")]
        if self.notify:
            helpers.append(self._background(self._listen_loop(listening), "listener"))
        await self._stopping.wait()
        log.event(INFO, "worker_stopping", worker_id=self.worker_id, in_flight=len(self._in_flight))
        self._shutdown.set()
        await asyncio.wait({poller}, timeout=self.poll_interval + 5)
        poller.cancel()
        await self._drain_in_flight()
        self._results.put_nowait(None)
        done, _ = await asyncio.wait({flusher}, timeout=max(5.0, self.shutdown_timeout / 2))
        if not done:
            log.event(
                WARNING,
                "results_abandoned",
                pending=self._results.qsize(),
                note="left for stalled recovery",
            )
            flusher.cancel()
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(poller, flusher, *helpers, return_exceptions=True)
        self._threads.close()
        try:
            with contextlib.suppress(*TRANSIENT):
                await asyncio.wait_for(store.mark_stopped(self.worker_id), timeout=5)
        except TimeoutError:
            pass
        log.event(INFO, "worker_stopped", worker_id=self.worker_id, **self.stats)

    async def _drain_in_flight(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        while self._in_flight and not self._force.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            force = asyncio.ensure_future(self._force.wait())
            await asyncio.wait(
                {*self._in_flight, force}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            force.cancel()
        for handle in list(self._in_flight):
            held = self._held.get(handle)
            if held is not None and held.running:  # a finished handler's result is still sent
                log.event(
                    WARNING, "task_abandoned", **held.task.fields, note="left for stalled recovery"
                )
            handle.cancel()

    def _background(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a crashed component stops the worker
                log.event(
                    ERROR, "worker_crashed", component=name, error=describe(exc), exc_info=exc
                )
                self._crash = self._crash or f"{name}: {describe(exc)}"
                self._request_stop()

        return asyncio.create_task(guarded(), name=f"flowlane-{name}")

    async def _pause(self, seconds: float, event: asyncio.Event | None = None) -> None:
        """Sleep ``seconds``, returning early when stopping (or when ``event`` is set)."""
        waiters = {asyncio.ensure_future(self._stopping.wait())}
        if event is not None:
            waiters.add(asyncio.ensure_future(event.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # -- poller -----------------------------------------------------------

    async def _poll_loop(self) -> None:
        backoff = Backoff()
        while not self._stopping.is_set():
            self._capacity.clear()  # before counting: a handler finishing now sets it again
            free = self.max_concurrent - len(self._in_flight)
            if free < self._min_read:  # busy: wait for a worthwhile batch instead of a trickle
                # slots free when results commit: a slow database throttles the claims
                log.event(DEBUG, "poller_full", held=len(self._in_flight))
                await self._pause(60.0, self._capacity)
                continue
            notified = self._notify_live
            self._wake.clear()
            try:
                claim = await self._claim(min(free, self.batch_size), notified)
            except TRANSIENT as exc:
                if not is_transient(exc):  # e.g. a dropped queue: stop loudly, not spin
                    raise
                await backoff.retry_later("poller", exc, self._pause)
                continue
            backoff.reset()
            if claim.unsupported:
                await self._refuse_unsupported(claim.batch, claim.unsupported)
                return
            for task in claim.tasks:
                self._spawn(task)
            if not claim.batch and notified and not self._stopping.is_set():
                log.event(DEBUG, "poller_idle", wait=f"{self.poll_interval:g}s")
                await self._pause(self.poll_interval, self._wake)

    async def _claim(self, qty: int, notified: bool) -> Claim:
        """One round trip (``claim_tasks``) while notifications wake the poller; without
        them, ``read_with_poll`` waits in the database for messages, then ``start_tasks``."""
        if notified:
            return await self._store.claim_tasks(self.queue, qty, self.worker_id, self.pairs)
        msg_ids = await self._store.read(
            self.queue, vt=self.read_vt, qty=qty, poll_seconds=self._poll_window
        )
        if not msg_ids:
            return Claim()
        return await self._store.start_tasks(self.queue, msg_ids, self.worker_id, self.pairs)

    async def _refuse_unsupported(self, batch: list[int], unsupported: list[Unsupported]) -> None:
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
                await self._store.disable_deployment(self.name, reason)
                break
            except TRANSIENT as exc:
                await backoff.retry_later("poller", exc, self._pause)
        self._fatal = errors.WorkerDisabled(
            f"stopped: {reason}; deployment {self.name} is disabled",
            hint="deploy a worker that serves these pairs (or fix the routing), then "
            f"`flowlane worker enable {self.name}`",
        )
        self._request_stop()

    def _spawn(self, task: ClaimedTask) -> None:
        self.stats["claimed"] += 1
        registered = self._registry.get(task.flow_slug, task.step_slug)
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
                logging.getLogger(f"flowlane.handler.{task.flow_slug}"), task.fields
            ),
        )

        async def run_one(held: Held) -> None:
            result = await execute(task, registered, ctx, self._threads)
            held.running = False
            committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._results.put_nowait((result, committed))
            await committed  # the slot stays taken until the result is in the database

        held = Held(task, time.monotonic())
        handle = asyncio.create_task(run_one(held))
        self._in_flight.add(handle)
        self._held[handle] = held
        handle.add_done_callback(self._finished)

    def _finished(self, handle: asyncio.Task[None]) -> None:
        self._in_flight.discard(handle)
        self._held.pop(handle, None)
        self._capacity.set()

    # -- flusher ----------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            first = await self._results.get()
            batch = [first]
            while not self._results.empty():
                batch.append(self._results.get_nowait())
            items = [item for item in batch if item is not None]
            if items:
                await self._sender.send([result for result, _ in items])
                for _, committed in items:
                    if not committed.done():
                        committed.set_result(None)
                self._wake.set()  # a retry with no delay or a new dependent may be ready
            if None in batch:
                return

    # -- maintenance and notifications ------------------------------------

    async def _maintenance_loop(self) -> None:
        next_heartbeat = next_requeue = next_lease = next_progress = time.monotonic()
        reported = dict(self.stats)
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= next_progress:
                next_progress = now + PROGRESS_INTERVAL
                reported = self._report_progress(reported)
            try:
                if now >= next_lease:
                    next_lease = now + LEASE_INTERVAL
                    await self._extend_leases(now)
                if now >= next_heartbeat:
                    next_heartbeat = now + self.heartbeat_interval
                    if await self._store.heartbeat(self.worker_id):
                        log.event(
                            WARNING,
                            "worker_deprecated",
                            worker_id=self.worker_id,
                            action="graceful stop",
                        )
                        self._request_stop()
                if now >= next_requeue:
                    next_requeue = now + self.requeue_interval
                    requeued = await self._store.requeue_stalled()
                    if requeued:
                        log.event(WARNING, "stalled_tasks_requeued", count=requeued)
                    await self._recheck_coverage()
            except DATABASE_ERRORS as exc:
                if is_transient(exc):
                    log.event(
                        WARNING,
                        "database_unavailable",
                        component="maintenance",
                        error=describe(exc),
                    )
                else:
                    log.event(ERROR, "maintenance_failed", error=describe(exc))
            wake_at = min(next_heartbeat, next_requeue, next_lease, next_progress)
            await self._pause(max(0.05, wake_at - time.monotonic()))

    def _report_progress(self, reported: dict[str, int]) -> dict[str, int]:
        """Per-task lines are DEBUG; INFO gets the counters every few seconds, when they moved."""
        if self.stats != reported:
            delta = {key: value - reported.get(key, 0) for key, value in self.stats.items()}
            log.event(
                INFO,
                "worker_progress",
                **{f"{key}_total": value for key, value in self.stats.items()},
                **{key: value for key, value in delta.items()},
                held=len(self._in_flight),
            )
        return dict(self.stats)

    async def _extend_leases(self, now: float) -> None:
        """Keep the leases of tasks held for a while (handler running or result pending)."""
        items = [h.lease_item() for h in self._held.values() if now - h.claimed_at >= LEASE_INTERVAL]
        if items:
            extended = await self._store.extend_leases(self.worker_id, items)
            log.event(DEBUG, "leases_extended", held=len(items), extended=extended)

    async def _recheck_coverage(self) -> None:
        """Routing state changes (an alias moves, a run of another version starts): say
        so once per change; unsupported work itself is refused by ``start_tasks``."""
        gaps = {_gap_line(g) for g in await self._store.coverage(self.queue, self.pairs)}
        if gaps and gaps != self._gaps:
            log.event(
                WARNING,
                "coverage_gap",
                queue=self.queue,
                missing="; ".join(sorted(gaps)),
                note="tasks of these pairs will stop this worker; deploy a worker that serves them",
            )
        self._gaps = gaps

    async def _listen(self) -> psycopg.AsyncConnection[Any] | None:
        try:
            return await self._store.listen_connection(self.queue)
        except TRANSIENT as exc:
            log.event(WARNING, "database_unavailable", component="listener", error=describe(exc))
            return None

    async def _listen_loop(self, first: psycopg.AsyncConnection[Any] | None) -> None:
        backoff = Backoff()
        while not self._stopping.is_set():
            try:
                conn = first or await self._store.listen_connection(self.queue)
                first = None
            except TRANSIENT as exc:
                await backoff.retry_later("listener", exc, self._pause)
                continue
            try:
                self._notify_live = True
                self._wake.set()  # something may have arrived while we were not listening
                backoff.reset()
                while not self._stopping.is_set():
                    async for _ in conn.notifies(timeout=1.0):
                        self._wake.set()
            except TRANSIENT as exc:
                log.event(
                    WARNING, "notifications_lost", error=describe(exc), fallback="read_with_poll"
                )
            finally:
                self._notify_live = False
                with contextlib.suppress(Exception):
                    await conn.close()


def _gap_line(gap: dict[str, Any]) -> str:
    return f"{gap['flow_slug']}.{gap['step_slug']} (needed by: {', '.join(gap['sources'])})"


def _disabled_reason(exc: psycopg.Error) -> str:
    message = exc.diag.message_primary or str(exc)
    return message.partition(" is disabled: ")[2] or message


def _as_project(project: Project | str | Path) -> Project:
    """The validated project: as given, or loaded from a path (``CompileError`` if invalid)."""
    if isinstance(project, Project):
        return project
    if isinstance(project, str | Path):
        return Project.load(project)
    raise errors.ProjectError(f"cannot use {type(project).__name__} as a flowlane project")
