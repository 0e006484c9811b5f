"""What a worker's loop costs the server per task as its batches grow, next to raw PGMQ.

    PYTHONPATH=. python benchmarks/batch_cost.py [--batches 25,50,100,200,400] [--tasks 2000] [--rounds 3]

One embedded PostgreSQL, one database at head, one connection. Each round, for every batch
size in turn (the order rotates from round to round): --tasks one-step runs are queued
(start_flows, not measured), then drained by a loop of the worker's two calls, claim_tasks
and complete_tasks, of that many tasks each, every call its own transaction; and --tasks
raw PGMQ messages are sent (not measured), then read and archived in batches of the same
size. Measured: the backend's CPU per task, and per message (/proc/<pid>/schedstat), median
of the rounds.

A claim and a completion cost a fixed part per call and a part per task, so CPU per task
is about `marginal + fixed / batch`; printed: that fit (least squares over the batch sizes)
for both, and their ratio per batch size. The marginal part is what larger batches
cannot remove: the rows a task writes and reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    Driver,
    Q,
    backend_cpu_ns,
    define,
    migrated_database,
    statements_server,
)

FLOW = "bench_one"


def engine_cpu(driver: Driver, tasks: int, batch: int) -> float:
    """µs of backend CPU per task: ``tasks`` one-step runs drained ``batch`` at a time."""
    driver.batch = batch
    driver.start(FLOW, tasks)
    pid = driver.conn.info.backend_pid
    before = backend_cpu_ns(pid)
    drained = driver.drive(FLOW)
    assert drained == tasks, f"drained {drained} of {tasks} tasks"
    return (backend_cpu_ns(pid) - before) / tasks / 1000


def raw_cpu(conn: Conn, messages: int, batch: int) -> float:
    """µs of backend CPU per message: ``messages`` read and archived ``batch`` at a time."""
    bodies = [json.dumps({"i": i}) for i in range(messages)]
    conn.execute(Q["send_batch"], {"queue": "bench_raw", "bodies": bodies})
    pid = conn.info.backend_pid
    before = backend_cpu_ns(pid)
    done = 0
    while ids := [r[0] for r in conn.execute(Q["read"], {"queue": "bench_raw", "qty": batch})]:
        conn.execute(Q["archive_batch"], {"queue": "bench_raw", "msg_ids": ids})
        done += len(ids)
    assert done == messages, f"archived {done} of {messages} messages"
    return (backend_cpu_ns(pid) - before) / messages / 1000


def fit(costs: dict[int, float]) -> tuple[float, float]:
    """(marginal µs per task, fixed µs per call pair) of ``cost = marginal + fixed / batch``."""
    xs = [1 / batch for batch in costs]
    slope, intercept = statistics.linear_regression(xs, list(costs.values()))
    return intercept, slope


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="25,50,100,200,400", help="batch sizes, comma-separated")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks (and raw messages) per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if len(batches) < 2 or min(batches) < 1 or args.rounds < 1 or args.tasks < 1:
        parser.error("--batches needs two or more sizes of at least 1; --tasks and --rounds at least 1")
    engine: dict[int, list[float]] = {b: [] for b in batches}
    raw: dict[int, list[float]] = {b: [] for b in batches}
    with (
        statements_server("flowlane-batch-cost-") as admin,
        migrated_database(admin, "batch_cost", None) as conn,
    ):
        define(conn)
        driver = Driver(conn, True, batches[0], 10)
        engine_cpu(driver, args.tasks, batches[0])  # warm-up: plans and caches
        raw_cpu(conn, args.tasks, batches[0])
        for round_ in range(args.rounds):
            shift = round_ % len(batches)
            for batch in batches[shift:] + batches[:shift]:
                engine[batch].append(engine_cpu(driver, args.tasks, batch))
                raw[batch].append(raw_cpu(conn, args.tasks, batch))
    report(medians(engine), medians(raw))
    return 0


def medians(samples: dict[int, list[float]]) -> dict[int, float]:
    return {batch: statistics.median(values) for batch, values in samples.items()}


def report(engine: dict[int, float], raw: dict[int, float]) -> None:
    print("backend CPU, µs per task (flowlane claim_tasks + complete_tasks) and per message")
    print("(raw PGMQ read + archive), medians")
    print(f"{'batch':>6} {'flowlane':>9} {'raw':>7} {'ratio':>6}")
    for batch, cost in engine.items():
        print(f"{batch:6d} {cost:9.1f} {raw[batch]:7.1f} {cost / raw[batch]:6.2f}")
    for name, costs in (("flowlane", engine), ("raw", raw)):
        marginal, fixed = fit(costs)
        print(f"{name}: about {marginal:.0f} µs per task + {fixed:.0f} µs per call pair")


if __name__ == "__main__":
    raise SystemExit(main())
