"""requeue_stalled_tasks and delete_flow_and_data cost against the size of the tables.

    PYTHONPATH=. python benchmarks/recovery_scaling.py [--sizes 10000 100000] [--work 100]

What it measures: that recovering stalled tasks and deleting a flow cost what their work
costs, not what the tables hold. For each size N, a fresh database on one embedded PostgreSQL gets N finished
one-step runs (started with start_flows, claimed with claim_tasks, completed
with complete_tasks), then --work more runs whose tasks are claimed and
backdated past their stall deadline, and 5 small flows of --work runs.
Measured: requeue_stalled_tasks() handling the --work stalled tasks (one
call), and the median of 5 calls of requeue_stalled_tasks() with nothing to
do and of delete_flow_and_data of a small flow. The cost should follow the
work (the same for every N), not the tables: the ratio column divides by the
smallest size's figure, in the same run.

How to read it: with 10x the finished runs, each ratio should stay far below 10x (a scan of
the tables would grow with them); single calls of a few ms vary by 1.5-2x on a shared
machine, so rerun before reading a trend into one figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowlane.core import db, migrator

Conn = psycopg.Connection[Any]
REPEAT = 5


def fill(conn: Conn, flow: str, runs: int, worker: uuid.UUID, *, finish: bool) -> None:
    pairs = json.dumps([[flow, "only"]])
    for offset in range(0, runs, 5000):
        inputs = [json.dumps({"i": i}) for i in range(offset, min(runs, offset + 5000))]
        conn.execute("select count(*) from flowlane.start_flows(%s, %s::jsonb[])", (flow, inputs))
    while True:
        claimed = conn.execute(
            "select run_id, step_slug, task_index, attempt from flowlane.claim_tasks(%s, 1000, %s, %s::jsonb)"
            " where outcome = 'claimed'",
            (flow, worker, pairs),
        ).fetchall()
        if not claimed or not finish:
            return
        results = [
            {
                "run_id": str(r),
                "step_slug": s,
                "task_index": i,
                "output": {},
                "worker_id": str(worker),
                "attempt": a,
            }
            for r, s, i, a in claimed
        ]
        conn.execute("select count(*) from flowlane.complete_tasks(%s::jsonb)", (json.dumps(results),))


def timed(conn: Conn, statement: str, params: tuple[Any, ...] = ()) -> tuple[float, Any]:
    start = time.perf_counter()
    row = conn.execute(statement, params).fetchone()
    return (time.perf_counter() - start) * 1000, row[0] if row else None


def measure(admin: str, size: int, work: int) -> dict[str, float]:
    name = f"scale_{size}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"create database {name}".encode())
    with psycopg.connect(psycopg.conninfo.make_conninfo(admin, dbname=name), autocommit=True) as conn:
        migrator.ensure_pgmq(conn)
        migrator.migrate(conn)
        conn.execute("select flowlane.create_flow('big', timeout => 3)")
        conn.execute("select flowlane.add_step('big', 'only')")
        worker = uuid.uuid4()
        fill(conn, "big", size, worker, finish=True)
        fill(conn, "big", work, worker, finish=False)
        for i in range(REPEAT):
            conn.execute("select flowlane.create_flow(%s, timeout => 3)", (f"small{i}",))
            conn.execute("select flowlane.add_step(%s, 'only')", (f"small{i}",))
            fill(conn, f"small{i}", work, worker, finish=False)
        conn.execute("vacuum analyze")
        conn.execute(
            "update flowlane.step_tasks set started_at = now() - interval '1 hour', "
            "queued_at = now() - interval '1 hour' where status = 'started' and flow_slug = 'big'"
        )
        requeue_ms, handled = timed(conn, "select flowlane.requeue_stalled_tasks()")
        if handled != work:
            raise SystemExit(f"requeue_stalled_tasks handled {handled}, expected {work}")
        # the median of REPEAT calls: the machine is noisy
        idle = [timed(conn, "select flowlane.requeue_stalled_tasks()")[0] for _ in range(REPEAT)]
        delete = [
            timed(conn, "select flowlane.delete_flow_and_data(%s)", (f"small{i}",))[0] for i in range(REPEAT)
        ]
        tasks = conn.execute("select count(*) from flowlane.step_tasks").fetchone()
    return {
        "tasks": float(tasks[0] if tasks else 0),
        "requeue": requeue_ms,
        "idle": statistics.median(idle),
        "delete": statistics.median(delete),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--work", type=int, default=100)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flowlane-bench-"))
    tmp.chmod(0o711)  # run as root, the server account must reach its data directory
    pgdata = tmp / "data"
    try:
        admin = db.EmbeddedDatabase.start_at(pgdata)
        results = {size: measure(admin, size, args.work) for size in args.sizes}
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(tmp, ignore_errors=True)
    base = results[args.sizes[0]]
    print(f"{args.work} stalled tasks / {args.work} runs to delete; times in ms (ratio to {args.sizes[0]})")
    print(
        f"{'finished runs':>13} {'tasks':>8} {'requeue stalled':>22}"
        f" {'requeue, nothing':>22} {'delete flow':>22}"
    )
    for size, r in results.items():
        cells = " ".join(f"{r[k]:>13.1f} ({r[k] / base[k]:4.2f}x)" for k in ("requeue", "idle", "delete"))
        print(f"{size:>13} {int(r['tasks']):>8} {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
