"""Engine throughput against raw PGMQ on the same embedded database, in one run.

    python benchmarks/engine_throughput.py [--messages N] [--runs N] [--rounds N] [--to VERSION]

(a) raw PGMQ: send N messages one by one, then read batches of 10 and
    archive each message: messages/s for the full send + read + archive cycle.
(b) the SQL Core driven by one loop (read a batch of 10, start_tasks,
    complete_task per task) for a 1-step and a 3-step chain flow:
    start_flow runs/s, tasks/s for the drive, and end-to-end tasks/s
    (start_flow included), and the ratio of engine tasks/s to raw messages/s.

The workloads run interleaved in rounds (rotating order), so that load from
other processes on a shared machine affects (a) and (b) alike.

Every call is its own autocommit transaction, like a worker's. The database
is a fresh embedded PostgreSQL in a temporary directory, removed afterwards.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowlane.core import db, migrator

_HEADER = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.MULTILINE)


def load_queries() -> dict[str, LiteralString]:
    text = Path(__file__).with_suffix(".sql").read_text(encoding="utf-8")
    headers = list(_HEADER.finditer(text))
    queries = {}
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        end = following.start() if following else len(text)
        queries[header["name"]] = text[header.end() : end].strip()
    return queries


Q = load_queries()


def raw_round(conn: psycopg.Connection[Any], messages: int) -> float:
    """Seconds to send ``messages`` one by one, then read them in batches of 10 and archive each."""
    start = time.perf_counter()
    for i in range(messages):
        conn.execute(Q["send"], {"queue": "bench_raw", "body": Jsonb({"i": i})})
    done = 0
    while done < messages:
        ids = [r[0] for r in conn.execute(Q["read"], {"queue": "bench_raw", "qty": 10})]
        if not ids:
            raise RuntimeError("raw queue ran dry early")
        for msg_id in ids:
            conn.execute(Q["archive"], {"queue": "bench_raw", "msg_id": msg_id})
        done += len(ids)
    return time.perf_counter() - start


def define(conn: psycopg.Connection[Any], flow: str, steps: int) -> None:
    with conn.transaction():
        conn.execute(Q["create_flow"], {"flow": flow})
        for i in range(steps):
            deps = [f"s{i - 1}"] if i else []
            conn.execute(Q["add_step"], {"flow": flow, "step": f"s{i}", "deps": deps})


def engine_round(
    conn: psycopg.Connection[Any], flow: str, runs: int, worker_id: uuid.UUID
) -> tuple[float, float, int]:
    """(seconds in start_flow, seconds driving the queue empty, tasks completed)."""
    t0 = time.perf_counter()
    for i in range(runs):
        conn.execute(Q["start_flow"], {"flow": flow, "input": Jsonb({"i": i})})
    t1 = time.perf_counter()
    tasks = 0
    while True:
        ids = [r[0] for r in conn.execute(Q["read"], {"queue": flow, "qty": 10})]
        if not ids:
            break
        claimed = conn.execute(
            Q["start_tasks"], {"queue": flow, "msg_ids": ids, "worker_id": worker_id}
        ).fetchall()
        for run_id, step, index, attempt in claimed:
            conn.execute(
                Q["complete_task"],
                {
                    "run_id": run_id,
                    "step": step,
                    "task_index": index,
                    "output": Jsonb({"ok": True}),
                    "worker_id": worker_id,
                    "attempt": attempt,
                },
            )
            tasks += 1
    return t1 - t0, time.perf_counter() - t1, tasks


def measure(conn: psycopg.Connection[Any], messages: int, runs: int, rounds: int) -> None:
    """Interleave the workloads in rounds so that load drift on a shared machine hits all alike."""
    conn.execute(Q["create_queue"], {"queue": "bench_raw"})
    flows = {"bench_one": 1, "bench_three": 3}
    for flow, steps in flows.items():
        define(conn, flow, steps)
    worker_id = uuid.uuid4()
    raw_seconds = 0.0
    totals: dict[str, list[float]] = {flow: [0.0, 0.0, 0.0] for flow in flows}
    for r in range(rounds):
        order = ["raw", *flows]
        order = order[r % len(order) :] + order[: r % len(order)]
        for item in order:
            if item == "raw":
                raw_seconds += raw_round(conn, messages // rounds)
            else:
                start_s, drive_s, tasks = engine_round(conn, item, runs // rounds, worker_id)
                totals[item][0] += start_s
                totals[item][1] += drive_s
                totals[item][2] += tasks
    raw = (messages // rounds * rounds) / raw_seconds
    print(f"(a) raw PGMQ send+read+archive: {raw:8.1f} messages/s")
    for flow, steps in flows.items():
        start_s, drive_s, tasks_f = totals[flow]
        tasks = int(tasks_f)
        done = conn.execute(Q["completed_runs"], {"flow": flow}).fetchone()
        n_runs = runs // rounds * rounds
        if done is None or done[0] != n_runs or tasks != n_runs * steps:
            raise RuntimeError(f"{flow}: {done} runs completed, {tasks} tasks")
        drive = tasks / drive_s
        e2e = tasks / (start_s + drive_s)
        print(
            f"(b) {steps}-step flow, {n_runs} runs: start_flow {n_runs / start_s:7.1f} runs/s, "
            f"drive {drive:7.1f} tasks/s, end-to-end {e2e:7.1f} tasks/s; "
            f"ratio to raw: drive {drive / raw:4.2f}, end-to-end {e2e / raw:4.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000, help="raw PGMQ messages")
    parser.add_argument("--runs", type=int, default=600, help="runs per engine flow")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds")
    parser.add_argument(
        "--to", metavar="VERSION", help="migrate only up to this version (e.g. 0001)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flowlane-bench-"))
    tmp.chmod(0o711)  # run as root, the server account must reach its data directory
    pgdata = tmp / "data"
    try:
        dsn = db.EmbeddedDatabase.start_at(pgdata)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrator.migrate(conn, to=args.to)
            versions = conn.execute(Q["migration_versions"]).fetchone()
            print(f"flowlane migrations: {versions[0] if versions else '?'}")
            measure(conn, args.messages, args.runs, args.rounds)
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
