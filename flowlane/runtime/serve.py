"""``flowlane serve``: one worker process per queue of the project, supervised, following
the database.

Each ``kind: worker`` document gets a worker (selected by its name); every other queue
the project's flows route to gets one (selected by the queue: per-flow, per-step and
explicit queues alike). Workers are started from their :class:`WorkerConfig`
(:mod:`flowlane.runtime.launch`). A worker that exits is restarted with exponential
backoff (reset once it has run for a while), except:

- ``WorkerExit.DISABLED`` (3): its deployment is disabled or it met work that no
  definition explains; restarting it could only repeat that until an operator runs
  ``flowlane worker enable NAME`` (which serve notices: it tries again at once);
- ``WorkerExit.RESTART`` (4): the database now routes to its queue pairs its registry
  does not serve (a new version, an alias move); it is restarted at once, from the
  project's current YAML.

serve runs the maintenance tick itself too (:class:`flowlane.runtime.ticker.Ticker`), as
its workers do: schedules fire while serve is up even before a worker has started.

serve LISTENs for the SQL Core's definition-change notifications: on each it loads the
project again and re-derives the worker set (starts workers for new queues, restarts a
worker whose selection changed, stops one whose queue is gone, retries at once the
workers waiting in backoff or disabled). serve never applies anything: reviewed SQL
stays the only writer of definitions. Each worker's last ``error:`` line is shown in
the status beside it. SIGTERM/SIGINT are forwarded to every worker, which finish or
hand back their in-flight tasks; workers still running after the shutdown deadline are
killed (their tasks are recovered by stalled recovery). Worker output goes to
``.flowlane/logs/<name>.log``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

from flowlane import errors
from flowlane.compiler import api
from flowlane.compiler.model import Project
from flowlane.runtime import launch
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.ticker import Ticker

STABLE_AFTER = 60.0  # seconds a worker must run for its backoff to start over
TICK = 0.2  # seconds between checks of the worker processes
RELOAD_SCAN = 1.0  # seconds between scans of the project's Python files (serve --reload)
ERROR_TAIL = 16 * 1024  # bytes at the end of a worker's log searched for its last error line


@dataclass(frozen=True)
class WorkerSpec:
    """One supervised worker: a label for the status line and the worker's settings."""

    name: str
    queue: str
    config: WorkerConfig = field(default_factory=WorkerConfig)


def plan_workers(project: Project, options: WorkerConfig | None = None) -> list[WorkerSpec]:
    """One worker per ``kind: worker`` document, one per other queue the flows route to;
    each with ``options`` (what serve hands to every worker) and its selector."""
    base = options or WorkerConfig()
    specs = [WorkerSpec(w.name, w.queue, dataclasses.replace(base, name=w.name))
             for w in project.workers]
    covered = {w.queue for w in project.workers}
    queues = sorted({q for flow in project.flows for q in flow.queues} - covered)
    specs.extend(WorkerSpec(q, q, dataclasses.replace(base, queue=q)) for q in queues)
    return specs


@dataclass
class Supervised:
    spec: WorkerSpec
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    state: str = "starting"
    detail: str = ""
    last_error: str = ""  # the last `error:` line of its log, shown while it is not running
    started_at: float = 0.0
    restart_at: float = 0.0
    restarts: int = 0
    delay: float = 0.0
    restart_now: bool = False  # stopped by serve to start again with a new selection
    retire: bool = False  # stopped by serve for good: its queue is no longer routed
    log: IO[bytes] | None = field(default=None, repr=False)
    log_path: Path | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def line(self, width: int) -> str:
        pid = f"pid {self.pid}" if self.state == "running" and self.pid else ""
        restarts = f"restarts {self.restarts}" if self.restarts else ""
        error = f"| {self.last_error}" if self.last_error and self.state != "running" else ""
        parts = [f"{self.spec.name:<{width}}", f"{self.state:<10}", pid, restarts, self.detail, error]
        return "  ".join(p for p in parts if p).rstrip()


def last_error_line(path: Path | None) -> str:
    """The last line starting with ``error:`` in the end of a worker's log."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as file:
        file.seek(max(0, path.stat().st_size - ERROR_TAIL))
        tail = file.read().decode("utf-8", "replace")
    found = [line for line in tail.splitlines() if line.startswith("error: ")]
    return found[-1] if found else ""


class Supervisor:
    """Start, watch and restart worker processes; follow a new plan; stop them on request."""

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        command: Callable[[WorkerSpec], list[str]],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log_dir: Path | None = None,
        base_delay: float = 1.0,
        max_delay: float = 60.0,
        out: TextIO = sys.stdout,
    ) -> None:
        self.command = command
        self.workers = [Supervised(spec, command(spec)) for spec in specs]
        self.env = env
        self.cwd = cwd
        self.log_dir = log_dir
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.out = out
        self.stopping = threading.Event()
        self._live = out.isatty()
        self._drawn = 0

    # -- processes -------------------------------------------------------------

    def _spawn(self, worker: Supervised) -> None:
        output: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            worker.log_path = self.log_dir / f"{worker.spec.name}.log"
            if worker.log is None:
                worker.log = worker.log_path.open("ab")
            output = worker.log
        worker.process = subprocess.Popen(
            worker.command, env=self.env, cwd=self.cwd, stdout=output, stderr=subprocess.STDOUT
        )
        worker.started_at = time.monotonic()
        worker.state, worker.detail, worker.restart_now = "running", "", False

    def start(self) -> None:
        for worker in self.workers:
            self._spawn(worker)
        self.render()

    def tick(self) -> bool:
        """Reap exited workers and restart those that are due; True when a status changed."""
        changed = False
        now = time.monotonic()
        for worker in list(self.workers):
            if worker.state in ("running", "restarting", "retiring") and worker.process is not None:
                code = worker.process.poll()
                if code is not None:
                    self._exited(worker, code, now)
                    changed = True
            elif worker.state == "backoff" and now >= worker.restart_at and not self.stopping.is_set():
                worker.restarts += 1
                self._spawn(worker)
                changed = True
        if changed:
            self.render()
        return changed

    def _exited(self, worker: Supervised, code: int, now: float) -> None:
        if worker.retire:
            self._close_log(worker)
            self.workers.remove(worker)
            return
        worker.last_error = last_error_line(worker.log_path) if code != 0 else ""
        if code == errors.WorkerExit.DISABLED and not worker.restart_now:
            worker.state = "disabled"
            worker.detail = (
                f"exit {code}: deployment disabled or unsupported work; not restarted "
                f"(see the log; then `flowlane worker enable {worker.spec.name}`)"
            )
            return
        if worker.restart_now or code == errors.WorkerExit.RESTART:
            worker.restarts += 1
            self._spawn(worker)  # at once: definitions changed, the project's YAML may serve them
            return
        ran = now - worker.started_at
        worker.delay = (
            self.base_delay
            if ran >= STABLE_AFTER or worker.delay == 0
            else min(worker.delay * 2, self.max_delay)
        )
        worker.restart_at = now + worker.delay
        worker.state = "backoff"
        how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        worker.detail = f"{how}; restarting in {worker.delay:g}s"

    def follow(self, specs: Sequence[WorkerSpec]) -> None:
        """Take a new plan: start new workers, restart changed ones gracefully, stop those
        whose queue is gone, and retry at once the ones waiting (backoff or disabled)."""
        if self.stopping.is_set():
            return
        planned = {spec.name: spec for spec in specs}
        for worker in self.workers:
            spec = planned.pop(worker.spec.name, None)
            if spec is None:
                worker.retire = True
                self._terminate(worker, "retiring")
            elif spec != worker.spec:
                worker.spec, worker.command = spec, self.command(spec)
                self._terminate(worker, "restarting")
            elif worker.state in ("backoff", "disabled"):
                worker.restarts += 1
                self._spawn(worker)
        for spec in planned.values():
            worker = Supervised(spec, self.command(spec))
            self.workers.append(worker)
            self._spawn(worker)
        self.render()

    def _terminate(self, worker: Supervised, state: str) -> None:
        """SIGTERM a running worker (it finishes its in-flight work); then restart or drop it."""
        if worker.state == "running" and worker.process is not None:
            worker.process.send_signal(signal.SIGTERM)
            worker.restart_now = not worker.retire
            worker.state, worker.detail = state, "definitions changed"
        elif worker.retire:
            self._close_log(worker)
            self.workers.remove(worker)
        else:
            worker.restarts += 1
            self._spawn(worker)

    def restart_all(self) -> None:
        """Restart every worker gracefully (its in-flight work finished first)."""
        for worker in self.workers:
            self._terminate(worker, "restarting")
        self.render()

    def alive(self) -> list[Supervised]:
        return [w for w in self.workers if w.state in ("running", "restarting", "retiring")]

    def stop(self, timeout: float) -> None:
        """Forward SIGTERM to every worker; kill those still running after ``timeout`` s."""
        self.stopping.set()
        for worker in self.alive():
            assert worker.process is not None
            worker.process.send_signal(signal.SIGTERM)
            worker.state, worker.detail = "stopping", ""
        self.render()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.state != "stopping" or worker.process is None:
                worker.state = "stopped" if worker.state == "backoff" else worker.state
                continue
            try:
                code = worker.process.wait(max(0.0, deadline - time.monotonic()))
                worker.detail = f"exit {code}"
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                worker.detail = f"killed after {timeout:g}s"
            worker.state = "stopped"
        for worker in self.workers:
            self._close_log(worker)
        self.render()

    @staticmethod
    def _close_log(worker: Supervised) -> None:
        if worker.log is not None:
            worker.log.close()
            worker.log = None

    # -- status ----------------------------------------------------------------

    def render(self) -> None:
        width = max((len(w.spec.name) for w in self.workers), default=5)
        lines = [w.line(width) for w in self.workers]
        if self._live and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # redraw the block in place
        elif not self._live:
            lines.append("")
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()
        self._drawn = len(self.workers)


class DefinitionWatcher(threading.Thread):
    """LISTEN for definition changes; set ``changed`` on each (and on every (re)connection,
    since anything may have changed while nobody listened)."""

    def __init__(self, dsn: str, changed: threading.Event, stopping: threading.Event) -> None:
        super().__init__(name="flowlane-serve-definitions", daemon=True)
        self.dsn, self.changed, self.stopping = dsn, changed, stopping

    def run(self) -> None:
        import psycopg

        from flowlane.core.queries import query

        delay = 0.5
        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True,
                                     application_name="flowlane-serve") as conn:
                    conn.execute(query("listen_definitions"))
                    self.changed.set()
                    delay = 0.5
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=1.0):
                            self.changed.set()
            except psycopg.Error as exc:
                print(f"serve: definition notifications lost ({exc}); retrying", file=sys.stderr)
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)


class SourceWatcher:
    """The modification times of the project's Python files (handler modules), for
    ``serve --reload``: a change restarts every worker gracefully, like a development server."""

    SKIPPED = frozenset({".venv", "venv", ".flowlane", "node_modules", "__pycache__", ".git"})

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen = self._scan()

    def _scan(self) -> dict[Path, int]:
        found: dict[Path, int] = {}
        for directory, subdirectories, files in os.walk(self.root):
            # never walk into environments, caches or the database (pruned in place)
            subdirectories[:] = [d for d in subdirectories
                                 if d not in self.SKIPPED and not d.startswith(".")]
            for name in files:
                if name.endswith(".py"):
                    path = Path(directory, name)
                    with contextlib.suppress(OSError):  # deleted while scanning
                        found[path] = path.stat().st_mtime_ns
        return found

    def changed(self) -> list[Path]:
        now = self._scan()
        different = sorted(p for p in now.keys() | self.seen.keys() if now.get(p) != self.seen.get(p))
        self.seen = now
        return different


@dataclass(frozen=True)
class Plan:
    """How serve derives its workers: the flow paths and what every worker gets."""

    paths: tuple[str, ...]
    options: WorkerConfig

    def specs(self) -> list[WorkerSpec]:
        return plan_workers(api.load_project(list(self.paths)), self.options)

    def command(self, spec: WorkerSpec) -> list[str]:
        return launch.worker_command(self.paths, spec.config)


def serve(
    plan: Plan,
    *,
    dsn: str,
    env: dict[str, str],
    cwd: Path,
    log_dir: Path,
    shutdown_timeout: float,
    reload: bool = False,
    watch: Callable[[Supervisor], None] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT; 0 after a clean stop. ``reload``: restart every worker
    when a Python file of the project (under ``cwd``) changes; ``watch`` is given the
    supervisor before the workers start (readiness probes read it)."""
    supervisor = Supervisor(plan.specs(), plan.command, env=env, cwd=cwd, log_dir=log_dir)
    if watch is not None:
        watch(supervisor)
    changed = threading.Event()
    sources = SourceWatcher(cwd) if reload else None
    next_scan = time.monotonic() + RELOAD_SCAN

    def request_stop(signum: int, frame: object) -> None:
        supervisor.stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        supervisor.start()
        DefinitionWatcher(dsn, changed, supervisor.stopping).start()
        Ticker(dsn, supervisor.stopping, who="serve").start()
        while not supervisor.stopping.wait(TICK):
            supervisor.tick()
            if changed.is_set():
                changed.clear()
                _follow(supervisor, plan)
            if sources is not None and time.monotonic() >= next_scan:
                next_scan = time.monotonic() + RELOAD_SCAN
                edited = sources.changed()
                if edited:
                    print(f"serve: {project_relative(edited[0], cwd)} changed; restarting the "
                          "workers", file=sys.stderr, flush=True)
                    supervisor.restart_all()
        supervisor.tick()
        supervisor.stop(shutdown_timeout)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _follow(supervisor: Supervisor, plan: Plan) -> None:
    try:
        specs = plan.specs()
    except errors.FlowlaneError as exc:  # a project being edited: keep the workers as they are
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"serve: definitions changed, but the project does not load ({first}); "
              "keeping the workers as they are", file=sys.stderr, flush=True)
        return
    supervisor.follow(specs)


def project_relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
