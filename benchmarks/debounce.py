"""Debounced starts against plain starts: what a debounce costs where it is used, and what it
costs the starts of flows without one.

    PYTHONPATH=. python benchmarks/debounce.py [--calls 2000]

What it measures, on one embedded PostgreSQL, a fresh database with three one-step flows
(`plain` without options; `debounced` with `debounce: {key: /k, period: 1h}`), each start one
`start_flow` call on one connection, median of --calls calls, the kinds alternating (so that
the machine's load falls on all alike):

- a plain start (a run that begins at once, its task sent);
- a debounced start of a new key (a pending run created, no task sent yet);
- a debounced start that joins its key's pending run (the run's input replaced);
- the check every start of a flow without debounce now makes (`_debounced_start` of the plain
  flow, which reads the flow and returns nothing), alone, less a round trip of one statement
  (`select $1::jsonb`);
- the maintenance tick beginning --calls pending debounced runs, against beginning as many
  delayed plain runs (runs per second, one tick each).

How to read it: "joins" and "new key" are the price of a debounced start against a plain one
(a joined start does less: no run, no task); "the check" is what flows without debounce pay,
as a share of their start; the tick's two rates should be close (the same path begins both).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import count
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import WARM_UP, Conn, medians_ms, migrated_database, statements_server


def fresh(admin: str) -> Conn:
    conn = migrated_database(admin, "bench_debounce")
    conn.execute("select flowlane.create_flow('plain')")
    conn.execute("select flowlane.add_step('plain', 'only')")
    conn.execute("select flowlane.create_flow('debounced', debounce_key => '/k', debounce_period => 3600)")
    conn.execute("select flowlane.add_step('debounced', 'only')")
    return conn


def tick_rate(conn: Conn, flow: str, runs: int) -> float:
    """Runs per second of one tick that begins the flow's ``runs`` waiting runs (made due)."""
    conn.execute("update flowlane.runs set start_at = now() - interval '1 s' "
                 "where flow_slug = %s and status = 'waiting'", (flow,))
    start = time.perf_counter()
    row = conn.execute("select flowlane.maintenance_tick()").fetchone()
    seconds = time.perf_counter() - start
    assert row is not None and row[0]["begun"] == runs, (row, runs)
    return runs / seconds


def measure(admin: str, calls: int) -> dict[str, Any]:
    start = "select run_id from flowlane.start_flow(%s, %s::jsonb)"
    keys = count()
    with fresh(admin) as conn:
        ms = medians_ms({
            "plain": lambda n: (conn, start, ("plain", json.dumps({"n": n}))),
            "new key": lambda n: (conn, start, ("debounced", json.dumps({"k": f"new{next(keys)}", "n": n}))),
            "joins": lambda n: (conn, start, ("debounced", json.dumps({"k": "hot", "n": n}))),
            "the check": lambda n: (conn, "select flowlane._debounced_start('plain', %s::jsonb, null)",
                                    (json.dumps({"n": n}),)),
            "a round trip": lambda n: (conn, "select %s::jsonb", (json.dumps({"n": n}),)),
        }, calls)
        pending = conn.execute("select count(*) from flowlane.runs where flow_slug = 'debounced' "
                               "and status = 'waiting'").fetchone()
        assert pending is not None
        conn.execute("select flowlane.start_flows('plain', %s::jsonb[], now() + interval '1 h')",
                     ([json.dumps({"n": n}) for n in range(WARM_UP)],))
        tick_rate(conn, "plain", WARM_UP)  # the tick's plans made before either is measured
        conn.execute("select flowlane.start_flows('plain', %s::jsonb[], now() + interval '1 h')",
                     ([json.dumps({"n": n}) for n in range(pending[0])],))
        debounced = tick_rate(conn, "debounced", pending[0])
        delayed = tick_rate(conn, "plain", pending[0])
    return {"ms": ms, "pending": pending[0], "debounced": debounced, "delayed": delayed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    with statements_server("flowlane-bench-") as admin:
        r = measure(admin, args.calls)
    ms = r["ms"]
    print(f"start_flow, median of {args.calls} calls each:")
    print(f"  plain start                      {ms['plain']:8.3f} ms")
    print(f"  debounced start, new key         {ms['new key']:8.3f} ms  ({ms['new key'] / ms['plain']:.2f}x)")
    print(f"  debounced start, joins its key   {ms['joins']:8.3f} ms  ({ms['joins'] / ms['plain']:.2f}x)")
    check = ms["the check"] - ms["a round trip"]
    print(f"  the check a plain start makes    {check:8.3f} ms  ({100 * check / ms['plain']:.1f}% of a plain "
          f"start; {ms['the check']:.3f} ms alone less {ms['a round trip']:.3f} ms for a round trip)")
    print(f"the maintenance tick beginning {r['pending']} waiting runs in one tick:")
    print(f"  debounced runs   {r['debounced']:10.0f} runs/s")
    print(f"  delayed runs     {r['delayed']:10.0f} runs/s  "
          f"(debounced at {r['debounced'] / r['delayed']:.2f}x their rate)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
