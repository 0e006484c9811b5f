"""Pickup latency at a steady rate: does it stay flat over time, or creep?

    PYTHONPATH=. python benchmarks/steady_rate.py [--rate 200] [--seconds 120] [--workers 2]
        [--producers 4] [--no-flush] [--window 30] [--dsn DSN] [--before DIR [--rounds 2]]

What it measures: that a deployment serving a steady stream of runs picks each one up in
milliseconds, and keeps doing so as its tables grow.

Producers start one-step runs (`start_flow`, one per transaction) at --rate per second in
all, spread over --producers connections (one connection waits for each start's WAL flush,
which on this machine's shared disk caps it near 120 starts per second), for --seconds (600
for ten minutes) while --workers real worker processes (no-op handler, notifications on)
serve them. --no-flush: the producers' commits do not wait for their WAL flush, which tells
the flush's share of what a run shows. Pickup latency is start_flow's commit to the
handler's start (the handler stamps the time). Printed per --window seconds: runs, pickup
p50 / p99, the producers' lag behind their schedule, and what the server's backends waited
on (pg_stat_activity sampled every 100 ms: wait events of the workers' and the producers'
connections); then the last window against the first. The database is new, so the tables
grow from empty as in a fresh deployment.

With --before DIR (a tree of an older flowlane, `git archive REV | tar -x -C DIR`), each of
--rounds rounds measures both versions one after the other (which goes first alternates), each
on a new database with its own migrations and its own workers, and prints one line per version:
pickup p50 / p99 over all its rounds, and the samples per minute of backends waiting for the
lock that serialises notifying commits (`Lock:object`).

How to read it: the last line, the last window's p50 and p99 against the first window's of
the same run, should stay near 1x; a steady climb from window to window is a creep. The
producers' lag should stay near 0 (otherwise the rate was not reached).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.worker_throughput import (  # noqa: E402
    Workers,
    admin_server,
    fresh_database,
    template_database,
)

WAITS = b"""
select coalesce(wait_event_type || ':' || wait_event, 'on cpu') from pg_stat_activity
where datname = current_database() and pid <> pg_backend_pid() and state = 'active'
"""


def sample_waits(dsn: str, stop: threading.Event, samples: list[tuple[float, str]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            now = time.time()
            samples.extend((now, row[0]) for row in conn.execute(WAITS).fetchall())
            time.sleep(0.1)


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


def collect(dsn: str, committed: dict[Any, float]) -> list[tuple[float, float]]:
    """(commit time, pickup ms) of every run, once all have completed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.time() + 60
        while conn.execute(
            b"select exists (select 1 from flowlane.runs where status = 'started')"
        ).fetchone()[0]:  # type: ignore[index]
            if time.time() > deadline:
                raise SystemExit("runs still started a minute after the last start")
            time.sleep(0.1)
        rows = conn.execute(b"select run_id, output from flowlane.runs").fetchall()
    return sorted((committed[r], (out["only"]["t"] - committed[r]) * 1000) for r, out in rows)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def report(
    pickups: list[tuple[float, float]],
    lags: list[tuple[float, float]],
    waits: list[tuple[float, str]],
    window: float,
) -> None:
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
    print(f"{'window':>8} {'runs':>6} {'p50 ms':>7} {'p99 ms':>7} {'lag p99 ms':>10}  waits (samples)")
    for w in sorted(windows):
        values = windows[w]
        lag = 1000 * percentile(window_lags[w] or [0.0], 0.99)
        top = ", ".join(f"{e} {n}" for e, n in wait_counts[w].most_common(4))
        print(
            f"{w * window:>7.0f}s {len(values):>6} {statistics.median(values):>7.1f}"
            f" {percentile(values, 0.99):>7.1f} {lag:>10.1f}  {top}"
        )
    first, last = windows[min(windows)], windows[max(windows)]
    print(
        f"last / first window: p50 {statistics.median(last) / statistics.median(first):.2f}x,"
        f" p99 {percentile(last, 0.99) / percentile(first, 0.99):.2f}x"
    )


NOTIFY_LOCK = "Lock:object"  # the lock a notifying commit holds through its WAL flush


def measure(
    admin: str, template: str, repo: Path, args: argparse.Namespace
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[tuple[float, str]]]:
    """(pickups, producer lags, wait samples) of one version on a new database."""
    with fresh_database(admin, template) as dsn:
        pool = Workers(dsn, args.workers, repo=repo)
        stop, waits = threading.Event(), []  # type: ignore[var-annotated]
        sampler = threading.Thread(target=sample_waits, args=(dsn, stop, waits))
        sampler.start()
        try:
            committed, lags = produce(dsn, args.rate, args.seconds, args.producers, not args.no_flush)
            pickups = collect(dsn, committed)
        finally:
            stop.set()
            sampler.join()
            pool.stop()
    return pickups, lags, waits


def compare(admin: str, args: argparse.Namespace) -> None:
    """Both versions, round after round; one summary line per version."""
    repos = {"before": args.before.resolve(), "after": REPO}
    templates = {name: template_database(admin, repo) for name, repo in repos.items()}
    found: dict[str, list[float]] = {name: [] for name in repos}
    lock_waits = {name: 0 for name in repos}
    lag_p99: dict[str, list[float]] = {name: [] for name in repos}
    for r in range(args.rounds):
        for name in list(repos) if r % 2 == 0 else list(repos)[::-1]:
            pickups, lags, waits = measure(admin, templates[name], repos[name], args)
            found[name].extend(ms for _, ms in pickups)
            lock_waits[name] += sum(1 for _, event in waits if event == NOTIFY_LOCK)
            lag_p99[name].append(1000 * percentile([lag for _, lag in lags] or [0.0], 0.99))
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
    parser.add_argument("--before", type=Path, help="a tree of an older flowlane to compare")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per version with --before")
    args = parser.parse_args()
    with admin_server(args.dsn, "flowlane-steady-") as (admin, _):
        if args.before:
            compare(admin, args)
            return
        pickups, lags, waits = measure(admin, template_database(admin, REPO), REPO, args)
        print(
            f"{args.workers} workers, {args.rate:g} runs/s from {args.producers} connections"
            f"{' (commits not flushed)' if args.no_flush else ''} for {args.seconds:g} s, "
            f"load average {os.getloadavg()[0]:.1f} at the end"
        )
        report(pickups, lags, waits, args.window)


if __name__ == "__main__":
    main()
