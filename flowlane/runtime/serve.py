"""``flowlane serve``: one worker process per queue of the project, supervised.

Each ``kind: worker`` document gets a worker (``flowlane worker --name D``);
every other queue the project's flows route to gets ``flowlane worker --queue
Q`` (per-flow, per-step and explicit queues alike). A worker that exits is
restarted with exponential backoff (reset once it has run for a while), except
one that exits with :data:`EXIT_DISABLED` (3): its deployment is disabled or it
met work it cannot handle, and restarting it could only repeat that until an
operator runs ``flowlane worker enable NAME``. SIGTERM/SIGINT are forwarded to
every worker, which finish or hand back their in-flight tasks; workers still
running after the shutdown deadline are killed (their tasks are recovered by
stalled recovery). Worker output goes to ``.flowlane/logs/<name>.log``.
"""

from __future__ import annotations

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

from flowlane.compiler.model import Project

EXIT_DISABLED = 3  # the worker's exit status for a disabled deployment or unsupported work
STABLE_AFTER = 60.0  # seconds a worker must run for its backoff to start over
TICK = 0.2  # seconds between checks of the worker processes


@dataclass(frozen=True)
class WorkerSpec:
    """One supervised worker: a label for the status line and its ``flowlane worker`` args."""

    name: str
    queue: str
    args: tuple[str, ...]


def plan_workers(project: Project) -> list[WorkerSpec]:
    """One worker per ``kind: worker`` document, one per other queue the flows route to."""
    specs = [WorkerSpec(w.name, w.queue, ("--name", w.name)) for w in project.workers]
    covered = {w.queue for w in project.workers}
    queues = sorted({q for flow in project.flows for q in flow.queues} - covered)
    specs.extend(WorkerSpec(q, q, ("--queue", q)) for q in queues)
    return specs


@dataclass
class Supervised:
    spec: WorkerSpec
    command: list[str]
    process: subprocess.Popen[bytes] | None = None
    state: str = "starting"
    detail: str = ""
    started_at: float = 0.0
    restart_at: float = 0.0
    restarts: int = 0
    delay: float = 0.0
    log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def line(self, width: int) -> str:
        pid = f"pid {self.pid}" if self.state == "running" and self.pid else ""
        restarts = f"restarts {self.restarts}" if self.restarts else ""
        parts = [f"{self.spec.name:<{width}}", f"{self.state:<10}", pid, restarts, self.detail]
        return "  ".join(p for p in parts if p).rstrip()


class Supervisor:
    """Start, watch and restart worker processes; stop them on request."""

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
            if worker.log is None:
                worker.log = (self.log_dir / f"{worker.spec.name}.log").open("ab")
            output = worker.log
        worker.process = subprocess.Popen(
            worker.command, env=self.env, cwd=self.cwd, stdout=output, stderr=subprocess.STDOUT
        )
        worker.started_at = time.monotonic()
        worker.state, worker.detail = "running", ""

    def start(self) -> None:
        for worker in self.workers:
            self._spawn(worker)
        self.render()

    def tick(self) -> bool:
        """Reap exited workers and restart those that are due; True when a status changed."""
        changed = False
        now = time.monotonic()
        for worker in self.workers:
            if worker.state == "running" and worker.process is not None:
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
        if code == EXIT_DISABLED:
            worker.state = "disabled"
            worker.detail = (
                f"exit {code}: deployment disabled or unsupported work; not restarted "
                f"(see the log; then `flowlane worker enable {worker.spec.name}`)"
            )
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

    def alive(self) -> list[Supervised]:
        return [w for w in self.workers if w.state == "running"]

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
            if worker.log is not None:
                worker.log.close()
        self.render()

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


def serve(
    specs: Sequence[WorkerSpec],
    command: Callable[[WorkerSpec], list[str]],
    *,
    env: dict[str, str],
    cwd: Path,
    log_dir: Path,
    shutdown_timeout: float,
) -> int:
    """Run until SIGTERM/SIGINT; 0 after a clean stop, 1 when every worker is disabled."""
    supervisor = Supervisor(specs, command, env=env, cwd=cwd, log_dir=log_dir)

    def request_stop(signum: int, frame: object) -> None:
        supervisor.stopping.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        supervisor.start()
        while not supervisor.stopping.wait(TICK):
            supervisor.tick()
            if all(w.state == "disabled" for w in supervisor.workers):
                print("every worker is disabled: nothing left to serve", file=sys.stderr)
                return 1
        supervisor.tick()
        supervisor.stop(shutdown_timeout)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def worker_command(
    paths: Sequence[str], extra: Sequence[str]
) -> Callable[[WorkerSpec], list[str]]:
    """``python -m flowlane worker SELECTOR PATHS... EXTRA`` for a spec."""
    absolute = [os.path.abspath(p) for p in paths]

    def build(spec: WorkerSpec) -> list[str]:
        return [sys.executable, "-m", "flowlane", "worker", *spec.args, *absolute, *extra]

    return build
