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
- ``WorkerExit.USAGE`` (2): bad arguments; a restart would repeat them;
- ``WorkerExit.RESTART`` (4): it stopped for new definitions (a rollout deprecated it, or
  the database now routes to its queue pairs its registry does not serve); it is
  restarted at once, from the project's current YAML.

serve runs the maintenance tick itself too (:class:`flowlane.runtime.ticker.Ticker`), as
its workers do: schedules fire while serve is up even before a worker has started.

serve LISTENs for the SQL Core's definition-change notifications: on each it loads the
project again and re-derives the worker set (starts workers for new queues, restarts a
worker whose selection changed, stops one whose queue is gone, retries at once the
workers waiting in backoff or disabled). serve never applies anything: reviewed SQL
stays the only writer of definitions. Before a change stops any running worker, the
:class:`Reloader` checks that the new code can start (:mod:`flowlane.runtime.preflight`);
until it can, the running workers keep serving what the database holds, and serve says
why. ``--reload`` watches the project's Python files and its flow files. The status block
is printed when it changed; while a worker is not running, its last error is shown whole
under it, with its log. SIGTERM/SIGINT are forwarded to every worker, which finish or
hand back their in-flight tasks; workers still running after the shutdown deadline are
killed (their tasks are recovered by stalled recovery). Worker output goes to
``.flowlane/logs/<name>.log``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
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
from flowlane.runtime import launch, preflight
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.ticker import Ticker

STABLE_AFTER = 60.0  # seconds a worker must run for its backoff to start over
TICK = 0.2  # seconds between checks of the worker processes
RELOAD_SCAN = 1.0  # seconds between scans of the project's Python files (serve --reload)
DEFINITIONS_POLL = 2.0  # seconds between reads of the definitions' fingerprint, through a pooler
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


class SupervisedState(enum.StrEnum):
    """Where a worker process ``serve`` supervises is (shown in its status line)."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # stopped by serve to start again (new definitions or files)
    RETIRING = "retiring"  # stopped by serve for good: its queue is no longer routed
    BACKOFF = "backoff"  # exited: started again after its delay
    DISABLED = "disabled"  # its deployment is disabled: not started until enabled
    REFUSED = "refused"  # bad arguments: a restart would repeat them
    STOPPING = "stopping"
    STOPPED = "stopped"


# the states of a worker whose process runs, and of one waiting to be started again
LIVE = frozenset({SupervisedState.RUNNING, SupervisedState.RESTARTING, SupervisedState.RETIRING})
WAITING_TO_START = frozenset({SupervisedState.BACKOFF, SupervisedState.DISABLED})


@dataclass
class Supervised:
    spec: WorkerSpec
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    state: SupervisedState = SupervisedState.STARTING
    detail: str = ""
    last_error: str = ""  # its log's last error, whole; shown while it is not running
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

    def lines(self, width: int, root: Path | None = None) -> list[str]:
        """Its status line; while it is not running, its last error, whole, and its log."""
        pid = f"pid {self.pid}" if self.state == SupervisedState.RUNNING and self.pid else ""
        restarts = f"restarts {self.restarts}" if self.restarts else ""
        parts = [f"{self.spec.name:<{width}}", f"{self.state:<10}", pid, restarts, self.detail]
        lines = ["  ".join(p for p in parts if p).rstrip()]
        if self.last_error and self.state != SupervisedState.RUNNING:
            log = project_relative(self.log_path, root) if self.log_path and root else self.log_path
            lines.extend(f"    {line}" for line in self.last_error.splitlines())
            lines.extend([f"    log: {log}"] if log else [])
        return lines


def last_error(path: Path | None) -> str:
    """The last error in the end of a worker's log, whole: its ``error:`` line, the indented
    lines that continue it and its ``hint:`` line."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as file:
        file.seek(max(0, path.stat().st_size - ERROR_TAIL))
        tail = file.read().decode("utf-8", "replace").splitlines()
    starts = [i for i, line in enumerate(tail) if line.startswith("error: ")]
    if not starts:
        return ""
    found = [tail[starts[-1]]]
    for line in tail[starts[-1] + 1:]:
        if not (line[:1].isspace() or line.startswith("hint: ")):
            break
        found.append(line)
    return "\n".join(found)


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
        self._shown: list[str] = []

    # -- processes -------------------------------------------------------------

    def _spawn(self, worker: Supervised) -> None:
        output: Any = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            worker.log_path = self.log_dir / f"{worker.spec.name}.log"
            if worker.log is None:
                worker.log = worker.log_path.open("ab")
            output = worker.log
        env = {**(self.env if self.env is not None else os.environ), **launch.supervisor_environment()}
        worker.process = subprocess.Popen(
            worker.command, env=env, cwd=self.cwd, stdout=output, stderr=subprocess.STDOUT
        )
        worker.started_at = time.monotonic()
        worker.state, worker.detail, worker.restart_now = SupervisedState.RUNNING, "", False

    def start(self) -> None:
        for worker in self.workers:
            self._spawn(worker)
        self.render()

    def tick(self) -> bool:
        """Reap exited workers and restart those that are due; True when a status changed."""
        changed = False
        now = time.monotonic()
        for worker in list(self.workers):
            if worker.state in LIVE and worker.process is not None:
                code = worker.process.poll()
                if code is not None:
                    self._exited(worker, code, now)
                    changed = True
            elif (worker.state == SupervisedState.BACKOFF and now >= worker.restart_at
                  and not self.stopping.is_set()):
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
        worker.last_error = last_error(worker.log_path) if code != 0 else ""
        if code == errors.WorkerExit.DISABLED and not worker.restart_now:
            worker.state = SupervisedState.DISABLED
            worker.detail = (
                f"exit {code}: deployment disabled or unsupported work; not restarted "
                f"(see the log; then `flowlane worker enable {worker.spec.name}`)"
            )
            return
        if code in errors.NOT_RESTARTED and not worker.restart_now:
            worker.state = SupervisedState.REFUSED  # bad arguments: a restart repeats them
            worker.detail = f"exit {code}: bad arguments; not restarted (see the log)"
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
        worker.state = SupervisedState.BACKOFF
        how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        worker.detail = f"{how}; restarting in {worker.delay:g}s"

    def follow(self, specs: Sequence[WorkerSpec], *, reason: str = "definitions changed",
               restart: bool = False) -> None:
        """Take a new plan: start new workers, restart changed ones gracefully (every
        running one with ``restart``), stop those whose queue is gone, and retry at once the
        ones waiting (backoff or disabled)."""
        if self.stopping.is_set():
            return
        planned = {spec.name: spec for spec in specs}
        for worker in self.workers:
            spec = planned.pop(worker.spec.name, None)
            if spec is None:
                worker.retire = True
                self._terminate(worker, SupervisedState.RETIRING, reason)
            elif spec != worker.spec or (restart and worker.state == SupervisedState.RUNNING):
                why = reason if spec == worker.spec else "routing changed"
                worker.spec, worker.command = spec, self.command(spec)
                self._terminate(worker, SupervisedState.RESTARTING, why)
            elif worker.state in WAITING_TO_START:
                worker.restarts += 1
                self._spawn(worker)
        for spec in planned.values():
            worker = Supervised(spec, self.command(spec))
            self.workers.append(worker)
            self._spawn(worker)
        self.render()

    def retry_waiting(self) -> None:
        """Start again at once the workers waiting in backoff or disabled."""
        if self.stopping.is_set():
            return
        waiting = [w for w in self.workers if w.state in WAITING_TO_START]
        for worker in waiting:
            worker.restarts += 1
            self._spawn(worker)
        if waiting:
            self.render()

    def _terminate(self, worker: Supervised, state: SupervisedState, reason: str) -> None:
        """SIGTERM a running worker (it finishes its in-flight work); then restart or drop it."""
        if worker.state == SupervisedState.RUNNING and worker.process is not None:
            worker.process.send_signal(signal.SIGTERM)
            worker.restart_now = not worker.retire
            worker.state, worker.detail = state, reason
        elif worker.retire:
            self._close_log(worker)
            self.workers.remove(worker)
        else:
            worker.restarts += 1
            self._spawn(worker)

    def alive(self) -> list[Supervised]:
        return [w for w in self.workers if w.state in LIVE]

    def stop(self, timeout: float) -> None:
        """Forward SIGTERM to every worker; kill those still running after ``timeout`` s."""
        self.stopping.set()
        for worker in self.alive():
            assert worker.process is not None
            worker.process.send_signal(signal.SIGTERM)
            worker.state, worker.detail = SupervisedState.STOPPING, ""
        self.render()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.state != SupervisedState.STOPPING or worker.process is None:
                if worker.state == SupervisedState.BACKOFF:
                    worker.state, worker.detail = SupervisedState.STOPPED, ""
                continue
            try:
                code = worker.process.wait(max(0.0, deadline - time.monotonic()))
                worker.detail = f"exit {code}"
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
                worker.detail = f"killed after {timeout:g}s"
            worker.state = SupervisedState.STOPPED
        for worker in self.workers:
            self._close_log(worker)
            if worker.state == SupervisedState.STOPPED:
                worker.last_error = ""  # stopped by serve: an earlier error is no longer current
        self.render()

    @staticmethod
    def _close_log(worker: Supervised) -> None:
        if worker.log is not None:
            worker.log.close()
            worker.log = None

    # -- status ----------------------------------------------------------------

    def render(self) -> None:
        """Print the status block (redrawn in place on a terminal); not again when unchanged."""
        width = max((len(w.spec.name) for w in self.workers), default=5)
        lines = [line for w in self.workers for line in w.lines(width, self.cwd)]
        if lines == self._shown:
            return
        self._shown = lines
        if self._live and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # redraw the block in place
        self.out.write("\n".join(lines) + ("\n" if self._live else "\n\n"))
        self.out.flush()
        self._drawn = len(lines)


class DefinitionWatcher(threading.Thread):
    """LISTEN for definition changes; set ``changed`` on each (and on every (re)connection,
    since anything may have changed while nobody listened). Through a transaction-mode
    pooler, where a LISTEN cannot work, poll the definitions' fingerprint instead."""

    def __init__(self, dsn: str, changed: threading.Event, stopping: threading.Event) -> None:
        super().__init__(name="flowlane-serve-definitions", daemon=True)
        self.dsn, self.changed, self.stopping = dsn, changed, stopping

    def run(self) -> None:
        import psycopg

        from flowlane.core import db

        target = db.as_target(self.dsn)
        follow = self._poll if target.pooled else self._listen
        delay = 0.5
        while not self.stopping.is_set():
            try:
                with psycopg.connect(target.conninfo, autocommit=True, **target.connection_kwargs(),
                                     application_name="flowlane-serve") as conn:
                    delay = 0.5
                    follow(conn)
            except psycopg.Error as exc:
                print(f"serve: definition notifications lost ({exc}); retrying", file=sys.stderr)
                self.stopping.wait(delay)
                delay = min(delay * 2, 30.0)

    def _listen(self, conn: Any) -> None:
        from flowlane.core.queries import query

        conn.execute(query("listen_definitions"))
        self.changed.set()
        while not self.stopping.is_set():
            for _ in conn.notifies(timeout=1.0):
                self.changed.set()

    def _poll(self, conn: Any) -> None:
        from flowlane.core.queries import query

        seen = None
        while not self.stopping.is_set():
            fingerprint = conn.execute(query("definitions_fingerprint")).fetchone()[0]
            if fingerprint != seen:
                self.changed.set()
                seen = fingerprint
            self.stopping.wait(DEFINITIONS_POLL)


class SourceWatcher:
    """The modification times of the project's Python files (handler modules) and of its
    flow files (the YAML under the flow paths), for ``serve --reload``."""

    SKIPPED = frozenset({".venv", "venv", ".flowlane", "node_modules", "__pycache__", ".git"})
    FLOW_SUFFIXES = (".yaml", ".yml")

    def __init__(self, root: Path, flow_paths: Sequence[str] = ()) -> None:
        self.root = root
        self.flow_paths = [Path(os.path.abspath(p)) for p in flow_paths]  # as the workers read them
        self.seen = self._scan()

    def _scan(self) -> dict[Path, int]:
        found: dict[Path, int] = {}
        for top in (self.root, *self.flow_paths):
            for path in self._files(top):
                with contextlib.suppress(OSError):  # deleted while scanning
                    found[path] = path.stat().st_mtime_ns
        return found

    def _files(self, top: Path) -> list[Path]:
        suffixes = (".py",) if top == self.root else self.FLOW_SUFFIXES
        if top.is_file():
            return [top] if top.name.endswith(suffixes) else []
        found: list[Path] = []
        for directory, subdirectories, files in os.walk(top):
            # never walk into environments, caches or the database (pruned in place)
            subdirectories[:] = [d for d in subdirectories
                                 if d not in self.SKIPPED and not d.startswith(".")]
            found.extend(Path(directory, name) for name in files if name.endswith(suffixes))
        return found

    def changed(self) -> list[Path]:
        now = self._scan()
        different = sorted(p for p in now.keys() | self.seen.keys() if now.get(p) != self.seen.get(p))
        self.seen = now
        return different


def change_reasons(paths: Sequence[Path], root: Path) -> list[str]:
    """What changed, by kind: ``handler files changed: a.py``, ``flow files changed: ...``."""
    handlers = [project_relative(p, root) for p in paths if p.suffix == ".py"]
    flows = [project_relative(p, root) for p in paths if p.suffix != ".py"]
    return ([f"handler files changed: {', '.join(handlers)}"] if handlers else []) + (
        [f"flow files changed: {', '.join(flows)}"] if flows else [])


@dataclass(frozen=True)
class Plan:
    """How serve derives its workers: the flow paths and what every worker gets."""

    paths: tuple[str, ...]
    options: WorkerConfig

    def specs(self) -> list[WorkerSpec]:
        return plan_workers(api.load_project(list(self.paths)), self.options)

    def command(self, spec: WorkerSpec) -> list[str]:
        return launch.worker_command(self.paths, spec.config)

    def check_command(self) -> list[str]:
        return preflight.command(self.paths, self.options)


CHECK_TIMEOUT = 120.0  # seconds serve waits for the check of new code (handler imports included)


class Reloader:
    """serve's one answer to a change (files edited, definitions changed): before it stops
    any running worker, it checks that the new code can start (:mod:`flowlane.runtime.preflight`,
    in a child process). Until it can, the running workers keep serving what the database
    holds with the code they loaded, and serve says why once per distinct reason."""

    def __init__(self, supervisor: Supervisor, plan: Plan, *, env: dict[str, str], cwd: Path,
                 log_dir: Path, err: TextIO = sys.stderr) -> None:
        self.supervisor, self.plan = supervisor, plan
        self.env, self.cwd, self.err = env, cwd, err
        self.log_path = log_dir / "serve-check.log"
        self.pending: list[str] = []  # file changes waiting for code that can start
        self.reported: preflight.Verdict | None = None

    def settle(self, edited: Sequence[Path], *, definitions: bool) -> None:
        """Files were ``edited`` and/or the ``definitions`` changed: once the new code can
        start, follow the project (every running worker restarted after a file change)."""
        self.pending = sorted({*self.pending, *change_reasons(edited, self.cwd)})
        try:  # before the check: never follow a plan newer than the code checked
            specs: list[WorkerSpec] | None = self.plan.specs()
        except errors.FlowlaneError:
            specs = None  # the check says why
        verdict = self.check(self.pending + (["definitions changed"] if definitions else []))
        if verdict.status != preflight.READY:
            self._report(verdict)
            self.supervisor.retry_waiting()  # not working anyway: nothing to keep
            return
        applied = definitions and not edited and self.reported is not None \
            and self.reported.status == preflight.UNAPPLIED
        self.reported = None
        if specs is None:
            return  # fixed while it was checked: the next scan sees that change
        restart = bool(self.pending)  # a definition change alone restarts what it reroutes
        reasons = self.pending + (["definitions applied"] if applied else []) or ["definitions changed"]
        self.pending = []
        if restart:
            self._say(f"{'; '.join(reasons)}; restarting the workers")
        self.supervisor.follow(specs, reason="; ".join(reasons), restart=restart)

    def check(self, why: Sequence[str]) -> preflight.Verdict:
        """Run the check in a child process; ``why`` and its error output go to ``log_path``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        header = f"serve checked the new code after: {'; '.join(why)}\n"
        try:
            done = subprocess.run(self.plan.check_command(), check=False, env=self.env, cwd=self.cwd,
                                  capture_output=True, text=True, timeout=CHECK_TIMEOUT)
        except subprocess.TimeoutExpired:
            message = f"the check did not finish within {CHECK_TIMEOUT:g}s (a handler module " \
                "that blocks on import?)"
            self.log_path.write_text(f"{header}{message}\n")
            return preflight.Verdict(preflight.BROKEN, message=message)
        self.log_path.write_text(header + done.stderr)
        try:
            found = json.loads(done.stdout.strip().splitlines()[-1])
            return preflight.Verdict(found["status"], tuple(found["flows"]), found["message"])
        except (IndexError, ValueError, KeyError, TypeError):
            return preflight.Verdict(preflight.BROKEN, message=done.stderr.strip()
                                     or f"the check exited {done.returncode} without a verdict")

    def _report(self, verdict: preflight.Verdict) -> None:
        if verdict == self.reported:
            return
        self.reported = verdict
        log = project_relative(self.log_path, self.cwd)
        if verdict.status == preflight.UNAPPLIED:
            self._say(f"not applied: run `flowlane plan`, then `flowlane apply` (flows "
                      f"{', '.join(verdict.flows)} differ from the database); the running workers "
                      f"keep serving what the database holds:\n{_indented(verdict.message)}")
        else:
            self._say(f"the new code cannot start a worker; the running workers keep the last "
                      f"good code until a change fixes it (log: {log}):\n{_indented(verdict.message)}")

    def _say(self, text: str) -> None:
        print(f"serve: {text}", file=self.err, flush=True)


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


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
    when a Python file of the project (under ``cwd``) or a flow file changes, once the new
    code can start; ``watch`` is given the supervisor before the workers start (readiness
    probes read it)."""
    supervisor = Supervisor(plan.specs(), plan.command, env=env, cwd=cwd, log_dir=log_dir)
    if watch is not None:
        watch(supervisor)
    changed = threading.Event()
    reloader = Reloader(supervisor, plan, env=env, cwd=cwd, log_dir=log_dir)
    sources = SourceWatcher(cwd, plan.paths) if reload else None
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
            definitions, edited = changed.is_set(), []
            changed.clear()
            if sources is not None and (definitions or time.monotonic() >= next_scan):
                edited = sources.changed()  # with a definition change too: name what changed
                next_scan = time.monotonic() + RELOAD_SCAN
            if definitions or edited:
                reloader.settle(edited, definitions=definitions)
        supervisor.tick()
        supervisor.stop(shutdown_timeout)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def project_relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
