"""Pickup latency at a steady rate: does it stay flat over time, or creep?

    PYTHONPATH=. python benchmarks/steady_rate.py [--rate 200] [--seconds 120] [--workers 2]
        [--producers 4] [--no-flush] [--window 30] [--edge 300] [--retention SECONDS]
        [--sizes-every 600] [--dsn DSN] [--before DIR [--rounds 2]]

What it measures: that a deployment serving a steady stream of runs picks each one up in
milliseconds, and keeps doing so as its tables grow.

Producers start one-step runs (`start_flow`, one per transaction) at --rate per second in
all, spread over --producers connections (one connection waits for each start's WAL flush,
which on this machine's shared disk caps it near 120 starts per second), for --seconds (600
for ten minutes) while --workers real worker processes (no-op handler, notifications on)
serve them. --no-flush: the producers' commits do not wait for their WAL flush, which tells
the flush's share of what a run shows. Pickup latency is start_flow's commit to the
handler's start (the handler stamps the time; a reader collects the finished runs every
2 s, before retention can delete them). Printed per --window seconds: runs, pickup p50 /
p99, the producers' lag behind their schedule, the machine's 1-minute load average (mean
over the window), and what the server's backends waited on (pg_stat_activity sampled every
100 ms: wait events of the workers' and the producers' connections); then the last window
against the first, and the last --edge seconds (300: five minutes) against the first. The
database is new, so the tables grow from empty as in a fresh deployment.

--retention SECONDS gives the flow that retention (its YAML's `retention`), so the
workers' maintenance tick deletes its finished runs once they are that old, as a
deployment's would. Every --sizes-every seconds the size of each table a run's rows go to
(the engine's per-run and per-task tables, those that exist in the version measured, and
the queue and its archive) is sampled, table and indexes apart, with the runs kept; they
are printed at the end, one column per sample.

With --before DIR (a tree of an older flowlane, `git archive REV | tar -x -C DIR`), each of
--rounds rounds measures both versions one after the other (which goes first alternates), each
on a new database with its own migrations and its own workers, and prints one line per version:
pickup p50 / p99 over all its rounds, and the samples per minute of backends waiting for the
lock that serialises notifying commits (`Lock:object`).

How to read it: the last window's p50 and p99 against the first window's of the same run,
and the last --edge seconds' against the first's, should stay near 1x; a steady climb from
window to window is a creep. The producers' lag should stay near 0 (otherwise the rate was
not reached). With --retention, the sizes should level off once the first runs are older
than the retention: equal columns from then on are flat tables.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.types.json import Jsonb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bloat import ENGINE_TABLES, existing_tables  # noqa: E402
from benchmarks.worker_throughput import (  # noqa: E402
    FLOWS,
    Workers,
    admin_server,
    fresh_database,
    template_database,
)

FLOW = "bench_noop"
HARVEST_EVERY = 2.0  # seconds between reads of finished runs: well under any retention
HARVEST_MARGIN = 10.0  # seconds a read looks back before the runs it saw start (commit order)

WAITS = b"""
select coalesce(wait_event_type || ':' || wait_event, 'on cpu') from pg_stat_activity
where datname = current_database() and pid <> pg_backend_pid() and state = 'active'
"""


def sample_waits(
    dsn: str, stop: threading.Event, samples: list[tuple[float, str]], loads: list[tuple[float, float]]
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            now = time.time()
            samples.extend((now, row[0]) for row in conn.execute(WAITS).fetchall())
            loads.append((now, os.getloadavg()[0]))
            time.sleep(0.1)


def retention_flows(seconds: int) -> Path:
    """A folder holding the benchmark's flow alone, with ``seconds`` of retention."""
    folder = Path(tempfile.mkdtemp(prefix="flowlane-steady-flows-"))
    flow = next(doc for doc in yaml.safe_load_all((FLOWS / "bench.yaml").read_text())
                if doc.get("slug") == FLOW)
    (folder / "bench.yaml").write_text(yaml.safe_dump({**flow, "retention": seconds}, sort_keys=False))
    return folder


def sized_tables(conn: psycopg.Connection[Any]) -> list[str]:
    """The tables a run's rows go to, of those that exist in the version measured."""
    return existing_tables(conn, [*ENGINE_TABLES, f"pgmq.q_{FLOW}", f"pgmq.a_{FLOW}"])


SIZES = b"select pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)"


def sample_sizes(
    dsn: str, begin: float, every: float, seconds: float, stop: threading.Event,
    samples: list[tuple[float, dict[str, tuple[int, int]], int]],
) -> None:
    """Every ``every`` seconds from ``begin`` until ``seconds``: (time into the run, table ->
    (table bytes, index bytes), runs kept)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = sized_tables(conn)
        for i in range(1, int(seconds // every) + 1):
            if stop.wait(max(0.0, begin + i * every - time.time())):  # the next sample's time
                return
            found = {t: conn.execute(SIZES, (t, t)).fetchone() for t in tables}
            runs = conn.execute(b"select count(*) from flowlane.runs").fetchone()
            samples.append((time.time() - begin, found, int(runs[0])))  # type: ignore[index, misc]


def harvest(dsn: str, stop: threading.Event, stamps: dict[Any, float]) -> None:
    """The handler's time of every finished run, read every HARVEST_EVERY seconds (retention
    may delete a run before the run ends), and once more after ``stop``."""
    since = 0.0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            last = stop.wait(HARVEST_EVERY)
            rows = conn.execute(
                b"select run_id, output, status, extract(epoch from started_at) from flowlane.runs"
                b" where started_at >= to_timestamp(%s)", (since,)).fetchall()
            pending = [float(r[3]) for r in rows if r[2] == "started"]
            stamps.update((r[0], r[1]["only"]["t"]) for r in rows if r[2] == "completed")
            if rows:
                since = min(pending or [max(float(r[3]) for r in rows)]) - HARVEST_MARGIN
            if last:
                return


def produce(
    dsn: str, rate: float, seconds: float, producers: int, flush: bool = True
) -> tuple[dict[Any, float], list[tuple[float, float]]]:
    """Start runs on schedule from ``producers`` connections (start i on connection i mod
    producers, as a web application's request handlers would); each run's commit time, and
    (due time, how late its start began) of every start."""
    committed: dict[Any, float] = {}
    lags: list[tuple[float, float]] = []
    begin = time.time() + 0.5
    threads = [
        threading.Thread(
            target=_produce_share,
            args=(dsn, begin, rate, int(rate * seconds), k, producers, flush, committed, lags),
        )
        for k in range(producers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return committed, sorted(lags)


def _produce_share(
    dsn: str,
    begin: float,
    rate: float,
    total: int,
    first: int,
    step: int,
    flush: bool,
    committed: dict[Any, float],
    lags: list[tuple[float, float]],
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not flush:
            conn.execute(b"set synchronous_commit = off")
        for i in range(first, total, step):
            due = begin + i / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            lags.append((due, max(0.0, -delay)))
            row = conn.execute(
                b"select run_id from flowlane.start_flow('bench_noop', %s)", (Jsonb({"i": i}),)
            )
            committed[row.fetchone()[0]] = time.time()  # type: ignore[index]


def wait_finished(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.time() + 60
        while conn.execute(
            b"select exists (select 1 from flowlane.runs where status = 'started')"
        ).fetchone()[0]:  # type: ignore[index]
            if time.time() > deadline:
                raise SystemExit("runs still started a minute after the last start")
            time.sleep(0.1)


def pickups_of(committed: dict[Any, float], stamps: dict[Any, float]) -> list[tuple[float, float]]:
    """(commit time, pickup ms) of every run started."""
    missed = len(committed.keys() - stamps.keys())
    if missed:
        raise SystemExit(f"{missed} runs were deleted before they were read: a longer --retention")
    return sorted((at, (stamps[run] - at) * 1000) for run, at in committed.items())


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def report(
    pickups: list[tuple[float, float]],
    lags: list[tuple[float, float]],
    waits: list[tuple[float, str]],
    loads: list[tuple[float, float]],
    args: argparse.Namespace,
) -> None:
    window = args.window
    begin = pickups[0][0]
    windows: dict[int, list[float]] = collections.defaultdict(list)
    for at, ms in pickups:
        windows[int((at - begin) // window)].append(ms)
    wait_counts: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for at, event in waits:
        if at >= begin:
            wait_counts[int((at - begin) // window)][event] += 1
    window_lags: dict[int, list[float]] = collections.defaultdict(list)
    for due, lag in lags:
        window_lags[int((due - begin) // window)].append(lag)
    window_loads: dict[int, list[float]] = collections.defaultdict(list)
    for at, load in loads:
        window_loads[int((at - begin) // window)].append(load)
    print(f"{'window':>8} {'runs':>6} {'p50 ms':>7} {'p99 ms':>7} {'lag p99 ms':>10} {'load':>5}"
          "  waits (samples)")
    for w in sorted(windows):
        values = windows[w]
        lag = 1000 * percentile(window_lags[w] or [0.0], 0.99)
        load = statistics.mean(window_loads[w] or [float("nan")])
        top = ", ".join(f"{e} {n}" for e, n in wait_counts[w].most_common(4))
        print(
            f"{w * window:>7.0f}s {len(values):>6} {statistics.median(values):>7.1f}"
            f" {percentile(values, 0.99):>7.1f} {lag:>10.1f} {load:>5.1f}  {top}"
        )
    first, last = windows[min(windows)], windows[max(windows)]
    print(
        f"last / first window: p50 {statistics.median(last) / statistics.median(first):.2f}x,"
        f" p99 {percentile(last, 0.99) / percentile(first, 0.99):.2f}x"
    )
    compare_edges(pickups, loads, min(args.edge, args.seconds / 2), begin + args.seconds)


def compare_edges(
    pickups: list[tuple[float, float]], loads: list[tuple[float, float]], edge: float, end: float
) -> None:
    """The runs started in the first ``edge`` seconds against those of the last."""
    begin = pickups[0][0]
    first = [ms for at, ms in pickups if at < begin + edge]
    last = [ms for at, ms in pickups if at >= end - edge]
    load = [statistics.mean([v for at, v in loads if lo <= at < lo + edge] or [float("nan")])
            for lo in (begin, end - edge)]
    p50 = [statistics.median(first), statistics.median(last)]
    p99 = [percentile(first, 0.99), percentile(last, 0.99)]
    print(
        f"first {edge:g} s ({len(first)} runs, load {load[0]:.1f}) -> last {edge:g} s ({len(last)} runs,"
        f" load {load[1]:.1f}): p50 {p50[0]:.1f} -> {p50[1]:.1f} ms ({p50[1] / p50[0]:.2f}x),"
        f" p99 {p99[0]:.1f} -> {p99[1]:.1f} ms ({p99[1] / p99[0]:.2f}x)"
    )


def report_sizes(samples: list[tuple[float, dict[str, tuple[int, int]], int]]) -> None:
    """One row per table, one column per sample: table kB + index kB."""
    if not samples:
        return
    print("sizes, table kB + index kB, at " + ", ".join(f"{at:.0f} s" for at, _, _ in samples))
    for table in samples[0][1]:
        cells = "  ".join(f"{found[table][0] // 1024:>8d} + {found[table][1] // 1024:<8d}"
                          for _, found, _ in samples)
        print(f"{table:<24} {cells}")
    totals = "  ".join(f"{sum(a + b for a, b in found.values()) // 1024:>19d}" for _, found, _ in samples)
    print(f"{'all':<24} {totals}")
    print(f"{'runs kept':<24} " + "  ".join(f"{runs:>19d}" for _, _, runs in samples))


NOTIFY_LOCK = "Lock:object"  # the lock a notifying commit holds through its WAL flush


class Measured:
    """What one version's run recorded."""

    def __init__(self) -> None:
        self.pickups: list[tuple[float, float]] = []
        self.lags: list[tuple[float, float]] = []
        self.waits: list[tuple[float, str]] = []
        self.loads: list[tuple[float, float]] = []
        self.sizes: list[tuple[float, dict[str, tuple[int, int]], int]] = []


def measure(admin: str, template: str, repo: Path, args: argparse.Namespace, flows: Path) -> Measured:
    """Pickups, producer lags, wait and load samples, and sizes of one version on a new database."""
    found = Measured()
    stamps: dict[Any, float] = {}
    with fresh_database(admin, template) as dsn:
        pool = Workers(dsn, args.workers, repo=repo, flows=flows)
        stop, done = threading.Event(), threading.Event()
        threads = [
            threading.Thread(target=sample_waits, args=(dsn, stop, found.waits, found.loads)),
            threading.Thread(target=sample_sizes, args=(
                dsn, time.time(), args.sizes_every, args.seconds, stop, found.sizes)),
            threading.Thread(target=harvest, args=(dsn, done, stamps)),
        ]
        for thread in threads:
            thread.start()
        try:
            committed, found.lags = produce(dsn, args.rate, args.seconds, args.producers, not args.no_flush)
            wait_finished(dsn)
            threads[1].join()  # its last sample, taken at the end of the run
        finally:
            stop.set()
            done.set()
            for thread in threads:
                thread.join()
            pool.stop()
    found.pickups = pickups_of(committed, stamps)
    return found


def compare(admin: str, args: argparse.Namespace, flows: Path) -> None:
    """Both versions, round after round; one summary line per version."""
    repos = {"before": args.before.resolve(), "after": REPO}
    templates = {name: template_database(admin, repo, flows=flows) for name, repo in repos.items()}
    found: dict[str, list[float]] = {name: [] for name in repos}
    lock_waits = {name: 0 for name in repos}
    lag_p99: dict[str, list[float]] = {name: [] for name in repos}
    for r in range(args.rounds):
        for name in list(repos) if r % 2 == 0 else list(repos)[::-1]:
            run = measure(admin, templates[name], repos[name], args, flows)
            found[name].extend(ms for _, ms in run.pickups)
            lock_waits[name] += sum(1 for _, event in run.waits if event == NOTIFY_LOCK)
            lag_p99[name].append(1000 * percentile([lag for _, lag in run.lags] or [0.0], 0.99))
    minutes = args.rounds * args.seconds / 60
    print(
        f"{args.workers} workers, {args.rate:g} runs/s from {args.producers} connections"
        f"{' (commits not flushed)' if args.no_flush else ''}, {args.rounds} round(s) of"
        f" {args.seconds:g} s per version, load average {os.getloadavg()[0]:.1f} at the end"
    )
    header = f"{'version':>8} {'runs':>7} {'p50 ms':>7} {'p99 ms':>7} {'lag p99 ms':>10}"
    print(f"{header}  {NOTIFY_LOCK} samples/min")
    for name, values in found.items():
        print(
            f"{name:>8} {len(values):>7} {statistics.median(values):>7.1f} {percentile(values, 0.99):>7.1f}"
            f" {max(lag_p99[name]):>10.1f}  {lock_waits[name] / minutes:.0f}"
        )


def run_and_report(args: argparse.Namespace, flows: Path) -> None:
    with admin_server(args.dsn, "flowlane-steady-") as (admin, _):
        if args.before:
            compare(admin, args, flows)
            return
        run = measure(admin, template_database(admin, REPO, flows=flows), REPO, args, flows)
        print(
            f"{args.workers} workers, {args.rate:g} runs/s from {args.producers} connections"
            f"{' (commits not flushed)' if args.no_flush else ''} for {args.seconds:g} s,"
            f" retention {'of the flow' if args.retention is None else f'{args.retention} s'},"
            f" load average {os.getloadavg()[0]:.1f} at the end"
        )
        report(run.pickups, run.lags, run.waits, run.loads, args)
        report_sizes(run.sizes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="admin DSN (may CREATE DATABASE); default: a temporary embedded server")
    parser.add_argument("--rate", type=float, default=200.0, help="runs started per second")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long (600: ten minutes)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--producers", type=int, default=4, help="connections the starts are spread over")
    parser.add_argument(
        "--no-flush",
        action="store_true",
        help="the producers' commits do not wait for their WAL flush (tells the flush's share)",
    )
    parser.add_argument("--window", type=float, default=30.0, help="seconds per reported window")
    parser.add_argument("--edge", type=float, default=300.0,
                        help="seconds at the start and at the end compared (at most half the run)")
    parser.add_argument("--retention", type=int, metavar="SECONDS",
                        help="the flow's retention: the maintenance tick prunes its runs this old")
    parser.add_argument("--sizes-every", type=float, default=600.0, metavar="SECONDS",
                        help="seconds between samples of the tables' sizes")
    parser.add_argument("--before", type=Path, help="a tree of an older flowlane to compare")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per version with --before")
    args = parser.parse_args()
    flows = FLOWS if args.retention is None else retention_flows(args.retention)
    try:
        run_and_report(args, flows)
    finally:
        if flows != FLOWS:
            shutil.rmtree(flows)


if __name__ == "__main__":
    main()
