"""Bloat and long transactions: steady load with and without a session holding a snapshot.

    PYTHONPATH=. python benchmarks/bloat.py [--phase 60] [--rate 10] [--claimers 2]
    PYTHONPATH=. python benchmarks/bloat.py --retention 20 [--phase 120]
    PYTHONPATH=. python benchmarks/bloat.py --versus-pgmq [--hold 90] [--rate 200]

What it measures: that the engine's tables stay healthy under steady load: dead rows are
vacuumed away, a long-open snapshot slows nothing down beyond the dead rows it keeps, and
pruning finished runs makes the tables level off.

For each storage configuration, on a fresh database of one throwaway embedded PostgreSQL
(autovacuum on, durable commits):

- ``defaults``: every storage parameter of the engine tables and the queue tables reset to
  PostgreSQL's defaults;
- ``flowlane``: as `flowlane db migrate` leaves them (docs/reliability.md, "Storage").

three phases of --phase seconds each run the same steady load: a producer starts
``bench_diamond`` runs (13 tasks) at --rate per second, --claimers threads claim like a worker
(``pgmq.read`` + ``start_tasks``) and complete at once (``complete_tasks``):

- ``steady``: nothing else;
- ``snapshot held``: another session sits idle in a REPEATABLE READ transaction that has read
  ``flowlane.runs`` (its snapshot keeps vacuum from removing any row version newer than it);
- ``released``: that session has committed.

Printed per phase: tasks completed per second, claim latency p50/p99 (one ``pgmq.read`` +
``start_tasks`` round trip that claimed something), dead tuples at the end of the phase
(``pg_stat_user_tables.n_dead_tup``) of the queue, ``step_tasks``, ``step_states`` and
``runs``, the queue table's size, and autovacuum runs on those tables during the phase.

With ``--retention SECONDS`` it measures retention instead: the same steady load for
--phase seconds on two fresh databases (``flowlane`` storage), one that keeps every run and
one where a pruner calls ``prune_runs(p_older_than => SECONDS)`` once a second (batch after
batch until one finds nothing), printing side by side every --phase/6 seconds the total
size (table and indexes) of ``runs``, ``step_states``, ``step_tasks`` and the queue's
archive, and the runs kept.

With ``--versus-pgmq`` it measures the dead tuples a task leaves against raw PGMQ's, in two
cases, each on a fresh database (``flowlane`` storage): ``no snapshot`` and ``snapshot
held`` (a session in a REPEATABLE READ transaction that has read ``flowlane.runs``, from
the start of the window to its end). In each, side by side on the same server: producers
start one-step ``bench_noop`` runs (one ``start_flow`` per transaction) at --rate per second
in all, drained by one real ``flowlane worker`` (no-op handler); other producers send
messages to a plain PGMQ queue (one ``pgmq.send`` per transaction) at the same rate, drained
by a consumer that reads batches of up to 100 and archives them. After 15 s of warm-up,
for --hold seconds, the dead tuples (``n_dead_tup``) of every table each side writes are
sampled once a second: for flowlane ``runs``, ``step_states``, ``step_tasks``,
``task_leases`` and ``task_attempts`` (those that exist) and its queue and archive; for
PGMQ its queue and archive. Printed per case and side: tasks (messages) completed in the
window, counted in the tables (runs completed, messages archived), the side's dead tuples
at the window's start, their peak (their sum at one sample) with each table's
share at that sample, dead tuples per completed task (the peak over the tasks completed in
the window), and flowlane's dead tuples per task over PGMQ's.

How to read it: compare the rows of one run. Under ``snapshot held`` the dead tuples grow
and must fall again once ``released`` has had its autovacuum (a phase of 60 s gives it
time); tasks/s should match --rate x 13 in every phase. With --retention, the "pruned"
sizes level off while the "kept" ones grow linearly. With --versus-pgmq, the ratio of dead
tuples per task under a held snapshot is what the tables cost vacuum beyond the queue's own;
both sides must complete about --rate per second (otherwise the machine did not hold it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.worker_throughput import REPO, Workers, template_database
from flowlane.core import db

FLOW = "bench_diamond"
TABLES = {"queue": f"pgmq.q_{FLOW}", "step_tasks": "flowlane.step_tasks",
          "step_states": "flowlane.step_states", "runs": "flowlane.runs"}
# the tables a run's and its tasks' rows go to; a version may lack one (see existing_tables)
ENGINE_TABLES = ("flowlane.runs", "flowlane.step_states", "flowlane.step_tasks", "flowlane.task_leases",
                 "flowlane.task_attempts")
PAIRS = Jsonb([[FLOW, s] for s in ("split", "square", "meta", "total")])
OUTPUTS = {"split": list(range(10)), "square": 1, "meta": {"n": 10}, "total": 1}
PARAMETERS = ("fillfactor", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold",
              "autovacuum_vacuum_insert_scale_factor", "autovacuum_vacuum_insert_threshold",
              "autovacuum_analyze_scale_factor", "autovacuum_vacuum_cost_delay")


def existing_tables(conn: psycopg.Connection[Any], names: Sequence[str]) -> list[str]:
    """Those of ``names`` that exist in the database (versions differ in their tables)."""
    return [name for name in names
            if conn.execute(b"select to_regclass(%s) is not null", (name,)).fetchone()[0]]  # type: ignore[index]


def fresh_database(admin_dsn: str, config: str) -> str:
    """A new database (migrated, the benchmark flows applied), storage per ``config``."""
    dsn = template_database(admin_dsn, REPO)
    if config == "defaults":
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in TABLES.values():
                conn.execute(f"alter table {table} reset ({', '.join(PARAMETERS)})".encode())
    return dsn


START = b"select flowlane.start_flow(%s, '{}'::jsonb)"
SEND = b"select pgmq.send(%s, '{}'::jsonb)"


def produce(dsn: str, rate: float, stop: threading.Event, statement: bytes = START, name: str = FLOW) -> None:
    """``statement`` with ``name``, one per transaction, ``rate`` times a second until ``stop``."""
    began = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            time.sleep(max(0.0, began + i / rate - time.monotonic()))  # pacing the producer
            conn.execute(statement, (name,))
            i += 1


def claim(dsn: str, stop: threading.Event, latencies: list[float], done: list[int]) -> None:
    worker = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(b"select flowlane.register_worker(%s, %s, 'bloat', 'bloat', %s)",
                     (worker, FLOW, PAIRS))
        while not stop.is_set():
            began = time.perf_counter()
            ids = [r[0] for r in conn.execute(b"select msg_id from pgmq.read(%s, 30, 10)", (FLOW,))]
            tasks = conn.execute(
                b"select run_id, step_slug, task_index, attempt from flowlane.start_tasks("
                b"%s, %s, %s, %s) where outcome = 'claimed'", (FLOW, ids, worker, PAIRS)
            ).fetchall() if ids else []
            if not tasks:
                time.sleep(0.01)  # an idle claimer's poll interval
                continue
            latencies.append(time.perf_counter() - began)
            results = [{"run_id": str(r[0]), "step_slug": r[1], "task_index": r[2],
                        "output": OUTPUTS[r[1]], "worker_id": str(worker), "attempt": r[3]}
                       for r in tasks]
            conn.execute(b"select count(*) from flowlane.complete_tasks(%s)", (Jsonb(results),))
            done.append(len(tasks))


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int, int]]:
    """name -> (dead tuples, autovacuum count, bytes)."""
    conn.execute(b"select pg_stat_clear_snapshot()")
    found = {}
    for label, table in TABLES.items():
        row = conn.execute(
            b"select n_dead_tup, autovacuum_count, pg_total_relation_size(relid) "
            b"from pg_stat_user_tables where relid = %s::regclass", (table,)).fetchone()
        assert row is not None
        found[label] = (int(row[0]), int(row[1]), int(row[2]))
    return found


def percentiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


def measure(admin: str, config: str, args: argparse.Namespace) -> list[str]:
    dsn = fresh_database(admin, config)
    stop = threading.Event()
    latencies: list[float] = []
    done: list[int] = []
    threads = [threading.Thread(target=produce, args=(dsn, args.rate, stop))]
    threads += [threading.Thread(target=claim, args=(dsn, stop, latencies, done))
                for _ in range(args.claimers)]
    lines = []
    with psycopg.connect(dsn, autocommit=True) as stats, psycopg.connect(dsn) as holder:
        for thread in threads:
            thread.start()
        for phase in ("steady", "snapshot held", "released"):
            if phase == "snapshot held":
                holder.execute(b"set transaction isolation level repeatable read")
                holder.execute(b"select count(*) from flowlane.runs")  # idle in transaction now
            elif phase == "released":
                holder.commit()
            before = table_stats(stats)
            first_latency, first_done, began = len(latencies), len(done), time.monotonic()
            time.sleep(args.phase)  # the phase's duration
            elapsed = time.monotonic() - began
            after = table_stats(stats)
            rate = sum(done[first_done:]) / elapsed
            p50, p99 = percentiles(latencies[first_latency:])
            dead = "  ".join(f"{label} {after[label][0]:6d}" for label in TABLES)
            vacuums = sum(after[label][1] - before[label][1] for label in TABLES)
            lines.append(
                f"{config:<9} {phase:<14} {rate:7.1f} tasks/s  claim p50 {p50:6.1f} ms"
                f" p99 {p99:7.1f} ms  dead: {dead}  queue {after['queue'][2] // 1024:6d} kB"
                f"  autovacuums {vacuums}")
            print(lines[-1], flush=True)
        stop.set()
        for thread in threads:
            thread.join()
    return lines


SIZED = {"runs": "flowlane.runs", "step_states": "flowlane.step_states",
         "step_tasks": "flowlane.step_tasks", "archive": f"pgmq.a_{FLOW}"}


def prune(dsn: str, older_than: int, stop: threading.Event, pruned: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.wait(1.0):  # a maintenance tick's pace
            while True:
                row = conn.execute(b"select runs_deleted from flowlane.prune_runs(p_older_than => %s)",
                                   (older_than,)).fetchone()
                if not row or not row[0]:
                    break
                pruned.append(int(row[0]))


def sizes(conn: psycopg.Connection[Any]) -> tuple[dict[str, int], int]:
    """kB per table (with indexes and TOAST), and the runs in the table."""
    found = {label: int(conn.execute(b"select pg_total_relation_size(%s::regclass)",
                                     (table,)).fetchone()[0]) // 1024  # type: ignore[index]
             for label, table in SIZED.items()}
    return found, int(conn.execute(b"select count(*) from flowlane.runs").fetchone()[0])  # type: ignore[index]


def measure_retention(admin: str, args: argparse.Namespace) -> list[str]:
    """Sizes over time with and without pruning, sampled at the same moments of each load."""
    samples: dict[str, list[tuple[float, dict[str, int], int]]] = {}
    for label in ("kept", "pruned"):
        dsn = fresh_database(admin, "flowlane")
        stop = threading.Event()
        latencies: list[float] = []
        done: list[int] = []
        pruned: list[int] = []
        threads = [threading.Thread(target=produce, args=(dsn, args.rate, stop))]
        threads += [threading.Thread(target=claim, args=(dsn, stop, latencies, done))
                    for _ in range(args.claimers)]
        if label == "pruned":
            threads.append(threading.Thread(target=prune, args=(dsn, args.retention, stop, pruned)))
        for thread in threads:
            thread.start()
        samples[label] = []
        began = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(1, 7):
                time.sleep(max(0.0, began + i * args.phase / 6 - time.monotonic()))  # the next sample
                samples[label].append((time.monotonic() - began, *sizes(conn)))
        stop.set()
        for thread in threads:
            thread.join()
        p50, p99 = percentiles(latencies)
        print(f"{label}: {sum(done)} tasks, claim p50 {p50:.1f} ms p99 {p99:.1f} ms, "
              f"{sum(pruned)} runs pruned in {len(pruned)} batches", flush=True)
    lines = [f"{'t (s)':>6}  " + "  ".join(f"{name + ' kB kept/pruned':>28}" for name in SIZED)
             + "  runs kept/pruned"]
    for kept, pruned_ in zip(samples["kept"], samples["pruned"], strict=True):
        cells = "  ".join(f"{kept[1][name]:>13d} / {pruned_[1][name]:<12d}" for name in SIZED)
        lines.append(f"{kept[0]:6.0f}  {cells}  {kept[2]} / {pruned_[2]}")
    for line in lines:
        print(line, flush=True)
    return lines


RAW_QUEUE = "bench_bloat_raw"
ONE_STEP = "bench_noop"
SIDES = {"flowlane": f"select count(*) from flowlane.runs where flow_slug = '{ONE_STEP}'"
                     " and status = 'completed'",
         "pgmq": f"select count(*) from pgmq.a_{RAW_QUEUE}"}
WARM_UP = 15.0  # seconds of load before the window, so both sides are in their steady state


def consume_raw(dsn: str, stop: threading.Event) -> None:
    """Read and archive the raw queue's messages, as a PGMQ consumer does."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            ids = [r[0] for r in conn.execute(b"select msg_id from pgmq.read(%s, 30, 100)", (RAW_QUEUE,))]
            if not ids:
                time.sleep(0.005)  # an idle consumer polls every 5 ms
                continue
            conn.execute(b"select pgmq.archive(%s, %s::bigint[])", (RAW_QUEUE, ids))


def side_tables(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
    """side -> the tables its tasks write, those of the version measured that exist."""
    return {"flowlane": existing_tables(conn, [*ENGINE_TABLES, f"pgmq.q_{ONE_STEP}", f"pgmq.a_{ONE_STEP}"]),
            "pgmq": [f"pgmq.q_{RAW_QUEUE}", f"pgmq.a_{RAW_QUEUE}"]}


def dead_tuples(conn: psycopg.Connection[Any], tables: list[str]) -> dict[str, int]:
    conn.execute(b"select pg_stat_clear_snapshot()")
    rows = conn.execute(b"select relid::regclass::text, n_dead_tup from pg_stat_user_tables"
                        b" where relid = any (%s::regclass[])", (tables,)).fetchall()
    return {name: int(dead) for name, dead in rows}


def completed(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {side: int(conn.execute(sql.encode()).fetchone()[0]) for side, sql in SIDES.items()}  # type: ignore[index]


def versus_pgmq(
    admin: str, case: str, args: argparse.Namespace
) -> dict[str, tuple[int, int, int, dict[str, int]]]:
    """side -> (completed in the window, dead tuples at its start, their peak in it, each
    table's at the peak) of one case."""
    dsn = fresh_database(admin, "flowlane")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(b"select pgmq.create(%s)", (RAW_QUEUE,))
        tables = side_tables(conn)
    stop = threading.Event()
    share = args.rate / args.producers
    threads = [threading.Thread(target=produce, args=(dsn, share, stop, statement, name))
               for statement, name in ((START, ONE_STEP), (SEND, RAW_QUEUE)) for _ in range(args.producers)]
    threads.append(threading.Thread(target=consume_raw, args=(dsn, stop)))
    pool = Workers(dsn, 1, flow=ONE_STEP)
    peaks: dict[str, tuple[int, dict[str, int]]] = {side: (0, {}) for side in tables}
    try:
        for thread in threads:
            thread.start()
        with psycopg.connect(dsn, autocommit=True) as stats, psycopg.connect(dsn) as holder:
            time.sleep(WARM_UP)  # the warm-up's length
            if case == "snapshot held":
                holder.execute(b"set transaction isolation level repeatable read")
                holder.execute(b"select count(*) from flowlane.runs")  # idle in transaction now
            before, began = completed(stats), time.monotonic()
            at_start = {side: sum(dead_tuples(stats, names).values()) for side, names in tables.items()}
            while time.monotonic() < began + args.hold:
                time.sleep(1.0)  # one sample a second
                for side, names in tables.items():
                    found = dead_tuples(stats, names)
                    if sum(found.values()) > peaks[side][0]:
                        peaks[side] = (sum(found.values()), found)
            after = completed(stats)
            holder.rollback()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        pool.stop()
    return {side: (after[side] - before[side], at_start[side], *peaks[side]) for side in tables}


def measure_versus_pgmq(admin: str, args: argparse.Namespace) -> list[str]:
    lines = [f"{args.rate:g} tasks/s offered to each side, a window of {args.hold:g} s after {WARM_UP:g} s"]
    for case in ("no snapshot", "snapshot held"):
        found = versus_pgmq(admin, case, args)
        per_task = {side: peak / max(1, done) for side, (done, _, peak, _) in found.items()}
        for side, (done, start, peak, tables) in found.items():
            shares = ", ".join(f"{name.split('.')[1]} {dead}" for name, dead in sorted(tables.items()))
            lines.append(f"{case:<14} {side:<9} {done:7d} done ({done / args.hold:6.1f}/s)"
                         f"  dead {start:6d} at start, peak {peak:7d}  {per_task[side]:5.2f} per task"
                         f"  ({shares})")
            print(lines[-1], flush=True)
        lines.append(f"{case:<14} flowlane / pgmq dead tuples per task: "
                     f"{per_task['flowlane'] / per_task['pgmq']:.2f}x, load average {os.getloadavg()[0]:.1f}")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="admin DSN (may CREATE DATABASE); default: embedded")
    parser.add_argument("--phase", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--rate", type=float, default=10.0, help="runs started per second")
    parser.add_argument("--claimers", type=int, default=2)
    parser.add_argument("--retention", type=int, metavar="SECONDS",
                        help="measure retention: sizes kept vs pruned at this age")
    parser.add_argument("--versus-pgmq", action="store_true",
                        help="dead tuples per task against raw PGMQ's, with and without a held snapshot")
    parser.add_argument("--hold", type=float, default=90.0, help="seconds of the --versus-pgmq window")
    parser.add_argument("--producers", type=int, default=2, help="connections per side with --versus-pgmq")
    args = parser.parse_args()
    tmp = None
    admin = args.dsn
    if admin is None:
        tmp = tempfile.mkdtemp(prefix="flowlane-bench-")
        os.chmod(tmp, 0o711)  # the server account (when run as root) must reach its data
        admin = db.EmbeddedDatabase.start_at(Path(tmp) / "pgdata")
    try:
        if args.versus_pgmq:
            lines = measure_versus_pgmq(admin, args)
        elif args.retention is not None:
            lines = measure_retention(admin, args)
        else:
            lines = [line for config in ("defaults", "flowlane") for line in measure(admin, config, args)]
    finally:
        if tmp is not None:
            db.EmbeddedDatabase.stop_at(Path(tmp) / "pgdata")
    print("\n".join(["", *lines]))


if __name__ == "__main__":
    main()
