"""Where a worker's loop spends the server's time: pg_stat_statements per statement, before and after.

    python benchmarks/statement_profile.py [--runs 3000] [--before 0012] [--batch 50] [--top 15]

One embedded PostgreSQL with pg_stat_statements, two databases: `before` migrated to
--before, `after` to head. In each, --runs one-step runs are queued, then drained by one loop
of claim_tasks + complete_tasks (batches of --batch, 50 by default, like a worker's poller
and flusher on one connection), with pg_stat_statements.track = all. Printed per database:
tasks/s, the backend's CPU per task (/proc), statements per task (nested ones included) and
the --top statements by server time per task, with their calls per task. A warm-up drain of
the same size runs first, so that plans and caches are made outside the measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_throughput import (
    Conn,
    Driver,
    Q,
    backend_cpu,
    define,
    migrated_database,
    scalar,
    statements_server,
)

TOP_STATEMENTS = """
select calls, total_exec_time, query from pg_stat_statements
where dbid = (select oid from pg_database where datname = current_database())
  and query !~* 'pg_stat_statements'
order by total_exec_time desc
"""


def profile(conn: Conn, runs: int, top: int, batch: int) -> None:
    driver = Driver(conn, True, batch, 10)
    for measured in (False, True):
        driver.start("bench_one", runs)
        if measured:
            conn.execute("set pg_stat_statements.track = 'all'")
            conn.execute(Q["statements_reset"])
        pid = scalar(conn, "backend_pid")
        cpu0, start = backend_cpu(pid), time.perf_counter()
        tasks = driver.drive("bench_one")
        seconds, cpu = time.perf_counter() - start, backend_cpu(pid) - cpu0
    conn.execute("set pg_stat_statements.track = 'none'")
    rows: list[tuple[Any, ...]] = conn.execute(TOP_STATEMENTS.encode()).fetchall()
    statements = sum(r[0] for r in rows)
    print(
        f"  {tasks / seconds:.0f} tasks/s, backend CPU {1000 * cpu / tasks:.3f} ms/task, "
        f"{statements / tasks:.1f} statements/task"
    )
    print(f"  {'calls/task':>10} {'µs/task':>8}  statement")
    for calls, exec_ms, query in rows[:top]:
        print(f"  {calls / tasks:10.2f} {1000 * exec_ms / tasks:8.1f}  {' '.join(query.split())[:110]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000, help="one-step runs queued, then drained")
    parser.add_argument("--before", default="0012", help="the migration the 'before' database stops at")
    parser.add_argument("--batch", type=int, default=50, help="tasks per claim and per completion")
    parser.add_argument("--top", type=int, default=15, help="statements listed per database")
    args = parser.parse_args()
    with statements_server("flowlane-profile-") as admin:
        for version, to in (("before", args.before), ("after", None)):
            with migrated_database(admin, f"profile_{version}", to) as conn:
                define(conn)
                print(
                    f"{version} (migrations {scalar(conn, 'migration_versions')}), {args.runs} queued runs:"
                )
                profile(conn, args.runs, args.top, args.batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
