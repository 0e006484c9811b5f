"""The one-at-a-time paths against raw PGMQ: a single start, completion and failure, in one run.

    PYTHONPATH=. python benchmarks/single_call_profile.py [--calls 500] [--rounds 3] [--before DIR]
        [--functions]

What it measures: what one call of the engine costs the server when nothing batches it (a
web request, a trigger, a worker in another language), as a multiple of the PGMQ call that
moves the same message. One embedded PostgreSQL (pg_stat_statements preloaded), database
`after` migrated to head by this checkout. With --before DIR (an older checkout, e.g. `git
archive REV | tar -x -C DIR`) a database `before` migrated by DIR's migrations is measured
beside it with the same calls (the SQL functions' signatures must match). Every call is its
own autocommit transaction on one connection. Cases, each paired with its
raw PGMQ baseline:

  start one           start_flow of a one-step flow                       raw send
  start three         start_flow of a three-step chain                    raw send
  start map10         start_flow of a flow whose root step maps its input raw send
                      (10 elements)
  complete chain      complete_task of a chain's first step (enqueues     raw archive+send
                      its successor)
  fail retry          fail_task of a one-step flow's task with attempts   raw archive+send
                      left (a retry)
  claim one           a worker's claim (its query, claim_tasks) of one    raw read
                      queued one-step task

  raw send            pgmq.send of the start's payload ({"i": n})
  raw archive+send    pgmq.archive of one message and pgmq.send of one, in one transaction
  raw read            pgmq.read of one message

A case's calls take turns with its baseline's, 50 calls of one, then 50 of the other, the
backend's CPU (/proc/<pid>/schedstat, nanoseconds) read around each turn, and the ratio is
taken per round: this machine's speed drifts from one second to the next (a raw send
measured 150 or 240 µs depending on when it ran), and turns side by side drift together.
(Turns of one call measure a send whose caches the start has just taken: 2-3x slower.) The
cases run in --rounds rounds with a rotating order, the databases interleaved. Printed per
case and database (medians over the rounds): calls/s, the backend's CPU per call, the
server's execution time per call (pg_stat_statements, top level), the same two for its
baseline, and the ratios of the case to its baseline. --functions adds, per database, a
pass with track_functions = 'all': each function's own time per call of every case.

How to read it: cpu/raw and exec/raw are the figures to compare between runs (each a ratio
to its baseline measured in the same turns); the µs columns move with the machine. With
--before, the last lines give after / before per case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    backend_cpu_ns,
    before_and_after,
    pin_backends,
    scalar,
    statements_server,
)
from flowlane.core.queries import query

RAW = "bench_single_raw"
FLOWS = {
    "bench_one": [("s0", [], "single")],
    "bench_three": [("s0", [], "single"), ("s1", ["s0"], "single"), ("s2", ["s1"], "single")],
    "bench_map10": [("m", [], "map")],
}
STARTS = {"start one": "bench_one", "start three": "bench_three", "start map10": "bench_map10"}
BASELINE = {
    "start one": "raw send",
    "start three": "raw send",
    "start map10": "raw send",
    "complete chain": "raw archive+send",
    "fail retry": "raw archive+send",
    "claim one": "raw read",
}
# the engine's statements call flowlane's functions, the baselines' only PGMQ's
EXEC_TIME = b"""
select coalesce(sum(total_exec_time) filter (where query ~ 'flowlane[.]'), 0),
       coalesce(sum(total_exec_time) filter (where query !~ 'flowlane[.]'), 0)
from pg_stat_statements
where dbid = (select oid from pg_database where datname = current_database())
  and query !~* 'pg_stat_statements|pg_backend_pid|pg_stat_'
"""
FUNCTION_TIMES = b"""
select schemaname || '.' || funcname, calls, self_time from pg_stat_user_functions
where self_time > 0 order by self_time desc
"""


@dataclass
class Side:
    """One side of a pairing, per round: wall and backend CPU seconds, execution ms, per call."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    exec_ms: list[float] = field(default_factory=list)

    def add(self, calls: int, wall: float, cpu_ns: int, exec_ms: float) -> None:
        self.wall.append(wall / calls)
        self.cpu.append(cpu_ns / 1e9 / calls)
        self.exec_ms.append(exec_ms / calls)


@dataclass
class Cell:
    """A case and its baseline, measured side by side in each round."""

    case: Side = field(default_factory=Side)
    raw: Side = field(default_factory=Side)

    def ratio(self, measure: str) -> float:
        """The median over the rounds of the case's per-call figure over its baseline's."""
        case: list[float] = getattr(self.case, measure)
        raw: list[float] = getattr(self.raw, measure)
        return statistics.median(c / r for c, r in zip(case, raw, strict=True))


class Case:
    """One database's calls; ``prepare`` (untimed) makes what ``calls`` consumes."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.worker = uuid.uuid4()
        self.serial = 0
        self.pairs = {
            flow: json.dumps([[flow, step] for step, _, _ in steps]) for flow, steps in FLOWS.items()
        }

    def define(self) -> None:
        self.conn.execute(b"select pgmq.create(%s)", (RAW,))
        with self.conn.transaction():
            for flow, steps in FLOWS.items():
                self.conn.execute(b"select flowlane.create_flow(%s)", (flow,))
                for step, deps, step_type in steps:
                    self.conn.execute(
                        b"select flowlane.add_step(%s, %s, %s, step_type => %s)",
                        (flow, step, deps, step_type),
                    )

    def next_input(self, flow: str) -> Any:
        self.serial += 1
        return list(range(10)) if flow == "bench_map10" else {"i": self.serial}

    def prepare(self, name: str, n: int) -> list[Any]:
        if name in ("raw archive+send", "raw read"):
            bodies = [json.dumps({"i": i}) for i in range(n)]
            return [
                r[0] for r in self.conn.execute(b"select pgmq.send_batch(%s, %s::jsonb[])", (RAW, bodies))
            ]
        if name in ("complete chain", "fail retry"):
            flow = "bench_three" if name == "complete chain" else "bench_one"
            inputs = [json.dumps(self.next_input(flow)) for _ in range(n)]
            self.conn.execute(b"select count(*) from flowlane.start_flows(%s, %s::jsonb[])", (flow, inputs))
            claimed: list[Any] = []
            while len(claimed) < n:
                claimed += self.conn.execute(
                    b"select run_id, step_slug, task_index, attempt"
                    b" from flowlane.claim_tasks(%s, %s, %s, %s::jsonb) where outcome = 'claimed'",
                    (flow, min(100, n - len(claimed)), self.worker, self.pairs[flow]),
                ).fetchall()
            return claimed
        if name == "claim one":
            inputs = [json.dumps(self.next_input("bench_one")) for _ in range(n)]
            self.conn.execute(
                b"select count(*) from flowlane.start_flows('bench_one', %s::jsonb[])", (inputs,)
            )
        return [None] * n

    def call(self, name: str, item: Any) -> None:
        execute = self.conn.execute
        if name == "raw send":
            execute(b"select pgmq.send(%s, %s)", (RAW, Jsonb({"i": self.serial})))
            self.serial += 1
        elif name == "raw archive+send":
            execute(
                b"select pgmq.archive(%s, %s::bigint), pgmq.send(%s, %s)",
                (RAW, item, RAW, Jsonb({"i": item})),
            )
        elif name == "raw read":
            execute(b"select msg_id from pgmq.read(%s, 30, 1)", (RAW,))
        elif name == "claim one":
            params = {"queue_name": "bench_one", "qty": 1, "worker_id": self.worker}
            execute(query("worker_claim_tasks"), {**params, "pairs": self.pairs["bench_one"]})
        elif name in STARTS:
            flow = STARTS[name]
            execute(b"select run_id from flowlane.start_flow(%s, %s)", (flow, Jsonb(self.next_input(flow))))
        elif name == "complete chain":
            run_id, step, index, attempt = item
            execute(
                b"select status from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                (run_id, step, index, Jsonb({"ok": True}), self.worker, attempt),
            )
        elif name == "fail retry":
            run_id, step, index, attempt = item
            execute(
                b"select status from flowlane.fail_task(%s, %s, %s, %s, %s, %s)",
                (run_id, step, index, "boom", self.worker, attempt),
            )
        else:
            raise ValueError(name)


CASES = [*STARTS, "complete chain", "fail retry", "claim one"]
CHUNK = 50


def timed(case: Case, name: str, n: int, cell: Cell) -> None:
    """n calls of the case and n of its baseline, in turns of CHUNK calls."""
    baseline = BASELINE[name]
    pairs = list(zip(case.prepare(baseline, n), case.prepare(name, n), strict=True))
    conn = case.conn
    pid = scalar(conn, "backend_pid")
    conn.execute(b"select pg_stat_statements_reset()")
    wall, cpu = [0.0, 0.0], [0, 0]
    for first in range(0, n, CHUNK):
        for side, call in enumerate((baseline, name)):
            cpu0, start = backend_cpu_ns(pid), time.perf_counter()
            for pair in pairs[first:first + CHUNK]:
                case.call(call, pair[side])
            wall[side] += time.perf_counter() - start
            cpu[side] += backend_cpu_ns(pid) - cpu0
    row = conn.execute(EXEC_TIME).fetchone()
    assert row is not None
    cell.raw.add(n, wall[0], cpu[0], float(row[1]))
    cell.case.add(n, wall[1], cpu[1], float(row[0]))


def function_profile(case: Case, n: int) -> None:
    conn = case.conn
    for name in CASES:
        items = case.prepare(name, n)
        conn.execute(b"select pg_stat_reset()")
        conn.execute(b"set track_functions = 'all'")
        for item in items:
            case.call(name, item)
        conn.execute(b"set track_functions = 'none'")
        conn.execute(b"select pg_stat_force_next_flush()")
        conn.execute(b"select pg_stat_clear_snapshot()")
        rows = conn.execute(FUNCTION_TIMES).fetchall()
        total = sum(r[2] for r in rows)
        print(f"  {name}: {1000 * total / n:.0f} µs of functions' own time per call")
        for fname, calls, self_ms in rows[:8]:
            print(f"    {1000 * self_ms / n:7.0f} µs  {calls / n:5.2f} calls  {fname}")


def report(cells: dict[tuple[str, str], Cell], versions: list[str]) -> None:
    print(
        f"{'case':<15} {'db':<7} {'calls/s':>8} {'cpu µs/call':>11} {'exec µs/call':>12}"
        f"   {'baseline':<16} {'cpu µs':>6} {'exec µs':>7} {'cpu/raw':>8} {'exec/raw':>8}"
    )
    for name in CASES:
        for version in versions:
            cell = cells[(version, name)]
            case, raw = (
                [statistics.median(x) for x in (side.wall, side.cpu, side.exec_ms)]
                for side in (cell.case, cell.raw)
            )
            print(
                f"{name:<15} {version:<7} {1 / case[0]:8.0f} {1e6 * case[1]:11.0f} {1000 * case[2]:12.0f}"
                f"   {BASELINE[name]:<16} {1e6 * raw[1]:6.0f} {1000 * raw[2]:7.0f}"
                f" {cell.ratio('cpu'):8.1f} {cell.ratio('exec_ms'):8.1f}"
            )
    print()
    if len(versions) == 2:
        for name in CASES:
            before, after = (cells[(v, name)].case for v in versions)
            print(
                f"{name}: after/before cpu per call "
                f"{statistics.median(after.cpu) / statistics.median(before.cpu):5.2f}x, exec "
                f"{statistics.median(after.exec_ms) / statistics.median(before.exec_ms):5.2f}x"
            )


def measure(conns: dict[str, Conn], calls: int, rounds: int, functions: bool) -> None:
    cases = {version: Case(conn) for version, conn in conns.items()}
    for case in cases.values():
        case.define()
        case.conn.execute(b"set pg_stat_statements.track = 'top'")
        for name in CASES:  # warm-up: plans and caches made outside the measurement
            timed(case, name, 20, Cell())
    cells = {(version, name): Cell() for name in CASES for version in conns}
    order: list[tuple[str, str]] = list(cells)
    for r in range(rounds):
        shift = (r * 3) % len(order)
        for version, name in order[shift:] + order[:shift]:
            timed(cases[version], name, calls, cells[(version, name)])
    report(cells, list(conns))
    if functions:
        for version, case in cases.items():
            print(f"\n{version}: functions' own time (track_functions = 'all'), {calls} calls per case")
            function_profile(case, calls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument("--before", type=Path, help="an older checkout to measure beside this one")
    parser.add_argument("--functions", action="store_true", help="each function's own time per call")
    args = parser.parse_args()
    with (
        statements_server("flowlane-single-") as admin,
        before_and_after(admin, "single", args.before) as conns,
    ):
        pin_backends(conns.values())
        print(f"{args.calls} calls per case and round, {args.rounds} rounds, medians\n")
        measure(conns, args.calls, args.rounds, args.functions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
