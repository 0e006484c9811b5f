"""Queued load: real workers drain a backlog of diamond runs while new runs arrive.

    PYTHONPATH=. python benchmarks/queued_load.py [--runs 1500] [--arriving 300] [--workers 3]

The flowlane code measured is the one on PYTHONPATH (run it with another
checkout's path for a before/after comparison on the same machine). Without
--dsn it starts a throwaway embedded PostgreSQL. The flow is
benchmarks/flows/queued.yaml: split -> (square: a 10-item map, meta) -> total,
timeout 3 s, handlers that do no work.

Printed: runs/s (from the workers' start to the last completion), runs
not finished within --limit seconds, duplicate executions (claims beyond the
first per task: every claim runs the handler once), results rejected by
fencing (from the workers' final stats), deadlocks (pg_stat_database), and
the run latency (run started -> completed) p50/p99 for the queued runs and
for the runs that arrived during the drain.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

import flowlane
from flowlane.compiler import compile_project, load_project
from flowlane.core import db, migrator

HERE = Path(__file__).resolve().parent
CODE = Path(flowlane.__file__).resolve().parents[1]  # the checkout being measured
FLOW = "bench_diamond"


def fresh_database(admin_dsn: str) -> str:
    name = f"flowlane_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"'.encode())
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrator.ensure_pgmq(conn)
        migrator.migrate(conn)
        for path, text in sorted(compile_project(load_project([HERE / "flows"])).items()):
            if path.startswith("flows/"):
                conn.execute(text.encode())
    return dsn


def start_runs(dsn: str, count: int, rate: float | None = None, failed: list[str] | None = None
               ) -> None:
    """Start ``count`` runs, one transaction each; at most ``rate`` per second if given.
    A start the database refuses (e.g. a deadlock) is recorded in ``failed``."""
    began = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(count):
            if rate:
                time.sleep(max(0.0, began + i / rate - time.monotonic()))  # pacing the producer
            try:
                conn.execute(b"select flowlane.start_flow(%s, '{\"width\": 10}'::jsonb)", (FLOW,))
            except psycopg.Error as exc:
                if failed is None:
                    raise
                failed.append(type(exc).__name__)


def spawn_workers(dsn: str, count: int, folder: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    workers = []
    for i in range(count):
        log = folder / f"worker-{i}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "worker", str(HERE / "flows"), "--flow", FLOW,
             "--dsn", dsn, "--import-path", str(HERE), "--log-level", "INFO"],
            cwd=HERE, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        )
        workers.append((proc, log))
    return workers


def scalar(conn: psycopg.Connection[Any], query: bytes) -> Any:
    row = conn.execute(query).fetchone()
    return row[0] if row else None


def percentiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


def measure(dsn: str, args: argparse.Namespace) -> None:
    folder = Path(tempfile.mkdtemp(prefix="flowlane-bench-queued-"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadlocks = scalar(conn, b"select deadlocks from pg_stat_database "
                                 b"where datname = current_database()")
        start_runs(dsn, args.runs)
        began = scalar(conn, b"select now()")
        workers = spawn_workers(dsn, args.workers, folder)
        failed: list[str] = []
        producer = threading.Thread(target=start_runs,
                                    args=(dsn, args.arriving, args.rate, failed))
        producer.start()
        deadline = time.monotonic() + args.limit
        while time.monotonic() < deadline:
            time.sleep(0.5)  # a benchmark's progress poll, not a test
            if not producer.is_alive() and scalar(
                    conn, b"select count(*) from flowlane.runs where status = 'started'") == 0:
                break
        producer.join()
        for proc, _ in workers:
            proc.terminate()
        for proc, _ in workers:
            proc.wait(60)
        report(conn, began, deadlocks, workers, args)
        print(f"  start_flow failures       {len(failed):8d}   {sorted(set(failed))}")


def report(conn: psycopg.Connection[Any], began: Any, deadlocks: int,
           workers: list[tuple[subprocess.Popen[bytes], Path]], args: argparse.Namespace) -> None:
    rows = conn.execute(
        b"select status, extract(epoch from coalesce(completed_at, failed_at) - started_at), "
        b"started_at > %s, extract(epoch from coalesce(completed_at, failed_at) - %s) "
        b"from flowlane.runs", (began, began)).fetchall()
    done = [r for r in rows if r[0] == "completed"]
    span = max((float(r[3]) for r in done), default=float("nan"))
    claims, tasks = conn.execute(
        b"select coalesce(sum(attempts_count), 0), count(*) from flowlane.step_tasks").fetchone() or (0, 0)
    rejected = sum(int(m) for _, log in workers
                   for m in re.findall(r"worker_stopped .*?rejected=(\d+)", log.read_text()))
    deadlocks_after = scalar(conn, b"select deadlocks from pg_stat_database "
                                   b"where datname = current_database()")
    queued = [float(r[1]) for r in done if not r[2]]
    arrived = [float(r[1]) for r in done if r[2]]
    print(f"code: {CODE}")
    print(f"runs: {args.runs} queued + {args.arriving} arriving at {args.rate}/s, "
          f"{args.workers} workers, flow {FLOW} (13 tasks per run)")
    print(f"  runs/s                    {len(done) / span:8.1f}   ({len(done)} completed in {span:.1f} s)")
    print(f"  not finished in {args.limit:.0f} s     {len(rows) - len(done):8d}")
    print(f"  duplicate executions      {int(claims) - int(tasks):8d}   (claims {claims}, tasks {tasks})")
    print(f"  results rejected          {rejected:8d}")
    print(f"  deadlocks                 {int(deadlocks_after) - int(deadlocks):8d}")
    for label, values in (("queued runs", queued), ("arriving runs", arrived)):
        p50, p99 = percentiles(values)
        print(f"  latency {label:<15}   p50 {p50:7.2f} s   p99 {p99:7.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="admin DSN (may CREATE DATABASE); default: embedded")
    parser.add_argument("--runs", type=int, default=1500, help="runs queued before the workers start")
    parser.add_argument("--arriving", type=int, default=300, help="runs started during the drain")
    parser.add_argument("--rate", type=float, default=20.0, help="arrivals per second")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--limit", type=float, default=150.0, help="seconds before giving up")
    args = parser.parse_args()
    tmp = None
    admin = args.dsn
    if admin is None:
        tmp = tempfile.mkdtemp(prefix="flowlane-bench-")
        os.chmod(tmp, 0o711)  # the server account (when run as root) must reach its data
        admin = db.EmbeddedDatabase.start_at(Path(tmp) / "pgdata")
    try:
        measure(fresh_database(admin), args)
    finally:
        if tmp is not None:
            db.EmbeddedDatabase.stop_at(Path(tmp) / "pgdata")


if __name__ == "__main__":
    main()
