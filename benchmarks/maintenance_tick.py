"""The maintenance tick: its cost when no schedule is due, and firing many due slots at once.

    PYTHONPATH=. python benchmarks/maintenance_tick.py [--schedules 10000] [--due 1000] [--calls 300]

What it measures: that the tick every worker runs each second costs the same however many
schedules exist (only due ones cost anything), and that firing due slots costs about what
starting the same runs costs. On one embedded PostgreSQL, a fresh database with a one-step
flow. Measured in the same run:

- the tick on a database with no schedule against one with --schedules schedules of which
  none is due (median of --calls calls each, alternating between the two databases; the
  ratio is the price of the schedules), and the
  plan of the tick's probe for due schedules (an index scan on next_slot);
- firing --due due slots (--due schedules due at once, overlap allow) in one tick against
  start_flows of the same inputs: runs per second of each, median of 3 rounds.

How to read it: the ratio after "none due" should stay near 1 (the schedules are not read),
the probe's plan should be an index scan, and "the tick fires at ...x its rate" compares
firing with start_flows in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowlane.core import db, migrator

Conn = psycopg.Connection[Any]
ROUNDS = 3
WARM_UP = 50


def medians_ms(conns: list[Conn], statement: str, calls: int) -> list[float]:
    """The median time of ``statement`` on each connection, the calls alternating between
    them (so that the machine's load falls on both alike)."""
    for _ in range(WARM_UP):  # plans made, caches warm: what a long-running process sees
        for conn in conns:
            conn.execute(statement).fetchall()
    times: list[list[float]] = [[] for _ in conns]
    for _ in range(calls):
        for conn, taken in zip(conns, times, strict=True):
            start = time.perf_counter()
            conn.execute(statement).fetchall()
            taken.append((time.perf_counter() - start) * 1000)
    return [statistics.median(taken) for taken in times]


def fresh(admin: str, name: str) -> Conn:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"create database {name}".encode())
    conn = psycopg.connect(psycopg.conninfo.make_conninfo(admin, dbname=name), autocommit=True)
    migrator.ensure_pgmq(conn)
    migrator.migrate(conn)
    conn.execute("select flowlane.create_flow('beat')")
    conn.execute("select flowlane.add_step('beat', 'only')")
    return conn


def add_schedules(conn: Conn, count: int) -> None:
    """``count`` hourly schedules, none due (next slot an hour ahead); written directly, as
    set_schedule would write them."""
    conn.execute(
        "insert into flowlane.schedules (schedule_name, flow_name, every_seconds, input, overlap, "
        "next_slot) select 's' || i, 'beat', 3600, jsonb_build_object('i', i), 'allow', "
        "now() + interval '1 hour' from generate_series(1, %s) i", (count,))
    conn.execute("analyze flowlane.schedules")


def fire_round(conn: Conn, due: int, round_: int) -> float:
    """One tick that finds ``due`` schedules due (each round its own schedules: a fired slot
    never fires again)."""
    conn.execute("update flowlane.schedules set next_slot = now() - interval '1 second' "
                 "where schedule_name in (select 's' || i from generate_series(%s::int, %s::int) i)",
                 (round_ * due + 1, (round_ + 1) * due))
    start = time.perf_counter()
    row = conn.execute("select flowlane.maintenance_tick()").fetchone()
    seconds = time.perf_counter() - start
    assert row is not None and row[0]["fired"] == due, row
    return due / seconds


def start_flows_round(conn: Conn, due: int) -> float:
    inputs = [json.dumps({"i": i}) for i in range(due)]
    start = time.perf_counter()
    conn.execute("select count(*) from flowlane.start_flows('beat', %s::jsonb[])", (inputs,)).fetchone()
    return due / (time.perf_counter() - start)


def measure(admin: str, schedules: int, due: int, calls: int) -> dict[str, Any]:
    with fresh(admin, "tick_empty") as empty, fresh(admin, "tick_full") as conn:
        add_schedules(conn, schedules)
        idle_empty, idle_full = medians_ms([empty, conn], "select flowlane.maintenance_tick()", calls)
        plan = [r[0] for r in conn.execute(
            "explain (costs off) select * from flowlane.schedules s where s.next_slot <= now() "
            "order by s.schedule_name for update skip locked")]
        fired = statistics.median(fire_round(conn, due, k) for k in range(ROUNDS))
        started = statistics.median(start_flows_round(conn, due) for _ in range(ROUNDS))
    return {"empty": idle_empty, "idle": idle_full, "plan": plan, "fired": fired, "started": started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--due", type=int, default=1_000)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if args.due * ROUNDS > args.schedules:
        parser.error(f"--schedules must be at least {ROUNDS} x --due (each round fires its own)")
    tmp = Path(tempfile.mkdtemp(prefix="flowlane-bench-"))
    tmp.chmod(0o711)  # run as root, the server account must reach its data directory
    pgdata = tmp / "data"
    try:
        admin = db.EmbeddedDatabase.start_at(pgdata)
        r = measure(admin, args.schedules, args.due, args.calls)
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"maintenance_tick(), median of {args.calls} calls:")
    print(f"  no schedules              {r['empty']:8.3f} ms")
    print(f"  {args.schedules:>6} schedules, none due {r['idle']:8.3f} ms  ({r['idle'] / r['empty']:.2f}x)")
    print("  the probe for due schedules: " + " / ".join(line.strip() for line in r["plan"]))
    print(f"firing {args.due} due slots in one tick against start_flows of {args.due} inputs "
          f"(median of {ROUNDS} rounds):")
    print(f"  maintenance_tick   {r['fired']:10.0f} runs/s")
    print(f"  start_flows        {r['started']:10.0f} runs/s  "
          f"(the tick fires at {r['fired'] / r['started']:.2f}x its rate)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
