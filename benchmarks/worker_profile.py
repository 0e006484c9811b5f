"""Where one worker's own CPU goes while it drains a backlog: py-spy's samples, summed.

    PYTHONPATH=. python benchmarks/worker_profile.py [--tasks 30000] [--rate 500] [--top 25]

Starts a throwaway embedded PostgreSQL and one real worker process (`flowlane worker`, the
benchmarks' no-op handler, default limits), attaches `py-spy record --gil` to it, commits
--tasks one-step runs in one transaction and waits until they are drained, measured as
worker_throughput.py measures a drain. Printed: the drain's tasks/s and the server's and the
worker's CPU per task (all changed by the sampling, which stops the process to read its
stack), then the --top frames by the share of samples spent in them
(inclusive; the entry point and the event loop, in nearly every sample, left out) and in
their own code (self). Only samples that hold the GIL are taken: the time the worker spends
in Python, not waiting on the database.

py-spy is not a project dependency: `pip install py-spy` first.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.worker_throughput import (
    REPO,
    ServerCpu,
    Workers,
    admin_server,
    fresh_database,
    template_database,
    timed_drain,
)

LINE_NUMBER = re.compile(r":\d+\)$")
EVERYWHERE = 0.98  # a frame in this share of the samples is the process's entry or its loop


def py_spy() -> str:
    """py-spy next to this interpreter (a virtualenv's bin) or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


def profile_drain(
    dsn: str, tasks: int, rate: int, cpu: ServerCpu, samples: Path
) -> tuple[float, float | None, float]:
    """worker_throughput.py's drain of one worker (tasks/s, server and worker CPU ms per
    task) under py-spy, whose raw samples go to ``samples``."""
    pool = Workers(dsn, 1)
    try:
        spy = subprocess.Popen(
            [py_spy(), "record", "--gil", "--rate", str(rate), "--format", "raw",
             "--output", str(samples), "--pid", str(pool.procs[0].pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        drained = timed_drain(dsn, pool, tasks, 100, cpu)
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
        if not samples.exists():
            raise SystemExit(f"py-spy wrote no samples:\n{err.decode(errors='replace')}")
    finally:
        pool.stop()
    return drained


def shares(samples: Path) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """(samples in all, samples per frame inclusive, samples per frame's own code) from
    py-spy's raw format: one line per stack, frames joined by ';', then the count."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = [LINE_NUMBER.sub(")", frame) for frame in stack.split(";")]
        total += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    return total, inclusive, own


def report(total: int, counter: collections.Counter[str], top: int, title: str) -> None:
    """The ``top`` frames, leaving out those in (nearly) every sample: the entry point and
    the event loop, which say nothing about where the time goes."""
    print(f"{title}:")
    frames = [(frame, count) for frame, count in counter.most_common() if count < EVERYWHERE * total]
    for frame, count in frames[:top]:
        print(f"  {100 * count / total:5.1f} %  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30000, help="one-step runs in the backlog")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="frames printed per table")
    args = parser.parse_args()
    for name in ("tasks", "rate", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    py_spy()  # before a server starts: a missing tool is the first thing said
    with (
        tempfile.TemporaryDirectory(prefix="flowlane-profile-") as folder,
        admin_server(None, "flowlane-profile-") as (admin, pgdata),
        fresh_database(admin, template_database(admin, REPO)) as dsn,
    ):
        samples = Path(folder) / "samples.txt"
        rate, server_ms, worker_ms = profile_drain(dsn, args.tasks, args.rate, ServerCpu(pgdata), samples)
        total, inclusive, own = shares(samples)
    print(f"one worker drained {args.tasks} one-step runs at {rate:.0f} tasks/s, CPU per task: "
          f"server {server_ms:.3f} ms, worker {worker_ms:.3f} ms (all under py-spy); "
          f"{total} samples holding the GIL")
    report(total, inclusive, args.top, "inclusive (a frame and what it calls)")
    report(total, own, args.top, "self (a frame's own code)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
