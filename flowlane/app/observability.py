"""Metrics, liveness and readiness over HTTP, for Prometheus, Kubernetes probes and
supervisors.

One port serves ``/metrics`` (the Prometheus text format), ``/healthz`` (200 while the process
works; 503 names what broke) and ``/readyz`` (200 when it should get work; 503 with one
reason a line). The database's view is read at scrape time by one statement
(``flowlane.queue_metrics``): per queue its depth, oldest message age, live workers and
disabled deployments, plus how long that statement took. ``flowlane serve`` and ``flowlane
ui`` also observe each run's duration as it ends (:class:`RunDurations`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from flowlane.core import db
from flowlane.core.queries import query
from flowlane.defaults import STALE_AFTER

if TYPE_CHECKING:  # the console imports this module and never runs a worker
    from flowlane.runtime.launch import Beside
    from flowlane.runtime.serve import Supervisor
    from flowlane.runtime.worker import Worker

Check = Callable[[], list[str]]  # what is wrong; [] when all is well
TIMEOUT = 5  # seconds a scrape or a probe waits for the database, to connect or to answer


class Database:
    """One connection shared by scrapes and probes (one statement at a time), opened again
    after an error."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.target = db.as_target(dsn)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def rows(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                if not self.target.pooled:
                    return self._conn.execute(query(name), params).fetchall()
                with self._conn.transaction():  # the timeout lasts for this transaction only
                    self._conn.execute(query("observability_statement_timeout"),
                                       {"milliseconds": str(TIMEOUT * 1000)})
                    return self._conn.execute(query(name), params).fetchall()
            except psycopg.Error:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                raise

    def _connect(self) -> psycopg.Connection[Any]:
        # a transaction-mode pooler refuses startup options: the timeout is set per transaction
        timeout: dict[str, Any] = {"options": f"-c statement_timeout={TIMEOUT * 1000}"}
        if self.target.pooled:
            timeout = {}
        return psycopg.connect(self.target.conninfo, autocommit=True, connect_timeout=TIMEOUT,
                               application_name="flowlane-metrics",
                               **self.target.connection_kwargs(), **timeout)

    def unreachable(self) -> list[str]:
        try:
            self.rows("observability_ping")
        except psycopg.Error as exc:
            return _unreachable(exc)
        return []

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()


def _unreachable(exc: psycopg.Error) -> list[str]:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return [f"database unreachable: {db.redact(first)}"]


class DatabaseCollector(Collector):
    """The database's gauges, read when Prometheus scrapes."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("flowlane_database_up", "1 when the metrics query reached the database")
        began = time.perf_counter()
        try:
            rows = self.database.rows("observability_queue_metrics")
        except psycopg.Error:
            up.add_metric([], 0)
            yield up
            return
        took = time.perf_counter() - began
        up.add_metric([], 1)
        yield up
        families = [
            GaugeMetricFamily("flowlane_queue_depth", "Messages on the queue, visible or not",
                              labels=["queue"]),
            GaugeMetricFamily("flowlane_queue_oldest_message_age_seconds",
                              "Age of the queue's oldest message (0 when empty)", labels=["queue"]),
            GaugeMetricFamily("flowlane_live_workers",
                              f"Registered workers with a heartbeat in the last {STALE_AFTER:g} s",
                              labels=["queue"]),
            GaugeMetricFamily("flowlane_disabled_deployments",
                              "Worker deployments disabled (by an operator or unsupported work)",
                              labels=["queue"]),
        ]
        for queue, *values in rows:
            for family, value in zip(families, values, strict=True):
                family.add_metric([queue], float(value))
        yield from families
        seconds = GaugeMetricFamily("flowlane_metrics_query_seconds",
                                    "How long the database part of this scrape took")
        seconds.add_metric([], took)
        yield seconds


RUN_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, float("inf"))
NOTIFY_BATCH = 1.0  # seconds of run-end notifications read before their durations are looked up
NOT_THROUGH_A_POOLER = (
    "metrics: run durations are not observed through a transaction-mode pooler (pooler=transaction), "
    "where LISTEN cannot work; flowlane_run_durations_listening stays 0 (a direct connection observes them)")


class RunDurations(Collector):
    """How long runs took, by flow and outcome, observed as they end: a listener on the
    engine's `flowlane_run_finished` notifications looks each ended run up by its key. Like the
    queue gauges it is database-wide: every exporter observes every run that ends while it
    listens (``flowlane_run_durations_listening`` says whether it does). Through a
    transaction-mode pooler it does not listen: a LISTEN (and the listeners' session lock
    it takes) would stay behind in whichever server session ran it."""

    def __init__(self, dsn: str) -> None:
        self.target = db.as_target(dsn)
        self.histogram = Histogram("flowlane_run_duration_seconds",
                                   "From a run's start to its end, by flow and outcome",
                                   ["flow", "status"], buckets=RUN_BUCKETS, registry=None)
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flowlane-run-durations",
                                        daemon=True)
        if self.target.pooled:
            print(NOT_THROUGH_A_POOLER, file=sys.stderr, flush=True)
        else:
            self._thread.start()

    def collect(self) -> Iterator[Metric]:
        listening = GaugeMetricFamily("flowlane_run_durations_listening",
                                      "1 while run durations are observed as runs end")
        listening.add_metric([], 1 if self.listening.is_set() else 0)
        yield listening
        yield from self.histogram.collect()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=NOTIFY_BATCH + TIMEOUT)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except psycopg.errors.InsufficientPrivilege:
                return  # a role that may not read runs (a worker's): the histogram stays empty
            except psycopg.Error:
                self._stop.wait(NOTIFY_BATCH)  # the database went away: listen again
            finally:
                self.listening.clear()

    def _listen(self) -> None:
        with psycopg.connect(self.target.conninfo, autocommit=True, connect_timeout=TIMEOUT,
                             application_name="flowlane-metrics") as conn:
            conn.execute(query("observability_listen_runs"))
            self.listening.set()
            while not self._stop.is_set():
                run_ids = [n.payload for n in conn.notifies(timeout=NOTIFY_BATCH)]
                if run_ids:
                    rows = conn.execute(query("observability_run_durations"),
                                        {"run_ids": run_ids}).fetchall()
                    for flow, status, seconds in rows:
                        self.histogram.labels(flow, status).observe(seconds)


class ScheduleGauges(Collector):
    """Per schedule, read at scrape time: paused or not, its latest fired slot and its next
    one (alert on ``time() - flowlane_schedule_next_slot_timestamp_seconds`` growing).
    ``serve`` and ``flowlane ui`` only: a least-privilege worker role may not read schedules."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def collect(self) -> Iterator[Metric]:
        try:
            rows = self.database.rows("observability_schedules")
        except psycopg.Error:
            return  # flowlane_database_up already says whether the database answers
        paused = GaugeMetricFamily("flowlane_schedule_paused",
                                   "1 while an operator has paused the schedule", labels=["schedule"])
        last = GaugeMetricFamily("flowlane_schedule_last_slot_timestamp_seconds",
                                 "The latest slot the schedule fired (absent before the first)",
                                 labels=["schedule"])
        upcoming = GaugeMetricFamily("flowlane_schedule_next_slot_timestamp_seconds",
                                     "The slot the schedule fires next", labels=["schedule"])
        for name, is_paused, last_slot, next_slot in rows:
            paused.add_metric([name], 1 if is_paused else 0)
            if last_slot is not None:
                last.add_metric([name], last_slot)
            upcoming.add_metric([name], next_slot)
        yield from (paused, last, upcoming)


def registry_for(database: Database, *collectors: Collector) -> CollectorRegistry:
    """A registry with the database's gauges and the given collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(database))
    for collector in collectors:
        registry.register(collector)
    return registry


def deployment_disabled(database: Database, deployment: str) -> list[str]:
    """The deployment's flag, as a readiness reason (the database asked; [] when enabled)."""
    try:
        rows = database.rows("worker_deployment", deployment=deployment)
    except psycopg.Error as exc:
        return _unreachable(exc)
    if rows and not rows[0][0]:
        reason = f": {rows[0][1]}" if rows[0][1] else ""
        return [f"deployment {deployment} is disabled{reason} (`flowlane worker enable {deployment}`)"]
    return []


def queues_not_served(database: Database, queues: list[str]) -> list[str]:
    """``serve``'s readiness: every queue it runs has a live registered worker (one that passed
    its startup checks, coverage included) and no disabled deployment."""
    try:
        rows = {r[0]: r for r in database.rows("observability_queue_metrics")}
    except psycopg.Error as exc:
        return _unreachable(exc)
    problems = []
    for queue in queues:
        row = rows.get(queue)
        if row is None or not row[3]:
            problems.append(f"queue {queue}: no live registered worker")
        if row is not None and row[4]:
            problems.append(f"queue {queue}: a deployment is disabled (`flowlane worker list`)")
    return problems


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/readyz"):
            problems = (self.server.alive if path == "/healthz" else self.server.ready)()
            text = "\n".join(problems) if problems else ("ok" if path == "/healthz" else "ready")
            self._send(503 if problems else 200, f"{text}\n".encode(), "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found: /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would drown the worker's log: say nothing."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 alive: Check, ready: Check) -> None:
        super().__init__(address, _Handler)
        self.registry, self.alive, self.ready = registry, alive, ready


def serve_http(port: int, registry: CollectorRegistry, *, alive: Check, ready: Check,
               host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve the three paths from a daemon thread; ``shutdown()`` the result to stop."""
    server = _Server((host, port), registry, alive, ready)
    threading.Thread(target=server.serve_forever, name="flowlane-metrics", daemon=True).start()
    return server


def beside_worker(port: int, dsn: str | None) -> Beside:
    """For ``flowlane worker --metrics-port``: the worker's own metrics and the database's;
    ready = registered, coverage complete, database reachable, deployment enabled."""

    @contextlib.contextmanager
    def beside(worker: Worker) -> Iterator[object]:
        database = Database(db.resolve(dsn).dsn)

        def ready() -> list[str]:
            return worker.not_ready() or deployment_disabled(database, worker.name)

        server = serve_http(port, registry_for(database, REGISTRY), alive=worker.alive, ready=ready)
        try:
            yield server
        finally:
            server.shutdown()
            database.close()

    return beside


class ServeProbe:
    """For ``flowlane serve --metrics-port``: its workers' metrics added up from
    ``multiproc_dir`` (prometheus_client's multiprocess mode) and the database's;
    ready = every queue it runs has a live registered worker and no disabled deployment."""

    def __init__(self, port: int, dsn: str, multiproc_dir: str) -> None:
        self.database = Database(dsn)
        self.supervisor: Supervisor | None = None
        self.run_durations = RunDurations(dsn)
        registry = registry_for(self.database, self.run_durations, ScheduleGauges(self.database))
        MultiProcessCollector(registry, path=multiproc_dir)  # type: ignore[no-untyped-call]
        self.server = serve_http(port, registry, alive=list, ready=self.ready)

    def watch(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def ready(self) -> list[str]:
        if self.supervisor is None:
            return ["serve is starting"]
        queues = sorted({w.spec.queue for w in self.supervisor.workers if not w.retire})
        return queues_not_served(self.database, queues)

    def close(self) -> None:
        self.server.shutdown()
        self.run_durations.close()
        self.database.close()


class ConsoleProbe:
    """For ``flowlane ui``: its /metrics (the database's gauges) and probes; ready = the
    database answers."""

    def __init__(self, dsn: str) -> None:
        self.database = Database(dsn)
        self.run_durations = RunDurations(dsn)
        self.registry = registry_for(self.database, self.run_durations,
                                     ScheduleGauges(self.database))

    def metrics(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def ready(self) -> list[str]:
        return self.database.unreachable()

    def close(self) -> None:
        self.run_durations.close()
        self.database.close()
