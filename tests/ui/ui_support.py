"""Console test support: a seeded database, a real `flowlane ui` process, a headless Chromium.

Also used by ``docs/screenshots.py`` so that the README's screenshots come from the same
browser and data as the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from flowlane.compiler import load_project
from flowlane.compiler.compiled import render_project
from flowlane.runtime.tasks import bounded_traceback, describe, error_type
from tests.core.engine import Engine  # the SQL Core driven as a worker drives it

PROJECT = Path(__file__).resolve().parent / "project"
CHROMIUM = os.environ.get("FLOWLANE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FLOWLANE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
PRICE_ERROR = "ValueError: line 2 has a negative price (-5)"


def price(line: int, value: int) -> int:
    """The seeded handler's logic, run for real so that the failure carries a real traceback."""
    if value < 0:
        raise ValueError(f"line {line} has a negative price ({value})")
    return value * 2


def fail_like_a_worker(conn: psycopg.Connection[Any], task: dict[str, Any], worker_id: uuid.UUID,
                       exc: BaseException) -> None:
    """What the worker does with a handler's exception: its text, type and bounded traceback."""
    conn.execute(
        "select 1 from flowlane.fail_task_detailed(%s, %s, %s, %s, %s, %s, %s, %s)",
        (task["run_id"], task["step_slug"], task["task_index"], describe(exc), worker_id,
         task["attempt"], error_type(exc), bounded_traceback(exc)))


def apply_flows(dsn: str) -> None:
    """Compile the console project and apply its SQL, as `flowlane apply` would."""
    files = render_project(load_project([PROJECT / "flows"]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _name, text in sorted(files.items(), key=lambda item: "alias" in item[0]):
            conn.execute(text.encode())


@dataclass
class Seeded:
    """Run ids by the state the seed left them in."""

    completed: uuid.UUID
    skipped_notify: uuid.UUID
    failed: uuid.UUID
    queued: uuid.UUID
    running: uuid.UUID
    running_task: dict[str, Any]
    worker_id: uuid.UUID  # the claimer of running_task (completions are fenced)


def seed(dsn: str) -> Seeded:
    """Runs in every state a run and its steps can be in, driven through the SQL Core as a worker
    drives it (read + start_tasks, complete_task, fail_task)."""
    apply_flows(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        completed = engine.start("orders_v1", {"order": 1})
        skipped_notify = engine.start("orders", {"order": 2})
        failed = engine.start("orders_v1", {"order": 3})
        for task in engine.claim("intake"):  # fetch of the three runs
            engine.complete(task, [10, -5, 7] if task["run_id"] == failed else [10, 20])
        for task in engine.claim("intake"):  # audit
            engine.complete(task, {"urgent": task["run_id"] == completed})
        for task in engine.claim("pricing"):
            try:
                engine.complete(task, price(task["task_index"] + 1, task["input"]))
            except ValueError as exc:
                fail_like_a_worker(conn, task, engine.worker_id, exc)
        for queue in ("notify", "intake"):  # notify (urgent run only), then report
            for task in engine.claim(queue):
                engine.complete(task, {"sent": True} if queue == "notify" else {"total": 1})
        engine.drive("intake", lambda task: {"total": 60})
        queued = engine.start("ping", {})
        running = engine.start("orders_v2", {"order": 4})
        (running_task,) = [t for t in engine.claim("intake") if t["run_id"] == running]
        register_workers(conn, engine.worker_id)
        return Seeded(completed, skipped_notify, failed, queued, running, running_task, engine.worker_id)


def claim_only(engine: Engine, queue: str, run_id: uuid.UUID) -> dict[str, Any]:
    """Claim the one queued task of ``run_id`` on ``queue``, leaving other runs' messages alone."""
    msg_id = engine.scalar(
        "select message_id from flowlane.step_tasks where run_id = %s and status = 'queued'", (run_id,))
    (task,) = engine.start_tasks(queue, [msg_id])
    return task


def register_workers(conn: psycopg.Connection[Any], live: uuid.UUID) -> None:
    """Deployments as workers record them: a live worker on intake, a stale one on pricing
    (heartbeat backdated), a stopped one on notify whose deployment was then disabled."""
    stale, stopped = uuid.uuid4(), uuid.uuid4()
    for worker_id, queue, pairs in (
            (live, "intake",
             [[f, s] for f in ("orders_v1", "orders_v2") for s in ("fetch", "audit", "report")]),
            (stale, "pricing", [["orders_v1", "price"], ["orders_v2", "price"]]),
            (stopped, "notify", [["orders_v1", "notify"], ["orders_v2", "notify"]])):
        conn.execute("select flowlane.register_worker(%s, %s, %s, %s, %s)",
                     (worker_id, queue, f"{queue}-worker", f"{queue}_workers", Jsonb(pairs)))
    conn.execute("update flowlane.workers set started_at = now() - interval '10 minutes', "
                 "last_heartbeat_at = now() - interval '5 minutes' where worker_id = %s", (stale,))
    conn.execute("select flowlane.mark_worker_stopped(%s)", (stopped,))
    conn.execute("select flowlane.set_deployment_enabled('notify_workers', false, %s)",
                 ("unsupported work on queue notify: message 7 (orders_v3, notify)",))


def finish(dsn: str, seeded: Seeded) -> None:
    """Complete the seeded running run (its claimed task, then everything after it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.worker_id = seeded.worker_id
        assert engine.complete(seeded.running_task, [1])["status"] == "completed"
        for queue in ("intake", "pricing", "intake", "notify", "intake"):
            engine.drive(queue, lambda task: {"ok": True} if task["step_slug"] != "price" else 2)


class UiServer:
    """``python -m flowlane ui`` as a real process on a free port; ``url`` once it listens."""

    def __init__(self, dsn: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "ui", "--dsn", dsn, "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until the socket is bound (or it exits)
        if not line.startswith("flowlane ui: serving "):
            self.process.kill()
            _, stderr = self.process.communicate(timeout=10)
            raise AssertionError(f"flowlane ui did not start: {line!r} {stderr}")
        self.banner = line.strip()
        self.url = line.split()[3].rstrip("/")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@contextmanager
def ui_server(dsn: str, *args: str, env: dict[str, str] | None = None) -> Iterator[UiServer]:
    server = UiServer(dsn, *args, env=env)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def browser(width: int = 1440, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium driven through chromedriver; fails (never skips) when it cannot start."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise AssertionError(
                f"{path} is missing: the console's browser tests need Debian's chromium "
                "(sh tools/install-browser.sh installs chromium and chromium-driver)")
    profile = Path(tempfile.mkdtemp(prefix="flowlane-chromium-"))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str


def fetch(url: str, method: str = "GET", *, body: str | None = None,
          headers: dict[str, str] | None = None) -> Reply:
    """One real HTTP request (no redirects followed, no cookies kept)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        sent = dict(headers or {})
        if body is not None:
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        conn.request(method, path or "/", body=body, headers=sent)
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read().decode("utf-8", "replace"))
    finally:
        conn.close()


SCREENSHOTS = ("runs", "run", "flow", "queues", "workers")


def screenshots(driver: Any, url: str, seeded: Seeded, out: Path) -> list[Path]:
    """PNG screenshots of the main pages, taken by ``driver`` (also writes docs/ via docs/screenshots.py)."""
    pages = {"runs": "/runs", "run": f"/runs/{seeded.failed}", "flow": "/flows/orders_v1",
             "queues": "/queues", "workers": "/workers"}
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SCREENSHOTS:
        driver.get(url + pages[name])
        driver.execute_script("document.querySelectorAll('details.traceback').forEach(d => d.open = true)")
        # the whole page (up to 1800 px): the run page's attempt history sits below the fold
        width = driver.get_window_size()["width"]
        driver.set_window_size(width, 600)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(height + 140, 1800))  # + the browser's own chrome
        path = out / f"console-{name}.png"
        if not driver.save_screenshot(str(path)):
            raise AssertionError(f"the browser could not take a screenshot of {pages[name]}")
        written.append(path)
    return written


@dataclass
class Waits:
    """Runs that wait for something other than flow control (``seed_waits``)."""

    approval: uuid.UUID  # `review`: its wait step `approve` waits for a signal
    parent: uuid.UUID  # `pipeline`: 7 steps, waits for its approval and for a child run
    child: uuid.UUID  # the `review` run the parent's step `child` started
    stale: uuid.UUID  # `crunch`: its task was started by a worker whose heartbeat is stale
    stale_worker: uuid.UUID


def seed_waits(dsn: str) -> Waits:
    """A wait step's run, a 7-step run waiting for its approval and its child run (with a long
    and a conditional edge in its graph), and a run whose started task's worker went stale:
    its claim backdated by a minute, its worker's heartbeat by 10 (never slept for)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("review", [("draft", [], {"queue_name": "reviews"}),
                                 ("approve", ["draft"], {"step_type": "wait", "timeout": 3600})],
                      queue_mode="explicit")
        engine.define("pipeline", [
            ("load", [], {"queue_name": "reviews"}),
            ("check", ["load"], {"queue_name": "reviews"}),
            ("child", ["load"], {"child_flow": "review"}),
            ("approve", ["check"], {"step_type": "wait"}),
            ("merge", ["approve", "child"], {"queue_name": "reviews"}),
            ("ship", ["merge"], {"queue_name": "reviews"}),
            ("notify", ["load", "ship"], {"queue_name": "reviews",
                                          "required_input_pattern": {"load": {"urgent": True}}}),
        ], queue_mode="explicit")
        engine.define("crunch", [("work", [], {"queue_name": "crunching", "timeout": 60})],
                      queue_mode="explicit")
        approval = engine.start("review", {"doc": 1})
        parent = engine.start("pipeline", {"order": 1})
        engine.drive("reviews", lambda task: {"urgent": True})  # draft, load, check, the child's draft
        child = engine.scalar("select run_id from flowlane.runs where parent_run_id = %s", (parent,))
        stale = engine.start("crunch", {})
        stale_worker = uuid.uuid4()
        conn.execute("select flowlane.register_worker(%s, 'crunching', 'crunch-worker', 'crunchers', %s)",
                     (stale_worker, Jsonb([["crunch", "work"]])))
        assert len(engine.claim("crunching", worker_id=stale_worker)) == 1
        conn.execute("update flowlane.workers set started_at = now() - interval '10 minutes', "
                     "last_heartbeat_at = now() - interval '10 minutes' where worker_id = %s",
                     (stale_worker,))
        # claimed a minute ago: stalled recovery hands the task out again 30 s from now
        conn.execute("update flowlane.step_tasks set queued_at = queued_at - interval '1 minute', "
                     "started_at = started_at - interval '1 minute' where run_id = %s", (stale,))
        return Waits(approval, parent, uuid.UUID(str(child)), stale, stale_worker)


def utc(moment: datetime) -> str:
    """A time as the waiting reasons write it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def _signal_reason(conn: psycopg.Connection[Any], run_id: uuid.UUID) -> str:
    """Its wait step `approve`: since when it waits, and its timeout when it has one."""
    row = conn.execute(
        "select s.started_at, w.expires_at from flowlane.step_states s left join flowlane.wait_deadlines w "
        "using (run_id, step_slug) where s.run_id = %s and s.step_slug = 'approve'", (run_id,)).fetchone()
    assert row is not None
    return f"signal approve since {utc(row[0])}" + (f", times out at {utc(row[1])}" if row[1] else "")


def wait_reasons(dsn: str, waits: Waits) -> dict[str, str]:
    """The reasons, from the rows they are about (the stall deadline: the claim + timeout + 30 s)."""
    with psycopg.connect(dsn) as conn:
        claimed = conn.execute("select started_at from flowlane.step_tasks where run_id = %s",
                               (waits.stale,)).fetchone()
        assert claimed is not None
        return {
            "approval": _signal_reason(conn, waits.approval),
            "child_signal": _signal_reason(conn, waits.child),
            "parent_signal": _signal_reason(conn, waits.parent),
            "child": f"child run {waits.child} (of step child)",
            "stale": f"task work[0] of stale worker {str(waits.stale_worker)[:8]} to be handed out "
                     f"again at {utc(claimed[0] + timedelta(seconds=60 + 30))}",
        }
