"""What flow control costs a draining worker: one worker draining one-step runs of a flow with
a concurrency key over as many distinct keys as runs, and of a queue with a rate limit far
above the drain rate, against the same drain without limits, in one run.

    PYTHONPATH=. python benchmarks/flow_control.py [--tasks 10000] [--rounds 3] [--dsn DSN]

Each cell drains on a new database cloned from one template (migrated to head, the benchmark
flows applied): `bench_noop` (one step, a no-op handler) as compiled ("plain"), with
`create_flow(..., concurrency_limit => 1, concurrency_key => '/i')` and inputs {"i": 0..N-1}
("keyed": every run starts at once, but each start takes its key's lock and counts the
key's started runs, and each end looks for a held run to begin), or with
`set_queue_limits('bench_noop', null, 1000000, 1)` ("rate limited": every claim locks the
queue's limits row and takes tokens). One worker process (`flowlane worker`, default
options) starts on the empty queue; the backlog is committed in one transaction and the drain
is timed in the database, from that commit to the last completion. Cells interleave in
--rounds rounds with a rotating order; each figure is the median of its rounds, and each
ratio is against the plain drain of the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.worker_throughput import (
    REPO,
    ServerCpu,
    Workers,
    admin_server,
    fresh_database,
    start_runs,
    template_database,
    wait_drained,
)

CELLS = {
    "plain": (),
    "keyed": (("select flowlane.create_flow('bench_noop', timeout => 30, "
               "base_delay => 0, concurrency_limit => 1, concurrency_key => '/i')"),),
    "rate limited": ("select flowlane.set_queue_limits('bench_noop', null, 1000000, 1)",),
}


def drain(
    admin: str, template: str, n: int, setup: tuple[str, ...], cpu: ServerCpu
) -> tuple[float, float | None]:
    """(tasks/s, server CPU ms per task) of one worker draining n runs committed at once."""
    with fresh_database(admin, template) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in setup:
                conn.execute(statement.encode())
        pool = Workers(dsn, 1, repo=REPO, flow="bench_noop")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                with conn.transaction():
                    start_runs(conn, n, 500, "bench_noop")
                mark: Any = conn.execute(b"select clock_timestamp()").fetchone()
                cpu0 = cpu.seconds()
                wait_drained(conn)
                cpu1 = cpu.seconds()
                row: Any = conn.execute(
                    b"select extract(epoch from max(completed_at) - %s), "
                    b"count(*) filter (where status = 'completed') from flowlane.runs",
                    (mark[0],)).fetchone()
                assert row[1] == n, f"{row[1]} of {n} runs completed"
        finally:
            pool.stop()
    per_task = None if cpu0 is None or cpu1 is None else 1000 * (cpu1 - cpu0) / n
    return n / float(row[0]), per_task


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", help="a server whose user may create databases (default: embedded)")
    args = parser.parse_args()
    names = list(CELLS)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    with admin_server(args.dsn, "flowlane-bench-flow-control-") as (admin, pgdata):
        cpu = ServerCpu(pgdata)
        template = template_database(admin, REPO)
        for round_ in range(args.rounds):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                rate, per_task = drain(admin, template, args.tasks, CELLS[name], cpu)
                rates[name].append(rate)
                if per_task is not None:
                    cpus[name].append(per_task)
                print(f"round {round_ + 1} {name:<13} {rate:8.0f} tasks/s", flush=True)
    base = statistics.median(rates["plain"])
    print(f"\n{args.tasks} one-step runs, 1 worker, {args.rounds} rounds (medians)")
    print(f"{'cell':<14} {'tasks/s':>8} {'x plain':>8} {'server CPU ms/task':>19}")
    for name in names:
        rate = statistics.median(rates[name])
        cpu_ms = f"{statistics.median(cpus[name]):.3f}" if cpus[name] else "n/a"
        print(f"{name:<14} {rate:>8.0f} {rate / base:>8.2f} {cpu_ms:>19}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at {time.strftime('%H:%M:%S')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
