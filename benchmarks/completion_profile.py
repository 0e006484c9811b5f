"""Where a batched drain's backend time goes, and what a change did to it, in one run.

    PYTHONPATH=. python benchmarks/completion_profile.py [--flows bench_one,bench_three]
        [--runs 500] [--rounds 12] [--batch 50] [--top 12] [--alone] [--before DIR]

One embedded PostgreSQL (pg_stat_statements preloaded); database `after` migrated by this
checkout and, with --before (a tree of another flowlane, `git archive main | tar -x -C
DIR`), database `before` migrated by that one's. Each flow's runs are started with
start_flows (with --alone, one start_flow per run: a run started alone keeps its root step's
state in its task) and drained as a worker does (claim_tasks and one complete_tasks per batch of
--batch), one connection per database, the backends pinned together on one CPU.

Timed: --rounds interleaved rounds of --runs runs, the versions alternating so that the
machine's load falls on both alike; the backend's CPU time per task of each drain (from
/proc/<pid>/schedstat), median and minimum over the rounds, and after over before of
each. Counted, in a separate pass (pg_stat_statements.track = 'all'): the statements the
server executed per task, nested ones included, and, for `after`, the --top statements by
their total time per task (a statement's time includes the statements it runs).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from benchmarks.engine_throughput import (
    FLOWS,
    Driver,
    Q,
    backend_cpu_ns,
    before_and_after,
    count_statements,
    define,
    pin_backends,
    statements_server,
)

TOP = (
    "select total_exec_time, calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)"
    " from pg_stat_statements"
    " where dbid = (select oid from pg_database where datname = current_database())"
    " and query not like '%%pg_stat_statements%%' order by 1 desc limit %s"
)


def start(driver: Driver, flow: str, runs: int, alone: bool) -> None:
    """Start ``runs`` runs: with one start_flows per 500, or alone, one start_flow each."""
    if not alone:
        driver.start(flow, runs)
        return
    for i in range(runs):
        driver.conn.execute(Q["start_flow"], {"flow": flow, "input": Jsonb({"i": i})})


def tracked_pass(driver: Driver, flow: str, runs: int, top: int,
                 alone: bool) -> tuple[float, list[tuple[Any, ...]]]:
    """Statements per task of one drain, and its top statements (ms total, calls, text)."""
    start(driver, flow, runs, alone)
    tasks: list[int] = []

    def drain() -> int:
        tasks.append(driver.drive(flow))
        return tasks[0]

    per_task = count_statements(driver.conn, drain)
    rows = driver.conn.execute(TOP, (top,)).fetchall()
    return per_task, [(float(t) * 1000 / tasks[0], c, q) for t, c, q in rows]


def timed_rounds(drivers: dict[str, Driver], flow: str, runs: int, rounds: int,
                 alone: bool) -> dict[str, list[float]]:
    """Backend CPU µs per task of each version's drain, round by round."""
    taken: dict[str, list[float]] = {version: [] for version in drivers}
    for _ in range(rounds):
        for version, driver in drivers.items():
            start(driver, flow, runs, alone)
            pid = driver.conn.info.backend_pid
            before = backend_cpu_ns(pid)
            tasks = driver.drive(flow)
            taken[version].append((backend_cpu_ns(pid) - before) / 1000 / tasks)
    return taken


def report(flow: str, taken: dict[str, list[float]], counted: dict[str, float]) -> None:
    print(f"\n{flow}: backend CPU µs per task (median, min over the rounds), statements per task")
    for version, values in taken.items():
        print(f"  {version:7s} {statistics.median(values):7.1f} {min(values):7.1f}   {counted[version]:6.2f}")
    if "before" in taken:
        b, a = taken["before"], taken["after"]
        print(f"  after/before: median {statistics.median(a) / statistics.median(b):.2f}x, "
              f"min {min(a) / min(b):.2f}x, statements {counted['after'] / counted['before']:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", default="bench_one,bench_three", help=f"of {', '.join(FLOWS)}")
    parser.add_argument("--runs", type=int, default=500, help="runs per flow, round and version")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch", type=int, default=50, help="tasks per claim and per complete_tasks")
    parser.add_argument("--top", type=int, default=12, help="statements listed (after)")
    parser.add_argument("--alone", action="store_true", help="start each run with its own start_flow")
    parser.add_argument("--before", type=Path, help="a tree of the flowlane to compare with")
    args = parser.parse_args()
    with statements_server("flowlane-completion-") as admin, \
            before_and_after(admin, "completion", args.before) as conns:
        drivers = {}
        for version, conn in conns.items():
            define(conn)
            conn.execute("set pg_stat_statements.track = 'none'")
            drivers[version] = Driver(conn, True, args.batch, 10)
        pin_backends(conns.values())
        for flow in args.flows.split(","):
            for driver in drivers.values():  # warm: plans made, caches filled
                start(driver, flow, 200, args.alone)
                driver.drive(flow)
            taken = timed_rounds(drivers, flow, args.runs, args.rounds, args.alone)
            counted: dict[str, float] = {}
            top: list[tuple[Any, ...]] = []
            for version, driver in drivers.items():
                counted[version], listed = tracked_pass(driver, flow, args.runs, args.top, args.alone)
                top = listed if version == "after" else top
            report(flow, taken, counted)
            print("  after, the statements with the most time (tracked, nested included):")
            for per_task, calls, text in top:
                print(f"  {per_task:7.1f} µs/task {calls:6d} calls  {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
