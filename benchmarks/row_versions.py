"""Rows and row versions a one-step task writes, table by table, against raw PGMQ's message.

    PYTHONPATH=. python benchmarks/row_versions.py [--runs 1000] [--batch 50] [--before DIR]

What it measures: how many rows a one-step run writes over its whole life (its start, its
claim, its completion), per table, counted by the server's own statistics, next to raw
PGMQ moving one message on the same database. One embedded PostgreSQL, database `after`
migrated to head by this checkout; with --before DIR (an older checkout, e.g. `git
archive REV | tar -x -C DIR`) a database `before` migrated by DIR's migrations is counted
beside it with the same calls. Every call is its own autocommit transaction on one
connection. Workloads, each --runs runs (or messages):

  batched      start_flow per run, then drained as `flowlane worker` drains: claim_tasks of
               --batch, one complete_tasks per claimed batch
  together     batched, the runs started by start_flows of --batch inputs per call (as a
               batch of starts, a trigger's or a webhook's, starts them)
  archive off  batched, on this checkout, with the queue's archive turned off (`archive:
               false` in its `kind: queue` document: its ended messages are deleted)
  per-item     start_flow per run, then pgmq.read of --batch + start_tasks, and one
               complete_task per task (the single calls)
  raw single   pgmq.send one message, read it, archive it
  raw batched  pgmq.send_batch of --batch, read --batch, archive the array

Counted from pg_stat_user_tables around each workload (the backend's counters flushed
with pg_stat_force_next_flush, the snapshot cleared): rows inserted, updated (of which HOT:
no index entry written) and deleted, per table and per task. "row versions" is inserts +
updates + deletes: each writes a tuple (a delete its xmax), and each is WAL, dead rows for
vacuum, and contention for whatever else touches the row. The queue tables are named by
their kind (pgmq.q_<queue>, pgmq.a_<queue>) so that the engine's and raw PGMQ's line up.

How to read it: these are counts, not timings: they do not drift with the machine. The
"row versions" line is the figure to compare between versions; "/ raw single" divides it
by raw PGMQ's per message. A cell reads inserts/updates(HOT)/deletes per task.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    Driver,
    Q,
    before_and_after,
    define,
    raw_batched,
    raw_single,
    scalar,
    statements_server,
)

FLOW = "bench_one"
COUNTS = ("ins", "upd", "hot", "del")
TABLE_COUNTS = b"""
select schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
from pg_stat_user_tables
"""

Counts = dict[str, tuple[int, ...]]


def table_counts(conn: Conn) -> Counts:
    """Every table's cumulative (inserted, updated, HOT updated, deleted), this backend's flushed."""
    conn.execute(Q["stats_flush"])  # the flush happens as this statement's transaction ends
    conn.execute(b"select pg_stat_clear_snapshot()")
    counts: Counts = {}
    for name, *row in conn.execute(TABLE_COUNTS):
        kind = queue_kind(name)  # the queues' tables summed by kind: only the workload's move
        counts[kind] = tuple(a + int(b) for a, b in zip(counts.get(kind, (0, 0, 0, 0)), row, strict=True))
    return counts


def queue_kind(table: str) -> str:
    """pgmq.q_bench_one -> pgmq.q_<queue>: the engine's queue and raw PGMQ's line up."""
    return re.sub(r"^pgmq\.([qa])_.*$", r"pgmq.\1_<queue>", table)


def counted(conn: Conn, work: Callable[[], int]) -> dict[str, tuple[float, ...]]:
    """Per table with any write, its counts per task of ``work`` (which returns its tasks)."""
    before = table_counts(conn)
    tasks = work()
    after = table_counts(conn)
    deltas = {}
    for table, now in after.items():
        delta = tuple(n - b for n, b in zip(now, before.get(table, (0, 0, 0, 0)), strict=True))
        if any(delta):
            deltas[table] = tuple(d / tasks for d in delta)
    return deltas


def engine_work(conn: Conn, driver: Driver, runs: int, together: int = 0) -> Callable[[], int]:
    """``runs`` started by start_flow each, or by start_flows of ``together`` inputs, then drained."""

    def work() -> int:
        if together:
            for offset in range(0, runs, together):
                inputs = [json.dumps({"i": i}) for i in range(offset, min(runs, offset + together))]
                conn.execute(Q["start_flows"], {"flow": FLOW, "inputs": inputs})
        else:
            for i in range(runs):
                conn.execute(Q["start_flow"], {"flow": FLOW, "input": Jsonb({"i": i})})
        tasks = driver.drive(FLOW)
        if unfinished := scalar(conn, "unfinished_runs", flow=FLOW):
            raise SystemExit(f"{unfinished} runs did not complete")
        return tasks

    return work


def measure(conns: dict[str, Conn], runs: int, batch: int) -> dict[str, dict[str, tuple[float, ...]]]:
    columns: dict[str, dict[str, tuple[float, ...]]] = {}
    for version, conn in conns.items():
        define(conn)
        for mode, set_based in (("batched", True), ("per-item", False)):
            driver = Driver(conn, set_based, batch, 0)
            columns[f"{version} {mode}"] = counted(conn, engine_work(conn, driver, runs))
        together = engine_work(conn, Driver(conn, True, batch, 0), runs, batch)
        columns[f"{version} together"] = counted(conn, together)
    conn = conns["after"]
    conn.execute(Q["set_archive"], {"queue": FLOW, "archive": False})
    columns["after archive off"] = counted(conn, engine_work(conn, Driver(conn, True, batch, 0), runs))
    conn.execute(Q["set_archive"], {"queue": FLOW, "archive": True})
    for name, raw in (("raw single", raw_single), ("raw batched", raw_batched)):

        def messages(raw: Callable[[Conn, int, int], tuple[float, int]] = raw) -> int:
            return raw(conn, runs, batch)[1]

        columns[name] = counted(conn, messages)
    return columns


def versions(counts: tuple[float, ...]) -> float:
    ins, upd, _, dele = counts
    return ins + upd + dele


def cell(counts: tuple[float, ...] | None) -> str:
    if counts is None:
        return "-"
    ins, upd, hot, dele = (f"{c:.2f}".rstrip("0").rstrip(".") for c in counts)
    return f"{ins}/{upd}({hot})/{dele}"


def report(columns: dict[str, dict[str, tuple[float, ...]]]) -> list[str]:
    tables = sorted({t for counts in columns.values() for t in counts})
    width = max(len(t) for t in [*tables, "row versions / raw single"])
    lines = [f"{'per task':<{width}} " + " ".join(f"{name:>18}" for name in columns)]
    lines += [f"{t:<{width}} " + " ".join(f"{cell(c.get(t)):>18}" for c in columns.values()) for t in tables]
    totals = {name: sum(versions(c) for c in counts.values()) for name, counts in columns.items()}
    lines.append(f"{'row versions':<{width}} " + " ".join(f"{v:>18.2f}" for v in totals.values()))
    raw = totals["raw single"]
    lines.append(f"{'row versions / raw single':<{width}} "
                 + " ".join(f"{v / raw:>18.2f}" for v in totals.values()))
    non_hot = {name: sum(c[1] - c[2] for c in counts.values()) for name, counts in columns.items()}
    lines.append(f"{'non-HOT updates':<{width}} " + " ".join(f"{v:>18.2f}" for v in non_hot.values()))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="one-step runs (raw: messages) per workload")
    parser.add_argument("--batch", type=int, default=50, help="messages per read / claim")
    parser.add_argument("--before", type=Path, help="an older checkout to count beside this one")
    args = parser.parse_args()
    with statements_server("flowlane-rows-") as admin, before_and_after(admin, "rows", args.before) as conns:
        print(f"{args.runs} one-step runs per workload, batch {args.batch}; "
              "cells: inserts/updates(HOT)/deletes per task\n")
        for line in report(measure(conns, args.runs, args.batch)):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
