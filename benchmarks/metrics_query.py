"""The cost of a metrics scrape's database part: ``flowlane.queue_metrics()`` (one
statement: per queue its depth, oldest message age, live workers and disabled deployments)
as the messages waiting grow.

    PYTHONPATH=. python benchmarks/metrics_query.py [--depths 0,10000,100000] [--calls 20]

On one throwaway embedded PostgreSQL, a fresh database with the benchmark flows (each flow
its own queue); ``bench_diamond``'s queue is filled to each depth with ``pgmq.send_batch``
(the other queues stay empty); printed per depth: the median and the largest of --calls
timed calls, and the plain ``select 1`` round trip beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import queued_load  # a sibling script: benchmarks/ is on sys.path when run as a script

from flowlane.core import db

QUEUE = "bench_diamond"


def timed(conn: psycopg.Connection[Any], statement: bytes, calls: int) -> list[float]:
    found = []
    for _ in range(calls):
        began = time.perf_counter()
        conn.execute(statement).fetchall()
        found.append((time.perf_counter() - began) * 1000)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="0,10000,100000")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="flowlane-bench-")
    os.chmod(tmp, 0o711)  # the server account (when run as root) must reach its data
    admin = db.EmbeddedDatabase.start_at(Path(tmp) / "pgdata")
    try:
        dsn = queued_load.fresh_database(admin)
        with psycopg.connect(dsn, autocommit=True) as conn:
            queues = conn.execute(b"select count(*) from flowlane.queues").fetchone()
            print(f"{queues[0] if queues else 0} queues; depth of {QUEUE}:")
            depth = 0
            for wanted in (int(d) for d in args.depths.split(",")):
                while depth < wanted:
                    batch = min(10000, wanted - depth)
                    conn.execute(b"select pgmq.send_batch(%s, array_fill('{}'::jsonb, array[%s]))",
                                 (QUEUE, batch))
                    depth += batch
                conn.execute(b"vacuum analyze")
                metrics = timed(conn, b"select * from flowlane.queue_metrics()", args.calls)
                ping = timed(conn, b"select 1", args.calls)
                print(f"{depth:>8}  queue_metrics median {statistics.median(metrics):6.2f} ms "
                      f"max {max(metrics):6.2f} ms   select 1 median {statistics.median(ping):5.2f} ms",
                      flush=True)
    finally:
        db.EmbeddedDatabase.stop_at(Path(tmp) / "pgdata")


if __name__ == "__main__":
    main()
