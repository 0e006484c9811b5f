"""A start, a claim and a completion with a long history retained, against an empty database.

    PYTHONPATH=. python benchmarks/history_growth.py [--runs 1000000] [--calls 200] [--rounds 5]

What it measures: that the calls on the hot path cost what their own work costs, however
many finished runs the database keeps. One embedded PostgreSQL, two databases migrated to
head with the same flows: `empty`, and `loaded`, which gets --runs finished one-step runs
of the flow the calls use (the issue's figure is --runs 10000000). The history is loaded
set-based, INSERT ... SELECT over generate_series, as copies of one real run the engine
started, claimed and completed (benchmarks/history_growth.sql): its run, step state, task
and archived message, with run id, input, message id and times changed, so every row is
one the engine could have written (foreign keys and triggers are off during the load
only: the copies satisfy them by construction). Both databases are then vacuumed and
analyzed, as autovacuum would have left them.

Calls, each its own autocommit transaction on one connection per database (the backends
pinned to one CPU, the client to the other):

  start one      start_flow of the one-step flow
  claim one      a worker's claim (its query, claim_tasks) of one queued task
  complete one   complete_task of a claimed one-step task (its run completes, its message
                 is archived)

Each case runs in turns of 50 calls, on one database then the other (the order alternating
by round), in --rounds rounds; the backend's CPU (/proc/<pid>/schedstat) and the wall time
are read around each turn. Printed: the loading time, the sizes of the tables and their
indexes after loading, and per case the medians over the rounds of CPU and wall time per
call on each database, and of loaded / empty per round.

How to read it: the loaded / empty ratios are the figures (1.00 is flat; the target is
within 10 %). A turn of 50 calls of about a millisecond each moves by 5-10 % with the
machine's load, which is why the ratio is taken per round, side by side, and its median
reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    backend_cpu_ns,
    load_queries,
    migrated_database,
    pin_backends,
    scalar,
    statements_server,
)
from benchmarks.single_call_profile import CHUNK, Case

Q = load_queries(Path(__file__).with_suffix(".sql"))
CASES = ("start one", "claim one", "complete one")
DATABASES = ("empty", "loaded")
LOAD_CHUNK = 250_000
MB = 1024 * 1024


class HistoryCase(Case):
    """single_call_profile's calls, and the completion of a claimed one-step task."""

    def prepare(self, name: str, n: int) -> list[Any]:
        if name == "complete one":
            return super().prepare("fail retry", n)  # claimed one-step tasks, as a failure takes
        return super().prepare(name, n)

    def call(self, name: str, item: Any) -> None:
        if name != "complete one":
            super().call(name, item)
            return
        run_id, step, index, attempt = item
        self.conn.execute(
            b"select status from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
            (run_id, step, index, Jsonb({"ok": True}), self.worker, attempt),
        )


def finish_one_run(case: HistoryCase) -> tuple[Any, int]:
    """The template: a one-step run started, claimed and completed by the engine."""
    [claimed] = case.prepare("complete one", 1)
    case.call("complete one", claimed)
    row = case.conn.execute(Q["template"]).fetchone()
    assert row is not None
    return row[0], int(row[1])


def load_history(conn: Conn, case: HistoryCase, runs: int) -> float:
    """``runs`` finished runs copied from a real one; the seconds it took."""
    template, message_id = finish_one_run(case)
    began = time.perf_counter()
    conn.execute(b"set session_replication_role = replica")  # no foreign key checks, no triggers
    for lo in range(1, runs + 1, LOAD_CHUNK):
        params = {"lo": lo, "hi": min(runs, lo + LOAD_CHUNK - 1), "runs": runs,
                  "template": template, "message_id": message_id}
        with conn.transaction():
            for table in ("runs", "step_states", "step_tasks", "archive"):
                conn.execute(Q[f"load_{table}"], params)
        print(f"  loaded {params['hi']:,} runs ({time.perf_counter() - began:.0f} s)", flush=True)
    conn.execute(b"set session_replication_role = origin")
    conn.execute(Q["advance_messages"], {"last": message_id + runs})
    conn.execute(b"vacuum analyze")
    return time.perf_counter() - began


def print_sizes(conn: Conn) -> None:
    print(f"\n{'table':<22} {'rows (est.)':>11} {'table MB':>9} {'indexes MB':>10} {'total MB':>9}")
    for name, rows, table, indexes, total in conn.execute(Q["sizes"]):
        print(f"{name:<22} {rows:>11,} {table / MB:>9.1f} {indexes / MB:>10.1f} {total / MB:>9.1f}")
    indexes = conn.execute(Q["index_sizes"]).fetchall()
    print("indexes over 1 MB:", ", ".join(f"{name} {size / MB:.1f}" for name, size in indexes if size > MB))


def turn(case: HistoryCase, name: str, items: list[Any]) -> tuple[float, float]:
    """CPU seconds and wall seconds of the calls of one turn."""
    pid = scalar(case.conn, "backend_pid")
    cpu0, start = backend_cpu_ns(pid), time.perf_counter()
    for item in items:
        case.call(name, item)
    return (backend_cpu_ns(pid) - cpu0) / 1e9, time.perf_counter() - start


Found = dict[tuple[str, str, str], list[float]]


def measure(cases: dict[str, HistoryCase], calls: int, rounds: int) -> Found:
    """Per (case, database, 'cpu' or 'wall'): µs per call, one figure per round."""
    found: Found = {}
    for r in range(rounds):
        order = DATABASES if r % 2 == 0 else DATABASES[::-1]
        for name in CASES:
            items = {db: cases[db].prepare(name, calls) for db in DATABASES}
            cpu = dict.fromkeys(DATABASES, 0.0)
            wall = dict.fromkeys(DATABASES, 0.0)
            for first in range(0, calls, CHUNK):
                for db in order:
                    c, w = turn(cases[db], name, items[db][first:first + CHUNK])
                    cpu[db] += c
                    wall[db] += w
            for db in DATABASES:
                found.setdefault((name, db, "cpu"), []).append(1e6 * cpu[db] / calls)
                found.setdefault((name, db, "wall"), []).append(1e6 * wall[db] / calls)
    return found


def report(found: Found) -> list[str]:
    lines = [(f"{'case':<13} {'cpu µs empty':>12} {'cpu µs loaded':>13} {'cpu loaded/empty':>16}"
              f" {'wall µs empty':>13} {'wall µs loaded':>14} {'wall loaded/empty':>17}")]
    for name in CASES:
        cells = []
        for measure_ in ("cpu", "wall"):
            empty, loaded = found[(name, "empty", measure_)], found[(name, "loaded", measure_)]
            ratio = statistics.median(b / a for a, b in zip(empty, loaded, strict=True))
            medians = statistics.median(empty), statistics.median(loaded)
            cells.append(f"{medians[0]:>12.0f} {medians[1]:>13.0f} {ratio:>16.2f}")
        lines.append(f"{name:<13} {cells[0]} {cells[1]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="finished runs in the loaded database")
    parser.add_argument("--calls", type=int, default=200, help="calls per case, database and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (medians)")
    args = parser.parse_args()
    with statements_server("flowlane-history-") as admin:
        conns = {db: migrated_database(admin, f"history_{db}") for db in DATABASES}
        try:
            cases = {db: HistoryCase(conn) for db, conn in conns.items()}
            for case in cases.values():
                case.define()
            print(f"loading {args.runs:,} finished one-step runs", flush=True)
            seconds = load_history(conns["loaded"], cases["loaded"], args.runs)
            finish_one_run(cases["empty"])
            conns["empty"].execute(b"vacuum analyze")
            print(f"loaded and vacuumed in {seconds:.0f} s")
            print_sizes(conns["loaded"])
            pin_backends(conns.values())
            for case in cases.values():  # warm-up: plans and caches made outside the measurement
                for name in CASES:
                    for item in case.prepare(name, 20):
                        case.call(name, item)
            print(f"\n{args.calls} calls per case, database and round, {args.rounds} rounds, medians")
            for line in report(measure(cases, args.calls, args.rounds)):
                print(line)
        finally:
            for conn in conns.values():
                conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
