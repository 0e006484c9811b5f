"""Starts of a flow whose step is cached against plain starts: what a cache costs where it is
used, and that flows without one pay nothing.

    PYTHONPATH=. python benchmarks/step_cache.py [--calls 2000] [--base ../main]

What it measures, on one embedded PostgreSQL, a fresh database with one-step flows (`plain`
without options; `cached` with `cache: {ttl: 1h}`), each start one `start_flow` call on one
connection, median of --calls calls, the kinds alternating (so that the machine's load falls
on all alike):

- a plain start (a run that begins at once, its task sent);
- a start of the cached flow whose input has an entry (a hit: the task completes at once from
  the entry, and with it the run; no message is sent);
- a start of the cached flow with a new input (a miss: the lookup, then the task sent as a plain
  start sends it);
- a task's completion by its worker (`complete_task` of a claimed task), of the plain flow and
  of the cached flow (which writes the entry), each after a claim that is not timed;
- with --base, a checkout of flowlane without step caches (its own migrations, applied by its
  own code to a second database of the same server): its plain start and plain completion,
  alternating with this checkout's, so that what a flow without a cache pays shows as the
  difference between the two.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    WARM_UP,
    Conn,
    Timed,
    medians_ms,
    migrated_database,
    statements_server,
)

START = "select run_id from flowlane.start_flow(%s, %s::jsonb)"
CLAIM = ("select run_id, step_slug, task_index, attempt from flowlane.claim_tasks(%s, 1, %s, %s) "
         "where outcome = 'claimed'")
COMPLETE = "select 1 from flowlane.complete_task(%s, %s, %s, %s, %s, %s)"


def database(admin: str, name: str, base: Path | None = None) -> Conn:
    """A fresh database with the flows, migrated by this checkout or by ``base``'s code."""
    conn = migrated_database(admin, name, base)
    conn.execute("select flowlane.create_flow('plain')")
    conn.execute("select flowlane.add_step('plain', 'only')")
    if base is None:
        conn.execute("select flowlane.create_flow('cached')")
        conn.execute("select flowlane.add_step('cached', 'only', cache_ttl => 3600, "
                     "cache_fingerprint => 'b')")
    return conn


class Completer:
    """A task of ``flow`` started and claimed untimed, completed in the timed call."""

    def __init__(self, conn: Conn, flow: str, fresh_input: Callable[[], Any]) -> None:
        self.conn, self.flow, self.fresh_input = conn, flow, fresh_input
        self.worker, self.task = uuid.uuid4(), None
        self.pairs = Jsonb([[flow, "only"]])

    def prepare(self, _n: int) -> None:
        self.conn.execute(START, (self.flow, json.dumps(self.fresh_input())))
        self.task = self.conn.execute(CLAIM, (self.flow, self.worker, self.pairs)).fetchone()
        assert self.task is not None

    def call(self, _n: int) -> tuple[Conn, str, Any]:
        assert self.task is not None
        run_id, step, index, attempt = self.task
        return self.conn, COMPLETE, (run_id, step, index, Jsonb({"done": 1}), self.worker, attempt)


def measure(admin: str, calls: int, base: Path | None) -> dict[str, float]:
    new = count()
    conn = database(admin, "bench_step_cache")
    conn.execute(START, ("cached", json.dumps({"hot": True})))
    task = conn.execute(CLAIM, ("cached", worker := uuid.uuid4(), Jsonb([["cached", "only"]]))).fetchone()
    assert task is not None
    conn.execute(COMPLETE, (*task[:3], Jsonb({"cached": 1}), worker, task[3]))  # the entry of {"hot": true}
    kinds: dict[str, Timed] = {
        "plain": lambda n: (conn, START, ("plain", json.dumps({"n": n}))),
        "hit": lambda n: (conn, START, ("cached", json.dumps({"hot": True}))),
        "miss": lambda n: (conn, START, ("cached", json.dumps({"new": next(new)}))),
    }
    plain_done = Completer(conn, "plain", lambda: {"n": next(new)})
    cached_done = Completer(conn, "cached", lambda: {"new": next(new)})
    kinds["complete plain"], kinds["complete cached"] = plain_done.call, cached_done.call
    prepare: dict[str, Callable[[int], Any]] = {"complete plain": plain_done.prepare,
                                                "complete cached": cached_done.prepare}
    if base is not None:
        old = database(admin, "bench_step_cache_base", base)
        kinds["base plain"] = lambda n: (old, START, ("plain", json.dumps({"n": n})))
        base_done = Completer(old, "plain", lambda: {"n": next(new)})
        kinds["base complete"] = base_done.call
        prepare["base complete"] = base_done.prepare
    ms = medians_ms(kinds, calls, prepare)
    hits = conn.execute("select count(*) from flowlane.step_tasks where cached").fetchone()
    assert hits is not None and hits[0] == calls + WARM_UP, hits
    return ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--base", type=Path, help="a checkout of flowlane without step caches")
    args = parser.parse_args()
    with statements_server("flowlane-bench-") as admin:
        ms = measure(admin, args.calls, args.base.resolve() if args.base else None)
    print(f"median of {args.calls} calls each:")
    print(f"  start_flow, plain flow                  {ms['plain']:8.3f} ms")
    print(f"  start_flow, cached step hits            {ms['hit']:8.3f} ms  "
          f"({ms['hit'] / ms['plain']:.2f}x; the run completed, no message)")
    print(f"  start_flow, cached step misses          {ms['miss']:8.3f} ms  "
          f"({ms['miss'] / ms['plain']:.2f}x)")
    print(f"  complete_task, plain flow               {ms['complete plain']:8.3f} ms")
    print(f"  complete_task, cached step (an entry)   {ms['complete cached']:8.3f} ms  "
          f"({ms['complete cached'] / ms['complete plain']:.2f}x)")
    if "base plain" in ms:
        print(f"  start_flow, plain flow, --base          {ms['base plain']:8.3f} ms  "
              f"(this checkout at {ms['plain'] / ms['base plain']:.2f}x)")
        print(f"  complete_task, plain flow, --base       {ms['base complete']:8.3f} ms  "
              f"(this checkout at {ms['complete plain'] / ms['base complete']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
