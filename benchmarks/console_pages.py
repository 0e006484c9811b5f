"""Console page render time on a database with 100k runs, against the raw queries, in one run.

    PYTHONPATH=. python benchmarks/console_pages.py [--runs 100000] [--repeat 30]

What it measures: that the console's pages stay a few milliseconds on a large database,
each a small multiple of the query a hand-written client would run for the same rows.

Seeds a fresh embedded PostgreSQL (in a temporary directory, removed afterwards) with
``--runs`` runs of flows/diamond.yaml (5 steps, a 3-task map; completed, failed and running
ones; 5 step states and 6 tasks per run; at least 11,000 runs, since every 1000th fails and
the run page measured is the 11th failed one), starts a real `flowlane ui` process and times,
median of ``--repeat`` requests over one keep-alive HTTP connection:

- the runs list (first page; a flow filter; the rare failed runs; a deep page of running
  runs through the keyset cursor),
- a run's page (run, steps with task counts, graph, failed tasks, attempt history), and
- the queues page (registry, PGMQ metrics, the completions chart),

each next to the raw query a hand-written client would run for the same rows (the runs
page's 50 rows; the run, its step states and its tasks; the tasks completed per queue in the
last 15 minutes), and the ratio page / raw. Then it drops the chart's index (the BRIN index
on step_tasks.completed_at) and measures again, to show what it buys. The seeded tables are
vacuumed first, as autovacuum keeps them (vacuum summarizes the BRIN ranges).

How to read it: the ratio column (page over raw query, both timed in the same run) is what
to compare between runs; "HTTP floor" is a static file, the cost of a request itself.
"""

from __future__ import annotations

import argparse
import http.client
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.engine_throughput import load_queries  # noqa: E402
from flowlane.app.console import encode_cursor  # noqa: E402
from flowlane.compiler import load_project  # noqa: E402
from flowlane.compiler.compiled import render_project  # noqa: E402
from flowlane.core import db, migrator  # noqa: E402

Q = load_queries(Path(__file__).with_suffix(".sql"))


def seed(conn: psycopg.Connection[Any], runs: int) -> float:
    start = time.perf_counter()
    files = render_project(load_project([ROOT / "flows" / "diamond.yaml"]))
    for _name, text in sorted(files.items(), key=lambda item: "alias" in item[0]):
        conn.execute(text.encode())
    with conn.transaction():
        for name in ("seed_runs", "seed_step_states", "seed_step_tasks"):
            conn.execute(Q[name], {"runs": runs})
    conn.execute(Q["analyze"])
    return time.perf_counter() - start


def median_ms(action: Callable[[], object], repeat: int) -> float:
    action()  # warm up caches and plans
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


class Page:
    """GET over one keep-alive connection; checks the status so that errors are not timed."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)

    def get(self, path: str) -> str:
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        body = response.read().decode()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:300]}")
        return body


def measure(conn: psycopg.Connection[Any], page: Page, runs: int, repeat: int
            ) -> list[tuple[str, float, float]]:
    offset = runs // 100  # the running runs are every 50th: this is about the middle of them
    deep = conn.execute(Q["cursor_at"], {"status": "started", "offset": offset}).fetchone()
    assert deep is not None
    failed = conn.execute(Q["a_failed_run"]).fetchone()
    assert failed is not None
    run_id = failed[0]
    deeper = {"after_started_at": deep[0], "after_run_id": deep[1]}

    def raw(name: str, params: dict[str, Any]) -> Callable[[], object]:
        return lambda: conn.execute(Q[name], params).fetchall()

    def raw_run() -> None:
        for name in ("raw_run", "raw_run_steps", "raw_run_tasks"):
            conn.execute(Q[name], {"run_id": run_id}).fetchall()

    deep_path = "/runs?" + urlencode({"status": "started", "after": encode_cursor(deep[0], deep[1])})
    assert page.get(deep_path).count("<tr data-run=") == 50
    cases = [
        ("runs list, first page", lambda: page.get("/runs"), raw("raw_runs_first_page", {})),
        ("runs list, flow filter", lambda: page.get("/runs?flow=diamond"), raw("raw_runs_of_flow", {})),
        ("runs list, failed (0.1%)", lambda: page.get("/runs?status=failed"),
         raw("raw_runs_failed_page", {})),
        (f"runs list, running, page {offset // 50 + 2}", lambda: page.get(deep_path),
         raw("raw_runs_started_deep_page", deeper)),
        ("run detail (failed run)", lambda: page.get(f"/runs/{run_id}"), raw_run),
        ("queues (chart of 15 min)", lambda: page.get("/queues"), raw("raw_throughput", {})),
    ]
    rows = [(label, median_ms(p, repeat), median_ms(r, repeat)) for label, p, r in cases]
    rows.append(("HTTP floor: a static file", median_ms(lambda: page.get("/static/console.js"), repeat),
                 float("nan")))
    return rows


def report(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title}")
    print(f"{'':30} {'page (HTTP)':>12} {'raw query':>10} {'ratio':>7}")
    for label, page_ms, raw_ms in rows:
        if math.isnan(raw_ms):  # no raw counterpart
            print(f"{label:30} {page_ms:9.2f} ms")
        else:
            print(f"{label:30} {page_ms:9.2f} ms {raw_ms:7.2f} ms {page_ms / raw_ms:6.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="flowlane-bench-console-"))
    server = None
    try:
        dsn = db.EmbeddedDatabase.start_at(workdir / "data")
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrator.ensure_pgmq(conn)
            migrator.migrate(conn)
            seconds = seed(conn, args.runs)
            counts = conn.execute("select (select count(*) from flowlane.runs), "
                                  "(select count(*) from flowlane.step_tasks)").fetchone()
            print(f"seeded {counts[0]} runs, {counts[1]} tasks in {seconds:.1f} s" if counts else "")
            server = subprocess.Popen([sys.executable, "-m", "flowlane", "ui", "--dsn", dsn, "--port", "0"],
                                      stdout=subprocess.PIPE, text=True, cwd=workdir)
            assert server.stdout is not None
            url = server.stdout.readline().split()[3]
            page = Page(url)
            report(f"with the chart's index (median of {args.repeat})",
                   measure(conn, page, args.runs, args.repeat))
            conn.execute(Q["drop_console_indexes"])
            report("without its index", measure(conn, page, args.runs, args.repeat))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        db.EmbeddedDatabase.stop_at(workdir / "data")
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
