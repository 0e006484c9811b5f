"""Runs started by a `kind: trigger` against the other ways to start the same runs, in one run.

    PYTHONPATH=. python benchmarks/trigger_start.py [--rows 10000] [--rounds 3]

What it measures: the server's cost of one INSERT ... SELECT of --rows rows into an
application's table, without a trigger and with a flowlane trigger on it that starts one run of
a one-step flow per row (input {"id": <row id>}), against starting the same runs with --rows
start_flow calls (one transaction, pipelined) and with one batched start_flows call. One
embedded PostgreSQL, one database migrated to head by this checkout. Each case runs in a
transaction that is rolled back and followed by a VACUUM, so every case starts from the same
tables; the cases take turns within a round, in a rotating order, and --rounds rounds are
taken.

Printed per case (medians over the rounds): the backend's CPU (/proc/<pid>/schedstat) and the
wall time of the statement(s), in ms, and per run in µs. The trigger's own cost is the insert
with the trigger minus the insert without; the last line divides it by batched start_flows'
cost per run (the trigger path is meant to be at most 1.0x of it).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import Conn, backend_cpu_ns, migrated_database, statements_server

FLOW = "bench_trigger_flow"


def setup(conn: Conn) -> None:
    conn.execute("select flowlane.create_flow(%s)", (FLOW,))
    conn.execute("select flowlane.add_step(%s, 's0')", (FLOW,))
    for table in ("bench_plain", "bench_orders"):
        conn.execute(f"create table public.{table} (id int primary key, total int not null)".encode())
    conn.execute("select flowlane.set_trigger('bench_order', %s, 'public.bench_orders', array['insert'], "
                 "input_map => %s)", (FLOW, Jsonb({"id": "/new/id"})))


def insert(table: str, rows: int) -> Callable[[Conn], None]:
    def run(conn: Conn) -> None:
        conn.execute(f"insert into public.{table} select i, i from generate_series(1, {rows}) i".encode())
    return run


def start_flow_calls(rows: int) -> Callable[[Conn], None]:
    def run(conn: Conn) -> None:
        with conn.cursor() as cur:
            cur.executemany("select flowlane.start_flow(%s, %s)",
                            [(FLOW, Jsonb({"id": i})) for i in range(rows)])
    return run


def start_flows_batch(rows: int) -> Callable[[Conn], None]:
    def run(conn: Conn) -> None:
        conn.execute("select count(*) from flowlane.start_flows(%s, %s::jsonb[])",
                     (FLOW, [Jsonb({"id": i}) for i in range(rows)]))
    return run


def measure(conn: Conn, work: Callable[[Conn], None], rows: int) -> tuple[float, float]:
    """CPU ms and wall ms of ``work`` in a transaction that is rolled back; checks it started
    ``rows`` runs (none for the plain insert)."""
    pid = conn.info.backend_pid
    with conn.transaction(force_rollback=True):
        cpu, wall = backend_cpu_ns(pid), time.perf_counter()
        work(conn)
        wall, cpu = time.perf_counter() - wall, backend_cpu_ns(pid) - cpu
        started = conn.execute("select count(*) from flowlane.runs").fetchone()
        assert started is not None and started[0] in (0, rows), started
    conn.execute("vacuum")  # the rolled-back rows, which would slow the next case
    return cpu / 1e6, wall * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the server on the way out
    cases = {
        "insert, no trigger": insert("bench_plain", args.rows),
        "insert, trigger": insert("bench_orders", args.rows),
        "start_flow calls": start_flow_calls(args.rows),
        "start_flows batch": start_flows_batch(args.rows),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    with statements_server("flowlane-bench-trigger-") as admin:
        conn = migrated_database(admin, "bench_trigger")
        setup(conn)
        for work in cases.values():  # warm the caches and the plans once
            measure(conn, work, args.rows)
        names = list(cases)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                results[name].append(measure(conn, cases[name], args.rows))
        conn.close()
    cpu = {name: statistics.median(c for c, _ in found) for name, found in results.items()}
    wall = {name: statistics.median(w for _, w in found) for name, found in results.items()}
    print(f"{args.rows} rows or runs, medians of {args.rounds} rounds")
    print(f"{'case':<22}{'cpu ms':>10}{'wall ms':>10}{'cpu µs/run':>12}")
    for name in cases:
        print(f"{name:<22}{cpu[name]:>10.1f}{wall[name]:>10.1f}{cpu[name] * 1e3 / args.rows:>12.1f}")
    trigger = cpu["insert, trigger"] - cpu["insert, no trigger"]
    batch = cpu["start_flows batch"]
    print(f"{'trigger (difference)':<22}{trigger:>10.1f}"
          f"{wall['insert, trigger'] - wall['insert, no trigger']:>10.1f}{trigger * 1e3 / args.rows:>12.1f}")
    print(f"trigger per run / start_flows per run: {trigger / batch:.2f}x; "
          f"/ start_flow calls per run: {trigger / cpu['start_flow calls']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
