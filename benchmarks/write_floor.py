"""A one-step task's rows written bare, against the engine's batch paths and raw PGMQ, in one run.

    PYTHONPATH=. python benchmarks/write_floor.py [--tasks 2000] [--batch 50] [--rounds 4]

One embedded PostgreSQL, four databases migrated to head, each drained by one connection in
batches of --batch; the backend's CPU from /proc/<pid>/schedstat. The databases take turns by
rounds, each round starting with the next one; a first round warms them up unmeasured.

  engine       --tasks one-step runs (start_flows, not measured), drained by claim_tasks +
               complete_tasks as a worker drives them
  bare         the same runs; the rows their tasks change written by plain statements, in the
               same two transactions per batch (write_floor.sql): pgmq.read and the tasks
               started; then the tasks completed, pgmq.archive, the step states and the runs
               completed, with the settings the engine's functions run with (enable_seqscan
               and jit off). No fencing, locks, classification, run input, successors or
               returned rows: what the tables' writes cost (indexes, row rules, triggers)
  bare, no triggers   the same with session_replication_role = replica: the tables'
               triggers (leases, flow control's, the run-finished notification) and foreign
               keys off
  raw          PGMQ: --tasks messages (send_batch, not measured), read + archive

Printed: CPU µs per task (medians over rounds), each against the engine, and for the bare
drains each statement's part. The gap between engine and bare is what the engine's logic
adds; bare against raw is what the schema's rows cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import uuid
from collections import defaultdict
from pathlib import Path
from typing import LiteralString

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    Driver,
    Q,
    backend_cpu_ns,
    define,
    load_queries,
    migrated_database,
    statements_server,
)

BARE = load_queries(Path(__file__).with_suffix(".sql"))
KINDS = ("engine", "bare", "bare, no triggers", "raw")


class Timed:
    """Statements on one connection, the backend's CPU (ns) of each summed by name."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.pid = conn.info.backend_pid
        self.spent: dict[str, int] = defaultdict(int)

    def run(self, name: str, query: LiteralString, **params: object) -> list[tuple[object, ...]]:
        before = backend_cpu_ns(self.pid)
        cur = self.conn.execute(query, params)
        rows = cur.fetchall() if cur.description else []
        self.spent[name] += backend_cpu_ns(self.pid) - before
        return rows


def engine(conn: Conn, tasks: int, batch: int) -> dict[str, int]:
    driver = Driver(conn, True, batch, 0)
    driver.start("bench_one", tasks)
    pid = conn.info.backend_pid
    before = backend_cpu_ns(pid)
    assert driver.drive("bench_one") == tasks
    return {"total": backend_cpu_ns(pid) - before}


def bare(conn: Conn, tasks: int, batch: int, triggers: bool) -> dict[str, int]:
    Driver(conn, True, batch, 0).start("bench_one", tasks)
    conn.execute(b"set session_replication_role = " + (b"origin" if triggers else b"replica"))
    # the settings the engine's functions run with, which the triggers they fire inherit
    conn.execute(b"set enable_seqscan = off; set jit = off")
    timed, worker, done = Timed(conn), uuid.uuid4(), 0
    while True:
        with conn.transaction():
            msg_ids = [r[0] for r in timed.run("read", BARE["read"], qty=batch)]
            if not msg_ids:
                break
            rows = timed.run("task started", BARE["task_started"], worker_id=worker, msg_ids=msg_ids)
        runs = [r[0] for r in rows]
        with conn.transaction():
            timed.run("task completed", BARE["task_completed"], runs=runs)
            timed.run("archive", BARE["archive"], msg_ids=msg_ids)
            timed.run("step completed", BARE["step_completed"], runs=runs)
            timed.run("run completed", BARE["run_completed"], runs=runs)
        done += len(runs)
    conn.execute(b"reset session_replication_role; reset enable_seqscan; reset jit")
    assert done == tasks
    return {**timed.spent, "total": sum(timed.spent.values())}


def raw(conn: Conn, tasks: int, batch: int) -> dict[str, int]:
    for offset in range(0, tasks, 500):
        bodies = [json.dumps({"i": i}) for i in range(offset, min(tasks, offset + 500))]
        conn.execute(Q["send_batch"], {"queue": "bench_raw", "bodies": bodies})
    timed = Timed(conn)
    while msg_ids := [r[0] for r in timed.run("read", Q["read"], queue="bench_raw", qty=batch)]:
        timed.run("archive", Q["archive_batch"], queue="bench_raw", msg_ids=msg_ids)
    return {**timed.spent, "total": sum(timed.spent.values())}


def drain(kind: str, conn: Conn, tasks: int, batch: int) -> dict[str, int]:
    if kind == "engine":
        return engine(conn, tasks, batch)
    if kind == "raw":
        return raw(conn, tasks, batch)
    return bare(conn, tasks, batch, triggers=kind == "bare")


def report(spent: dict[str, list[dict[str, int]]], tasks: int) -> None:
    med = {k: statistics.median(r["total"] for r in rounds) / tasks / 1000 for k, rounds in spent.items()}
    for kind in KINDS:
        print(f"  {kind:<18} {med[kind]:7.1f} µs/task   {med[kind] / med['engine']:5.2f} of engine")
        if kind.startswith("bare"):
            parts = [name for name in spent[kind][0] if name != "total"]
            for name in parts:
                part = statistics.median(r[name] for r in spent[kind]) / tasks / 1000
                print(f"      {name:<16} {part:7.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="one-step tasks per drain")
    parser.add_argument("--batch", type=int, default=50, help="tasks per claim and completion")
    parser.add_argument("--rounds", type=int, default=4, help="measured rounds")
    args = parser.parse_args()
    spent: dict[str, list[dict[str, int]]] = {kind: [] for kind in KINDS}
    with statements_server("flowlane-floor-") as admin:
        conns = {kind: migrated_database(admin, f"floor_{i}", None) for i, kind in enumerate(KINDS)}
        try:
            for conn in conns.values():
                define(conn)
            for r in range(args.rounds + 1):
                for kind in KINDS[r % 4 :] + KINDS[: r % 4]:
                    cpu = drain(kind, conns[kind], args.tasks, args.batch)
                    if r:  # round 0 warms caches and plans
                        spent[kind].append(cpu)
        finally:
            for conn in conns.values():
                conn.close()
    print(f"one-step tasks drained in batches of {args.batch}, {args.tasks} per drain, "
          f"medians of {args.rounds} rounds; backend CPU")
    report(spent, args.tasks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
