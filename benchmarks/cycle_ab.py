"""A SQL change's cost on one task's cycle (start, claim, completion, tick), with and without it, in one run.

    PYTHONPATH=. python benchmarks/cycle_ab.py CHANGE.sql [--cycles 200] [--rounds 5] [--pairs 1]
        [--map 0] [--batch 1]

One embedded PostgreSQL (FLOWLANE_PG_BINDIR picks another installation's, as for the tests),
four databases migrated to head, created in the order a1, b1, b2, a2: the `a` pair as it is,
the `b` pair with CHANGE.sql applied (e.g. an `alter function ... set ...`, or a `create or
replace function` to try). Two databases with the same code have measured up to 1.1x apart
here (and 1.4x in a script like it), in either direction, changing from one server start to
the next: each side measured in an early and a late database evens out an order effect, and
the A/A and B/B figures show how far apart the pairs were in this run. In each, one connection runs
cycles of a one-step flow: `start_flow`, the worker's claim query (`claim_tasks`, qty 100, one
task queued), `complete_task` and the maintenance tick every worker runs each second
(`maintenance_tick`), each its own transaction. The databases take turns by rounds, each
round starting with the next one. Printed: the backend's CPU per call (median, from
/proc/<pid>/schedstat) of each call on each side, b / a, and a2 / a1 and b2 / b1. --pairs N:
the worker serves N (flow, step) pairs, the one-step flow's and N - 1 steps of another flow.
--map N: the step maps the run input, an array of N elements (a start sends N tasks, a claim
takes them all and "complete" is their N completions). --batch N: the batch paths, as a
worker drives them: `start_flows` of N runs, one claim of their N tasks and one
`complete_tasks` of N results (the CPU printed is per call: divide by N for a task's). To
measure a migration before it is
merged, pass the statements it adds (the head of `b` then has them twice, which a `create or
replace` or an `alter` allows); to measure one already merged, pass what undoes it (the
functions as they were) and read b / a the other way round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from pathlib import Path

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    backend_cpu_ns,
    migrated_database,
    pin_backends,
    statements_server,
)
from flowlane.core.queries import query

CALLS = ("start", "claim", "complete", "tick")
DATABASES = ["a1", "b1", "b2", "a2"]  # in the order they are created


def cycle(
    conn: Conn, worker: uuid.UUID, pairs: list[list[str]], run_input: Jsonb, batch: int
) -> dict[str, int]:
    """One start, claim, completion and maintenance tick; the backend CPU (ns) of each. With
    ``batch`` above 1: a start_flows of that many runs, their claim and one complete_tasks."""
    pid = conn.info.backend_pid
    spent: dict[str, int] = {}
    before = backend_cpu_ns(pid)
    if batch == 1:
        conn.execute(b"select flowlane.start_flow('bench_ab', %s)", (run_input,))
    else:
        conn.execute(
            b"select count(*) from flowlane.start_flows('bench_ab', %s::jsonb[])", ([run_input] * batch,)
        )
    spent["start"], before = backend_cpu_ns(pid) - before, backend_cpu_ns(pid)
    params = {"queue_name": "bench_ab", "qty": max(100, batch), "worker_id": worker}
    rows = conn.execute(query("worker_claim_tasks"), {**params, "pairs": Jsonb(pairs)})
    claimed = [r for r in rows.fetchall() if r[0] == "claimed"]
    spent["claim"], before = backend_cpu_ns(pid) - before, backend_cpu_ns(pid)
    if batch == 1:
        for row in claimed:
            conn.execute(
                b"select flowlane.complete_task(%s, %s, %s, '{}'::jsonb, %s, %s)",
                (row[4], row[2], row[5], worker, row[8]),
            )
    else:
        results = [
            {
                "run_id": str(r[4]),
                "step_slug": r[2],
                "task_index": r[5],
                "output": {},
                "worker_id": str(worker),
                "attempt": r[8],
            }
            for r in claimed
        ]
        conn.execute(query("worker_complete_tasks"), {"results": Jsonb(results)}).fetchall()
    spent["complete"], before = backend_cpu_ns(pid) - before, backend_cpu_ns(pid)
    conn.execute(b"select flowlane.maintenance_tick()")
    spent["tick"] = backend_cpu_ns(pid) - before
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("change", type=Path, help="SQL applied to database b")
    parser.add_argument("--cycles", type=int, default=200, help="cycles per database and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=1, help="(flow, step) pairs the worker serves")
    parser.add_argument("--map", type=int, default=0, help="the step maps an input of this many elements")
    parser.add_argument("--batch", type=int, default=1, help="runs per start_flows, claim and complete_tasks")
    args = parser.parse_args()
    if args.batch < 1 or (args.batch > 1 and args.map):
        parser.error("--batch must be at least 1, and 1 with --map")
    change = args.change.read_text()
    with statements_server("flowlane-ab-") as admin:
        conns = {name: migrated_database(admin, f"bench_ab_{name}", None) for name in DATABASES}
        for name, conn in conns.items():
            conn.execute(b"select flowlane.create_flow('bench_ab')")
            conn.execute(
                b"select flowlane.add_step('bench_ab', 's0', step_type => %s)",
                ("map" if args.map else "single",),
            )
            if args.pairs > 1:
                conn.execute(b"select flowlane.create_flow('bench_ab_more')")
            for n in range(1, args.pairs):
                conn.execute(b"select flowlane.add_step('bench_ab_more', %s)", (f"s{n}",))
            conn.execute(b"analyze flowlane.steps")  # as autovacuum would have, for the plans
            if name.startswith("b"):
                conn.execute(change.encode())
        pin_backends(conns.values())
        worker = uuid.uuid4()
        pairs = [["bench_ab", "s0"], *(["bench_ab_more", f"s{n}"] for n in range(1, args.pairs))]
        run_input = Jsonb(list(range(args.map)) if args.map else {})
        spent: dict[str, dict[str, list[int]]] = {n: {c: [] for c in CALLS} for n in conns}
        for conn in conns.values():
            for _ in range(50):  # warm-up: plans and caches made outside the measurement
                cycle(conn, worker, pairs, run_input, args.batch)
        for r in range(args.rounds):
            for name in DATABASES[r % 4 :] + DATABASES[: r % 4]:
                for _ in range(args.cycles):
                    for call, ns in cycle(conns[name], worker, pairs, run_input, args.batch).items():
                        spent[name][call].append(ns)
        for conn in conns.values():
            conn.close()
    per_call = f"{args.batch} runs per call" if args.batch > 1 else "one run per call"
    print(
        f"{args.rounds} rounds of {args.cycles} cycles per database ({per_call}); "
        "backend CPU per call, medians"
    )
    for call in CALLS:
        us = {n: statistics.median(spent[n][call]) / 1000 for n in DATABASES}
        a = statistics.median(spent["a1"][call] + spent["a2"][call]) / 1000
        b = statistics.median(spent["b1"][call] + spent["b2"][call]) / 1000
        print(
            f"{call:9} a {a:7.0f} µs   b {b:7.0f} µs   b/a {b / a:.2f}"
            f"   (A/A a2/a1 {us['a2'] / us['a1']:.2f}, B/B b2/b1 {us['b2'] / us['b1']:.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
