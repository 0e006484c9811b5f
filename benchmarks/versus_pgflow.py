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
that migration checks for. The calls are those of the package's 0.8 line (start_tasks of
a flow's message ids and a worker id, whose row the script inserts into pgflow.workers);
another version may need them changed.

Stand-ins: the package expects a Supabase database. Its first migration creates the pgmq
extension (`create extension if not exists "pgmq"`): where PGMQ is the bundled SQL rather
than an extension, that one statement is left out when the file is applied (the schema
and functions it would create are there already). Its functions broadcast every event with
`realtime.send(payload, event, topic, private)`, Supabase Realtime's function: the script
creates a no-op of that signature (versus_pgflow.sql), so the baseline pays nothing for
its broadcasts: its figures are, if anything, better than on Supabase. Nothing else is
stood in for.

Workloads, for a one-step flow and a three-step chain (the same definitions on both):
  start        one start_flow per call: runs/s
  per-task     read --batch messages (pgmq.read), start_tasks of them, one complete_task per
               task (the single calls): tasks/s of the drive, and end to end with the
               starts
  batched      flowlane: start_flows of --batch runs per call, then claim_tasks of --batch
               and one complete_tasks per batch (what `flowlane worker` does); pgflow has no
               batched completion, its best batched path is its per-task path above (a
               read and a start_tasks of --batch, complete_task per task), so its column
               repeats that one
  cpu/task     the database backend's CPU time (/proc/<pid>/schedstat) per task, the
               starts included, per-task and batched
  statements   statements the server executes per task, the starts included
Each round runs, per chain, the three workloads (flowlane per-task, flowlane batched, pgflow
per-task) of --runs runs each side by side, in turns: a turn starts --batch runs (one
start_flow per run, or one start_flows) or, once they are started, drives one batch (a read
or claim of --batch and its completions); the workloads take turns until all are done,
each turn timed and the backend's CPU read around it, so that a shared machine's load, which
changes from one second to the next, falls on both engines alike. The order of the engines
turns around from one round to the next. Both backends are pinned to one CPU, the client to
another. Statements per task are counted after the rounds, in a pass of 50 runs per
workload with pg_stat_statements.track = 'all' (nested statements included).

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
from collections.abc import Callable, Iterator
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

    def drive_batch(self, flow: str, batched: bool) -> int:
        """A read of up to ``batch`` messages, start_tasks of them and one complete_task per
        task started: how many."""
        ids = [r[0] for r in self.conn.execute(Q["read"], {"queue": flow, "qty": self.batch})]
        if not ids:
            return 0
        params = {"flow": flow, "msg_ids": ids, "worker_id": self.worker_id}
        started = self.conn.execute(Q["start_tasks"], params).fetchall()
        for run_id, step, index in started:
            complete = {"run_id": run_id, "step": step, "task_index": index, "output": Jsonb(OUTPUT)}
            self.conn.execute(Q["complete_task"], complete)
        return len(started)

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

    def drive_batch(self, flow: str, batched: bool) -> int:
        return self.modes[batched].drive_batch(flow)

    def unfinished(self, flow: str) -> int:
        return int(flowlane_bench.scalar(self.conn, "unfinished_runs", flow=flow))


Driver = PgflowDriver | FlowlaneDriver
MODES = {"per-task": False, "batched": True}
STATEMENT_RUNS = 50


def workloads(driver: Driver) -> list[tuple[str, bool]]:
    """A driver's modes; pgflow's best batched path is its per-task path, measured once."""
    return list(MODES.items()) if isinstance(driver, FlowlaneDriver) else [("per-task", False)]


def drive(driver: Driver, flow: str, batched: bool) -> int:
    tasks = 0
    while driven := driver.drive_batch(flow, batched):
        tasks += driven
    return tasks


def turns(driver: Driver, flow: str, runs: int, batched: bool, batch: int) -> Iterator[tuple[str, int]]:
    """A workload in turns: ``batch`` runs started, then one batch driven at a time; each turn
    yields its phase and how many runs or tasks it did. The turn that ends the workload is
    the drive's last, empty, read or claim."""
    for offset in range(0, runs, batch):
        count = min(batch, runs - offset)
        driver.start(flow, count, batched)
        yield "start", count
    while driven := driver.drive_batch(flow, batched):
        yield "drive", driven


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


@dataclass
class Tally:
    """One workload's round: seconds per phase, backend CPU ns, runs and tasks done."""

    seconds: dict[str, float] = field(default_factory=lambda: {"start": 0.0, "drive": 0.0})
    done: dict[str, int] = field(default_factory=lambda: {"start": 0, "drive": 0})
    cpu_ns: int = 0

    def add_to(self, cell: Cell) -> None:
        runs, tasks = self.done["start"], self.done["drive"]
        start_s, drive_s = self.seconds["start"], self.seconds["drive"]
        cell.start.append(runs / start_s)
        cell.drive.append(tasks / drive_s)
        cell.e2e.append(tasks / (start_s + drive_s))
        cell.cpu.append(self.cpu_ns / 1e6 / tasks)


Workload = tuple[Driver, str, str, bool]  # driver, flow, mode, batched


def one_round(jobs: list[Workload], runs: int, batch: int) -> list[Tally]:
    """The workloads taking turns until all are done: each turn timed, and the backend's CPU
    read around it, so that the machine's load falls on all alike."""
    tallies = [Tally() for _ in jobs]
    active = {
        i: (driver, turns(driver, flow, runs, batched, batch))
        for i, (driver, flow, _, batched) in enumerate(jobs)
    }
    while active:
        for i, (driver, steps) in list(active.items()):
            pid = driver.conn.info.backend_pid
            cpu0, t0 = backend_cpu_ns(pid), time.perf_counter()
            turn = next(steps, None)
            seconds, cpu_ns = time.perf_counter() - t0, backend_cpu_ns(pid) - cpu0
            phase, count = turn or ("drive", 0)
            tallies[i].seconds[phase] += seconds
            tallies[i].done[phase] += count
            tallies[i].cpu_ns += cpu_ns
            if turn is None:
                del active[i]
    for (driver, flow, _, _), tally in zip(jobs, tallies, strict=True):
        if tally.done["drive"] != runs * CHAINS[flow]:
            raise SystemExit(f"{driver.name} {flow}: {tally.done['drive']} tasks driven for {runs} runs")
    return tallies


def measure(drivers: list[Driver], runs: int, rounds: int, batch: int) -> dict[tuple[str, str, str], Cell]:
    cells: dict[tuple[str, str, str], Cell] = {}
    for flow in CHAINS:  # warm-up, untimed: plans made, caches warm
        one_round([(d, flow, m, b) for d in drivers for m, b in workloads(d)], flowlane_bench.WARM_UP, batch)
    for r in range(rounds):
        order = drivers if r % 2 == 0 else drivers[::-1]
        for flow in CHAINS:
            jobs = [(d, flow, m, b) for d in order for m, b in workloads(d)]
            for (driver, _, mode, _), tally in zip(jobs, one_round(jobs, runs, batch), strict=True):
                tally.add_to(cells.setdefault((driver.name, flow, mode), Cell()))
    for driver in drivers:  # statements per task, counted apart so that tracking slows no timed call
        for flow in CHAINS:
            for mode, batched in workloads(driver):
                def work(driver: Driver = driver, flow: str = flow, batched: bool = batched) -> int:
                    driver.start(flow, STATEMENT_RUNS, batched)
                    return drive(driver, flow, batched)

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
            drivers: list[Driver] = [FlowlaneDriver(ours, args.batch), PgflowDriver(theirs, args.batch)]
            cells = measure(drivers, args.runs, args.rounds, args.batch)
            report(cells)
        finally:
            ours.close()
            theirs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
