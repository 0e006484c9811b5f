"""Helpers for the runtime tests: worker processes, waiting on conditions, applying flows.

Nothing here sleeps to paper over a race: every wait polls a condition
(a file, a log line, a database row) against a deadline.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from tests.cli_support import REPO, cli_env, run_flowlane

PROJECT = Path(__file__).resolve().parent / "project"
T = TypeVar("T")


def wait_until(
    check: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)  # polling interval of a wait loop with a deadline


def env() -> dict[str, str]:
    return cli_env(PYTHONUNBUFFERED="1")


def flowlane(
    *args: str, cwd: Path = PROJECT, timeout: float = 120, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_flowlane(*args, cwd=cwd, env={"PYTHONUNBUFFERED": "1", **(extra_env or {})},
                        timeout=timeout)


class WorkerProcess:
    """``python -m flowlane worker ...`` in the test project, logs in a file."""

    def __init__(self, dsn: str, logdir: Path, *args: str, cwd: Path = PROJECT,
                 root: Path = REPO) -> None:
        self.log = logdir / f"worker-{uuid.uuid4().hex[:8]}.log"
        self.args = args
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowlane",
                "worker",
                "--log-level",
                "DEBUG",  # a test may override it: the last occurrence wins
                *args,
                "--dsn",
                dsn,
            ],
            cwd=cwd,
            env=cli_env(root, PYTHONUNBUFFERED="1"),  # root: the flowlane checkout to run
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        return self.log.read_text()

    def wait_logged(self, event: str, message: str) -> None:
        """Wait until the worker's log holds ``event``: a line the worker writes once a
        database call returns can come after that call's commit is visible to the test."""
        wait_until(lambda: event in self.text(), message=message)

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.text()}")
            return "worker_started" in self.text()

        wait_until(ready, timeout=timeout, message=f"worker {self.args} to start")
        return self

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.wait(10)


def run_state(dsn: str, run_id: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select flowlane.get_run_with_states(%s::uuid)", (run_id,)).fetchone()
    assert row is not None and row[0] is not None, f"no run {run_id}"
    state: dict[str, Any] = row[0]
    return state


def wait_run(
    dsn: str,
    run_id: str,
    timeout: float = 60.0,
    workers: list[WorkerProcess] | None = None,
) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        for w in workers or []:
            if w.proc.poll() is not None:
                raise AssertionError(f"worker died ({w.proc.returncode}):\n{w.text()}")
        state = run_state(dsn, run_id)
        return state if state["run"]["status"] in ("completed", "failed") else None

    try:
        return wait_until(done, timeout=timeout, interval=0.05, message=f"run {run_id} to finish")
    except AssertionError:
        logs = "\n\n".join(w.text() for w in workers or [])
        raise AssertionError(
            f"run {run_id} did not finish: {json.dumps(run_state(dsn, run_id), default=str)}"
            f"\n{logs}"
        ) from None


def start_run(dsn: str, flow: str, payload: Any) -> str:
    from flowlane.runtime.client import Client

    with Client(dsn) as client:
        return client.start(flow, payload).run_id


def step(state: dict[str, Any], slug: str) -> dict[str, Any]:
    return next(s for s in state["steps"] if s["step_slug"] == slug)


def tasks(state: dict[str, Any], slug: str) -> list[dict[str, Any]]:
    return [t for t in state["tasks"] if t["step_slug"] == slug]


def apply_flows(dsn: str, project_dir: Path = PROJECT) -> None:
    """Compile the project's flows with the compiler and apply the SQL (options included)."""
    from flowlane.compiler import compile_project, load_project

    files = compile_project(load_project([project_dir / "flows"]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _name, text in sorted(files.items(), key=lambda item: "alias" in item[0]):
            conn.execute(text.encode())  # flows first, then aliases.sql


def backdate_started(dsn: str, run_id: str, step_slug: str, seconds: int = 3600) -> None:
    """Make started tasks look stalled instead of waiting for the stall threshold."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "update flowlane.step_tasks set started_at = started_at - make_interval(secs => %s),"
            " lease_renewed_at = null, queued_at = queued_at - make_interval(secs => %s)"
            " where run_id = %s::uuid and step_slug = %s and status = 'started'",
            (seconds, seconds, run_id, step_slug),
        )


def requeue_stalled(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select flowlane.requeue_stalled_tasks()").fetchone()
    assert row is not None
    return int(row[0])


def queue_depth(dsn: str, queue: str) -> int:
    """Messages still in a queue (visible or not): 0 once every task is archived."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("select queue_length from pgmq.metrics(%s)", (queue,)).fetchone()
    assert row is not None
    return int(row[0])


REPORT: list[str] = []  # lines for the terminal summary (the crash matrix's throughput)


def applied_project(root: Path, dsn: str, flows: str, handlers: dict[str, str]) -> Path:
    """A project at ``root``: ``flows/flows.yaml`` and the handler modules (name -> source),
    compiled and applied to ``dsn``."""
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "flows.yaml").write_text(flows)
    for module, source in handlers.items():
        (root / f"{module}.py").write_text(source)
    for command in (("compile",), ("apply", "--dsn", dsn)):
        result = flowlane(*command, cwd=root)
        assert result.returncode == 0, result.stdout + result.stderr
    return root
