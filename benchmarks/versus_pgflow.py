"""flowlane's SQL Core against pgflow's, the same flows driven the same way, in one run.

    PYTHONPATH=. python benchmarks/versus_pgflow.py [--runs 2000] [--batch 50] [--rounds 3]
        [--pgflow-version 0.8.1] [--pgflow-dir ~/.cache/flowlane-bench]

What it measures: what one connection drives through each engine's SQL functions, without
worker processes, each call its own autocommit transaction with synchronous_commit off. The
baseline is pgflow's SQL Core, the npm package `@pgflow/core` at --pgflow-version: the
script fetches it at run time with `npm pack` into --pgflow-dir (outside the repository;
nothing of the package is kept in it) and applies the package's migrations, in the order of
their names, to a database `pgflow`, on the same embedded PostgreSQL (pg_stat_statements
preloaded) as a database `flowlane` migrated to head by this checkout. Both databases hold
the same PGMQ, installed by flowlane's migrator (the `pgmq` Python package's bundled SQL
where the server has no pgmq extension). That PGMQ is newer than the 1.5 the package's
last migration requires, and satisfies it: its message record has the `headers` column
that migration checks for.

Stand-ins: the package expects a Supabase database. Its first migration creates the pgmq
extension (`create extension if not exists "pgmq"`): where PGMQ is the bundled SQL rather
than an extension, that one statement is left out when the file is applied (the schema
and functions it would create are there already). Its functions broadcast every event with
`realtime.send(payload, event, topic, private)`, Supabase Realtime's function: the script
creates a no-op of that signature (versus_pgflow.sql), so the baseline pays nothing for
its broadcasts, where Supabase would insert a row per event. Nothing else is stood in for.

Workloads, for a one-step flow and a three-step chain (the same definitions on both):
  start        one start_flow per call: runs/s
  per-task     read --batch messages (pgmq.read), start_tasks of them, one complete_task per
               task (the single calls): tasks/s of the drive, and end to end with the
               starts
  batched      flowlane: start_flows of the runs, then claim_tasks of --batch and one
               complete_tasks per batch (what `flowlane worker` does); pgflow has no
               batched completion, its best batched path is its per-task path above (a
               read and a start_tasks of --batch, complete_task per task), so its column
               repeats that one
  cpu/task     the database backend's CPU time (/proc/<pid>/schedstat) per task, the
               starts included, per-task and batched
Each round runs every workload once on each engine, the engines taking turns (flowlane,
pgflow, then pgflow, flowlane in the next round), --runs runs per workload, chain and
engine. Both backends are pinned to one CPU, the client to another.

How to read it: the figures are medians over the --rounds rounds; the ratio column is
flowlane's median over pgflow's. Above 1 flowlane is faster for rates; below 1 it spends
less CPU for cpu/task. Compare ratios between runs, never absolute rates: a shared
machine's speed drifts, and both engines ride the same drift in one run. The script fails
with a message if npm is missing or the registry cannot be reached (a cached package is
used without npm).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import engine_throughput as flowlane_bench
from benchmarks.engine_throughput import (
    Conn,
    backend_cpu_ns,
    load_queries,
    migrated_database,
    pin_backends,
    statements_server,
)
from flowlane.core import migrator

Q = load_queries(Path(__file__).with_suffix(".sql"))
PACKAGE = "@pgflow/core"
MIGRATIONS = Path("package/dist/supabase/migrations")
# the one statement of the package's first migration that needs pgmq as an extension
CREATE_PGMQ_EXTENSION = 'CREATE EXTENSION IF NOT EXISTS "pgmq" WITH SCHEMA "pgmq";'
CHAINS = {"bench_one": 1, "bench_three": 3}
OUTPUT = {"ok": True}


# -- the package ----------------------------------------------------------------


def fetch_package(version: str, cache: Path) -> Path:
    """The package's migrations directory, fetched with `npm pack` unless cached."""
    unpacked = cache / f"pgflow-core-{version}"
    migrations = unpacked / MIGRATIONS
    if migrations.is_dir():
        return migrations
    cache.mkdir(parents=True, exist_ok=True)
    spec = f"{PACKAGE}@{version}"
    if shutil.which("npm") is None:
        raise SystemExit(f"npm is not on PATH: it fetches {spec} (install Node.js and npm)")
    try:
        done = subprocess.run(
            ["npm", "pack", spec, "--pack-destination", str(cache), "--json", "--fetch-retries", "1"],
            capture_output=True, text=True, timeout=300, check=False,
        )
    except subprocess.TimeoutExpired as timeout:
        message = f"`npm pack {spec}` did not finish in 300 s: is the npm registry reachable?"
        raise SystemExit(message) from timeout
    if done.returncode != 0:
        head = "\n".join(done.stderr.strip().splitlines()[:4])
        raise SystemExit(f"`npm pack {spec}` failed (is the npm registry reachable?):\n{head}")
    [packed] = json.loads(done.stdout)
    tarball = cache / packed["filename"]
    with tarfile.open(tarball) as tar:
        tar.extractall(unpacked, filter="data")
    tarball.unlink()
    if not migrations.is_dir():
        raise SystemExit(f"{spec} has no {MIGRATIONS}: this script knows its layout up to 0.8")
    return migrations


def pgflow_database(admin: str, migrations: Path) -> Conn:
    """Database `pgflow`: PGMQ as flowlane installs it, the stand-ins, the package's migrations."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(b"create database pgflow")
    conn = psycopg.connect(psycopg.conninfo.make_conninfo(admin, dbname="pgflow"), autocommit=True)
    conn.execute(b"create extension pg_stat_statements")
    migrator.ensure_pgmq(conn)
    conn.execute(Q["realtime_stand_in"])
    as_extension = pgmq_extension_version(conn) is not None
    for path in sorted(migrations.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        if not as_extension:
            text = text.replace(CREATE_PGMQ_EXTENSION, "")
        with conn.transaction():
            conn.execute(text.encode())
    return conn


def pgmq_extension_version(conn: Conn) -> str | None:
    row = conn.execute(Q["pgmq_extension_version"]).fetchone()
    return str(row[0]) if row else None


def pgmq_installed(conn: Conn) -> str:
    """How PGMQ is installed in a database, and its version."""
    if version := pgmq_extension_version(conn):
        return f"PGMQ {version} (extension)"
    from pgmq.install import get_embedded_sql_version

    return f"PGMQ {get_embedded_sql_version()} (the pgmq package's SQL)"


# -- the drivers ------------------------------------------------------------------


class PgflowDriver:
    """pgflow's SQL Core, driven the way its worker does, one call per task."""

    name = "pgflow"

    def __init__(self, conn: Conn, batch: int) -> None:
        self.conn = conn
        self.batch = batch
        self.worker_id = uuid.uuid4()
        with conn.transaction():
            for flow, steps in CHAINS.items():
                conn.execute(Q["create_flow"], {"flow": flow})
                for i in range(steps):
                    deps = [f"s{i - 1}"] if i else []
                    conn.execute(Q["add_step"], {"flow": flow, "step": f"s{i}", "deps": deps})
            conn.execute(Q["register_worker"], {"worker_id": self.worker_id, "queue": "bench_one"})

    def start(self, flow: str, runs: int, batched: bool) -> None:
        for i in range(runs):
            self.conn.execute(Q["start_flow"], {"flow": flow, "input": Jsonb({"i": i})})

    def drive(self, flow: str, batched: bool) -> int:
        tasks = 0
        while ids := [r[0] for r in self.conn.execute(Q["read"], {"queue": flow, "qty": self.batch})]:
            params = {"flow": flow, "msg_ids": ids, "worker_id": self.worker_id}
            for run_id, step, index in self.conn.execute(Q["start_tasks"], params).fetchall():
                complete = {"run_id": run_id, "step": step, "task_index": index, "output": Jsonb(OUTPUT)}
                self.conn.execute(Q["complete_task"], complete)
                tasks += 1
        return tasks

    def unfinished(self, flow: str) -> int:
        row = self.conn.execute(Q["unfinished_runs"], {"flow": flow}).fetchone()
        return int(row[0]) if row else -1


class FlowlaneDriver:
    """flowlane's SQL Core through engine_throughput's driver: single calls or batched."""

    name = "flowlane"

    def __init__(self, conn: Conn, batch: int) -> None:
        self.conn = conn
        flowlane_bench.define(conn)
        self.modes = {
            batched: flowlane_bench.Driver(conn, set_based=batched, batch=batch, map_items=0)
            for batched in (False, True)
        }

    def start(self, flow: str, runs: int, batched: bool) -> None:
        self.modes[batched].start(flow, runs)

    def drive(self, flow: str, batched: bool) -> int:
        return self.modes[batched].drive(flow)

    def unfinished(self, flow: str) -> int:
        return int(flowlane_bench.scalar(self.conn, "unfinished_runs", flow=flow))


Driver = PgflowDriver | FlowlaneDriver


@dataclass
class Cell:
    """One engine's workload over the rounds: per round, runs/s of the start, tasks/s of the
    drive and end to end, backend CPU ms per task (start included); statements per task
    (start included, counted in a separate pass)."""

    start: list[float] = field(default_factory=list)
    drive: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    statements: list[float] = field(default_factory=list)


def one_round(driver: Driver, flow: str, runs: int, batched: bool, cell: Cell) -> None:
    pid = driver.conn.info.backend_pid
    cpu0, t0 = backend_cpu_ns(pid), time.perf_counter()
    driver.start(flow, runs, batched)
    t1 = time.perf_counter()
    tasks = driver.drive(flow, batched)
    t2 = time.perf_counter()
    cpu = backend_cpu_ns(pid) - cpu0
    if tasks != runs * CHAINS[flow]:
        raise SystemExit(f"{driver.name} {flow}: {tasks} tasks driven for {runs} runs")
    cell.start.append(runs / (t1 - t0))
    cell.drive.append(tasks / (t2 - t1))
    cell.e2e.append(tasks / (t2 - t0))
    cell.cpu.append(cpu / 1e6 / tasks)


MODES = {"per-task": False, "batched": True}
STATEMENT_RUNS = 50


def workloads(driver: Driver) -> list[tuple[str, bool]]:
    """A driver's modes; pgflow's best batched path is its per-task path, measured once."""
    return list(MODES.items()) if isinstance(driver, FlowlaneDriver) else [("per-task", False)]


def measure(drivers: list[Driver], runs: int, rounds: int) -> dict[tuple[str, str, str], Cell]:
    cells: dict[tuple[str, str, str], Cell] = {}
    for driver in drivers:  # warm-up, untimed: plans made, caches warm
        for flow in CHAINS:
            for _, batched in workloads(driver):
                one_round(driver, flow, flowlane_bench.WARM_UP, batched, Cell())
    for r in range(rounds):
        order = drivers if r % 2 == 0 else drivers[::-1]
        for flow in CHAINS:
            for driver in order:
                for mode, batched in workloads(driver):
                    cell = cells.setdefault((driver.name, flow, mode), Cell())
                    one_round(driver, flow, runs, batched, cell)
    for driver in drivers:  # statements per task, counted apart so that tracking slows no timed call
        for flow in CHAINS:
            for mode, batched in workloads(driver):
                def work(driver: Driver = driver, flow: str = flow, batched: bool = batched) -> int:
                    driver.start(flow, STATEMENT_RUNS, batched)
                    return driver.drive(flow, batched)

                count = flowlane_bench.count_statements(driver.conn, work)
                cells[(driver.name, flow, mode)].statements.append(count)
    for driver in drivers:
        for flow in CHAINS:
            if unfinished := driver.unfinished(flow):
                raise SystemExit(f"{driver.name} {flow}: {unfinished} runs did not complete")
    return cells


def report(cells: dict[tuple[str, str, str], Cell]) -> None:
    rows: list[tuple[str, str, str, str, Callable[[Cell], list[float]]]] = []
    for flow in CHAINS:
        rows += [
            (flow, "start_flow per call", "runs/s", "per-task", lambda c: c.start),
            (flow, "per-task drive", "tasks/s", "per-task", lambda c: c.drive),
            (flow, "per-task end to end", "tasks/s", "per-task", lambda c: c.e2e),
            (flow, "batched drive", "tasks/s", "batched", lambda c: c.drive),
            (flow, "batched end to end", "tasks/s", "batched", lambda c: c.e2e),
            (flow, "cpu/task per-task", "ms", "per-task", lambda c: c.cpu),
            (flow, "cpu/task batched", "ms", "batched", lambda c: c.cpu),
            (flow, "statements/task per-task", "count", "per-task", lambda c: c.statements),
            (flow, "statements/task batched", "count", "batched", lambda c: c.statements),
        ]
    print(f"{'flow':<12} {'workload':<24} {'unit':<8} {'flowlane':>9} {'pgflow':>9} {'ratio':>6}")
    for flow, workload, unit, mode, figures in rows:
        ours = statistics.median(figures(cells[("flowlane", flow, mode)]))
        theirs = statistics.median(figures(cells[("pgflow", flow, "per-task")]))
        digits = {"ms": 3, "count": 1}.get(unit, 0)
        print(
            f"{flow:<12} {workload:<24} {unit:<8} {ours:9.{digits}f} {theirs:9.{digits}f}"
            f" {ours / theirs:6.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per workload, chain, engine and round")
    parser.add_argument("--batch", type=int, default=50, help="messages per read / claim")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--pgflow-version", default="0.8.1", help=f"the {PACKAGE} version to measure")
    parser.add_argument(
        "--pgflow-dir", type=Path, default=Path.home() / ".cache" / "flowlane-bench",
        help="where the package is fetched to and kept (outside the repository)",
    )
    args = parser.parse_args()
    migrations = fetch_package(args.pgflow_version, args.pgflow_dir.expanduser())
    with statements_server("flowlane-versus-") as admin:
        ours = migrated_database(admin, "flowlane")
        theirs = pgflow_database(admin, migrations)
        try:
            for conn in (ours, theirs):
                conn.execute(b"set synchronous_commit = off")
                conn.execute(b"set pg_stat_statements.track = 'none'")
            pin_backends([ours, theirs])
            print(
                f"{PACKAGE} {args.pgflow_version} against this checkout: cpus {os.cpu_count()},"
                f" {args.runs} runs per workload and round, batch {args.batch},"
                f" {args.rounds} rounds (medians), synchronous_commit off;"
                f" both databases on {pgmq_installed(theirs)}\n"
            )
            cells = measure([FlowlaneDriver(ours, args.batch), PgflowDriver(theirs, args.batch)],
                            args.runs, args.rounds)
            report(cells)
        finally:
            ours.close()
            theirs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
