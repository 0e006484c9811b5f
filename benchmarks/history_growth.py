"""A start, a claim and a completion with a long history retained, against an empty database.

    PYTHONPATH=. python benchmarks/history_growth.py [--runs 1000000] [--calls 200] [--rounds 5]
        [--shared-buffers 128MB 4GB] [--engine DIR] [--retention 20000] [--explain FILE]

What it measures: that the calls on the hot path cost what their own work costs, however
many finished runs the database keeps. One embedded PostgreSQL, two databases migrated to
head with the same flows: `empty`, and `loaded`, which gets --runs finished one-step runs
of the flow the calls use (docs/benchmarks.md reports 10000000 too). The history is loaded
set-based, INSERT ... SELECT over generate_series, as copies of one real run the engine
started, claimed and completed (benchmarks/history_growth.sql): its run, step state, task
and archived message, with run id, input, message id and times changed, so every row is
one the engine could have written (foreign keys and triggers are off during the load
only: the copies satisfy them by construction). A copy's run id is of the template's kind:
a time-ordered one (UUID version 7) carries the copy's start time, as the engine would have
made it then; any other is random. Both databases are then vacuumed and analyzed, as
autovacuum would have left them. --engine DIR migrates both databases with another
checkout's migrations (e.g. `git archive main | tar -x -C DIR`), to measure its engine.

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

The whole measurement is repeated for each --shared-buffers setting, the server restarted
with it (PostgreSQL's default is 128MB; a server for a database of several GB is given a
quarter of its memory or so). After a restart the tables' indexes are read into shared
buffers (pg_prewarm, up to what fits), as a long-running server would hold them. Per
setting it also prints the shared buffers' hit ratio of each database during the rounds,
and a diagnostic pass (pg_stat_statements.track = all, not timed): per case, the statements
the calls ran, nested ones included, whose shared blocks per call differ most between the
databases. --explain FILE appends to FILE the plans, with buffers, of every statement one
call of each case runs on each database, nested ones included (auto_explain).

With --retention N, last: retention's cost with the long history against a short one. The
empty database gets N finished runs loaded the same way; then in each database prune_runs
(batches of 500, p_older_than => 0) deletes its N oldest finished runs, and a VACUUM of the
four tables follows. Printed per database: the backend's CPU and wall time per pruned run of
the prune calls, and the seconds of the VACUUM (which reads every index of a table whatever
it removes: autovacuum, run when 2 % of a table is dead, pays that once per 2 % pruned).

How to read it: the loaded / empty ratios are the figures (1.00 is flat; the target is
within 10 %). A turn of 50 calls of about a millisecond each moves by 5-10 % with the
machine's load, which is why the ratio is taken per round, side by side, and its median
reported.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    backend_cpu_ns,
    load_queries,
    migrated_database,
    pin_backends,
    scalar,
    start_server_with_statements,
    statements_pgdata,
)
from benchmarks.single_call_profile import CHUNK, Case
from flowlane.core.db import EmbeddedDatabase

Q = load_queries(Path(__file__).with_suffix(".sql"))
CASES = ("start one", "claim one", "complete one")
DATABASES = ("empty", "loaded")
LOAD_CHUNK = 250_000
PRUNE_BATCH = 500  # prune_runs' default
MB = 1024 * 1024


class HistoryCase(Case):
    """single_call_profile's calls, and the completion of a claimed one-step task."""

    def prepare(self, name: str, n: int) -> list[Any]:
        self.conn.execute(Q["hide_claimed"])
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


def finish_one_run(case: HistoryCase) -> tuple[Any, int, Any]:
    """The template: a one-step run started, claimed and completed by the engine (its run
    id, message id and start time)."""
    [claimed] = case.prepare("complete one", 1)
    case.call("complete one", claimed)
    row = case.conn.execute(Q["template"]).fetchone()
    assert row is not None
    return row[0], int(row[1]), row[2]


def load_history(conn: Conn, case: HistoryCase, runs: int) -> float:
    """``runs`` finished runs copied from a real one; the seconds it took."""
    template, message_id, started_at = finish_one_run(case)
    [(last_message,)] = conn.execute(Q["last_message"]).fetchall()  # copies' message ids follow it
    began = time.perf_counter()
    conn.execute(Q["history_run_id"])
    conn.execute(b"set session_replication_role = replica")  # no foreign key checks, no triggers
    for lo in range(1, runs + 1, LOAD_CHUNK):
        params = {"lo": lo, "hi": min(runs, lo + LOAD_CHUNK - 1), "runs": runs,
                  "template": template, "message_id": message_id, "last_message": last_message,
                  "started_at": started_at, "time_ordered": template.version == 7}
        with conn.transaction():
            for table in ("runs", "step_states", "step_tasks", "archive"):
                conn.execute(Q[f"load_{table}"], params)
        print(f"  loaded {params['hi']:,} runs ({time.perf_counter() - began:.0f} s)", flush=True)
    conn.execute(b"set session_replication_role = origin")
    conn.execute(Q["advance_messages"], {"last": last_message + runs})
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


def hit_counts(conns: dict[str, Conn]) -> dict[str, tuple[int, int]]:
    """Per database: shared blocks found in shared buffers and read in, so far."""
    counts = {}
    for name, conn in conns.items():
        conn.execute(Q["flush_stats"])
        hit, read = conn.execute(Q["block_counts"]).fetchone() or (0, 0)
        counts[name] = (int(hit), int(read))
    return counts


def hit_ratios(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    cells = []
    for name in DATABASES:
        hit, read = (after[name][i] - before[name][i] for i in (0, 1))
        cells.append(f"{name} {100 * hit / max(1, hit + read):.2f} % ({read:,} blocks read)")
    return "shared buffers hit ratio during the rounds: " + ", ".join(cells)


def diagnose(cases: dict[str, HistoryCase], admin: str, calls: int) -> list[str]:
    """Per case, the statements (nested ones included) whose shared blocks per call differ
    most between the databases, from pg_stat_statements over ``calls`` untimed calls. New
    sessions make them, tracking every statement from their first: a statement parsed while
    untracked is recorded under its text as written, not its normalized one."""
    lines = []
    timed = {name: case.conn for name, case in cases.items()}
    try:
        for name, conn in connect(admin, options="-c pg_stat_statements.track=all").items():
            cases[name].conn = conn
        pin_backends(case.conn for case in cases.values())
        for name in CASES:
            items = {db: cases[db].prepare(name, calls + 5) for db in DATABASES}
            for db in DATABASES:  # plans made first
                for item in items[db][:5]:
                    cases[db].call(name, item)
            cases["empty"].conn.execute(b"select pg_stat_statements_reset()")
            for db in DATABASES:
                for item in items[db][5:]:
                    cases[db].call(name, item)
            rows = cases["empty"].conn.execute(Q["block_differences"], {"calls": calls}).fetchall()
            lines.append(f"  {name}: shared blocks per call, hit / read (dirtied), empty -> loaded")
            for text, empty_hit, empty_read, hit, read, dirtied in rows:
                lines.append(f"    {empty_hit:6.1f} / {empty_read:5.1f} -> {hit:6.1f} / {read:5.1f}"
                             f" ({dirtied:4.1f})  {text}")
    finally:
        for name, conn in timed.items():
            cases[name].conn.close()
            cases[name].conn = conn
        pin_backends(timed.values())
    return lines


def explain(cases: dict[str, HistoryCase], pgdata: Path, into: Path, heading: str) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of every statement one call of each case runs, nested ones
    included (auto_explain, into the server's log), appended to ``into``."""
    log = pgdata / "log"
    begin = log.stat().st_size
    for name in CASES:
        for db, case in cases.items():
            [item] = case.prepare(name, 1)
            case.conn.execute(Q["auto_explain"])
            case.conn.execute(f"select 'history_growth: {name} on {db}'".encode())
            case.call(name, item)
            case.conn.execute(b"reset all")
    with log.open("rb") as source, into.open("ab") as target:
        source.seek(begin)
        target.write(f"\n==== {heading}\n".encode())
        target.write(source.read())


def measure_retention(cases: dict[str, HistoryCase], runs: int) -> list[str]:
    """Per database: CPU and wall µs per pruned run of deleting the ``runs`` oldest finished
    runs by prune_runs batches, and the seconds of the VACUUM after them."""
    # the calls' leftover messages out of the template's way: a claim of one takes the oldest
    # visible message, and a started task's gives back no claim
    cases["empty"].conn.execute(Q["purge_queue"])
    load_history(cases["empty"].conn, cases["empty"], runs)
    lines = [f"retention: {runs:,} oldest finished runs pruned in batches of {PRUNE_BATCH}, then VACUUM",
             f"{'database':<9} {'cpu µs/run':>10} {'wall µs/run':>11} {'vacuum s':>9}"]
    for name in DATABASES:
        conn = cases[name].conn
        pid = scalar(conn, "backend_pid")
        cpu0, start = backend_cpu_ns(pid), time.perf_counter()
        pruned = 0
        while pruned < runs:
            row = conn.execute(Q["prune_batch"], {"batch": min(PRUNE_BATCH, runs - pruned)}).fetchone()
            assert row is not None and row[0] > 0
            pruned += row[0]
        cpu, wall = (backend_cpu_ns(pid) - cpu0) / 1e3 / runs, 1e6 * (time.perf_counter() - start) / runs
        start = time.perf_counter()
        conn.execute(Q["vacuum_history"])
        lines.append(f"{name:<9} {cpu:>10.0f} {wall:>11.0f} {time.perf_counter() - start:>9.1f}")
    return lines


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


@contextlib.contextmanager
def server() -> Iterator[Path]:
    """A throwaway embedded server with pg_stat_statements preloaded: its data directory."""
    with statements_pgdata("flowlane-history-") as pgdata:
        start_server_with_statements(pgdata)
        yield pgdata


def restart(pgdata: Path, admin: str, shared_buffers: str) -> str:
    """The server restarted with ``shared_buffers``; its admin DSN."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(b"alter system set shared_buffers = %s" % f"'{shared_buffers}'".encode())
        conn.execute(b"checkpoint")
    EmbeddedDatabase.stop_at(pgdata)
    return EmbeddedDatabase.start_at(pgdata)


def connect(admin: str, **options: str) -> dict[str, Conn]:
    dsns = {name: psycopg.conninfo.make_conninfo(admin, dbname=f"history_{name}", **options)
            for name in DATABASES}
    return {name: psycopg.connect(dsn, autocommit=True) for name, dsn in dsns.items()}


def warm(cases: dict[str, HistoryCase]) -> None:
    """Indexes and tables read into shared buffers (up to what fits, indexes first), then a
    few calls of each case: plans made and caches warm, outside the measurement."""
    for case in cases.values():
        case.conn.execute(b"create extension if not exists pg_prewarm")
        case.conn.execute(Q["prewarm"])
    for case in cases.values():
        for name in CASES:
            for item in case.prepare(name, 20):
                case.call(name, item)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="finished runs in the loaded database")
    parser.add_argument("--calls", type=int, default=200, help="calls per case, database and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (medians)")
    parser.add_argument("--shared-buffers", nargs="+", default=["128MB"], metavar="SIZE",
                        help="measure with each of these shared_buffers settings (server restarted)")
    parser.add_argument("--engine", type=Path, help="migrate with this checkout's migrations instead")
    parser.add_argument("--explain", type=Path, metavar="FILE",
                        help="append EXPLAIN (ANALYZE, BUFFERS) of one call of each case per setting")
    parser.add_argument("--retention", type=int, metavar="N", help="last, prune N runs in each database")
    args = parser.parse_args()
    with server() as pgdata:
        admin = EmbeddedDatabase.start_at(pgdata)
        conns = {name: migrated_database(admin, f"history_{name}", args.engine) for name in DATABASES}
        cases = {name: HistoryCase(conn) for name, conn in conns.items()}
        for case in cases.values():
            case.define()
        print(f"loading {args.runs:,} finished one-step runs", flush=True)
        seconds = load_history(conns["loaded"], cases["loaded"], args.runs)
        finish_one_run(cases["empty"])
        conns["empty"].execute(b"vacuum analyze")
        print(f"loaded and vacuumed in {seconds:.0f} s")
        print_sizes(conns["loaded"])
        for shared_buffers in args.shared_buffers:
            for conn in conns.values():
                conn.close()
            admin = restart(pgdata, admin, shared_buffers)
            conns = connect(admin)
            for name, conn in conns.items():
                cases[name].conn = conn
            pin_backends(conns.values())
            warm(cases)
            print(f"\nshared_buffers {shared_buffers}: {args.calls} calls per case, database and round,"
                  f" {args.rounds} rounds, medians", flush=True)
            counts = hit_counts(conns)
            for line in report(measure(cases, args.calls, args.rounds)):
                print(line)
            print(hit_ratios(counts, hit_counts(conns)))
            print("\n".join(diagnose(cases, admin, 50)), flush=True)
            if args.explain:
                explain(cases, pgdata, args.explain, f"shared_buffers {shared_buffers}")
        if args.retention:
            print("\n".join(["", *measure_retention(cases, args.retention)]))
        for conn in conns.values():
            conn.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
