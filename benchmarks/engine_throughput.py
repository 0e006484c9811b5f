"""The SQL Core driven by one loop against raw PGMQ on the same database, in one run.

    PYTHONPATH=. python benchmarks/engine_throughput.py [--runs 600] [--batch 50] [--rounds 3]
        [--map-items 1000]

What it measures: the engine's own SQL cost, without worker processes: how many tasks per
second one connection drives through the engine's functions, next to raw PGMQ moving the
same number of messages (send, read, archive) on the same database. One embedded
PostgreSQL (pg_stat_statements preloaded), one database migrated to head. Every workload is
driven by one loop on one connection, each call its own autocommit transaction (like a
worker), in --rounds rounds with a rotating order so that load from other processes on a
shared machine hits all alike.

raw single   pgmq.send one message, read 1, archive 1 (per message)
raw batched  pgmq.send_batch of --batch, read --batch, archive the array
per-task     start_flow per run; read --batch + start_tasks, complete_task per task (the
             single calls, as a web request or a worker in another language makes them)
set-based    start_flows of the runs; claim_tasks of --batch and one complete_tasks per
             batch (what `flowlane worker` does)

Workloads: 1-step and 3-step chains (--runs runs per round), and a map fan-out (a step
returning --map-items items, then a map step over them; one run per round). bench_noarch
is the 1-step chain on a queue whose archive is off (`archive: false` in its `kind: queue`
document: the messages of ended tasks are deleted, not archived), timed in the same rounds.

How to read it: the columns drive/raw1 and e2e/raw1 are each workload's tasks/s over raw
single's messages/s measured in the same run; compare those ratios between runs, never the
absolute rates (a shared machine's speed drifts). The last lines give set-based over
per-task for each workload, and the 1-step chain with its archive off over on. "drive" is
claim + complete of queued tasks; "e2e" adds the starts. CPU ms/task is the database
backend's CPU time (utime + stime from /proc/<pid>/stat) per completed task; stmts/task
counts every statement the server executed, nested ones included (pg_stat_statements.track
= all, measured in a separate pass so that tracking does not slow the timed ones). HOT:
n_tup_hot_upd / n_tup_upd of flowlane.step_tasks over the whole run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowlane.core import db, migrator
from flowlane.core.queries import named_blocks

TICK = os.sysconf("SC_CLK_TCK")


def load_queries(path: Path) -> dict[str, LiteralString]:
    """A benchmark's named statements, in the package's format (the .sql file beside it)."""
    return dict(named_blocks(path.read_text(encoding="utf-8")))


Q = load_queries(Path(__file__).with_suffix(".sql"))
Conn = psycopg.Connection[Any]


def scalar(conn: Conn, query: str, **params: Any) -> Any:
    row = conn.execute(Q[query], params).fetchone()
    assert row is not None
    return row[0]


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class Totals:
    start_s: float = 0.0
    drive_s: float = 0.0
    cpu_s: float = 0.0
    tasks: int = 0
    runs: int = 0
    statements: float = field(default=0.0)


# -- raw PGMQ -------------------------------------------------------------------


def raw_single(conn: Conn, n: int, batch: int) -> tuple[float, int]:
    start = time.perf_counter()
    for i in range(n):
        conn.execute(Q["send"], {"queue": "bench_raw", "body": Jsonb({"i": i})})
        [(msg_id,)] = conn.execute(Q["read"], {"queue": "bench_raw", "qty": 1}).fetchall()
        conn.execute(Q["archive"], {"queue": "bench_raw", "msg_id": msg_id})
    return time.perf_counter() - start, n


def raw_batched(conn: Conn, n: int, batch: int) -> tuple[float, int]:
    start = time.perf_counter()
    for offset in range(0, n, batch):
        bodies = [json.dumps({"i": i}) for i in range(offset, min(n, offset + batch))]
        conn.execute(Q["send_batch"], {"queue": "bench_raw", "bodies": bodies})
        ids = [r[0] for r in conn.execute(Q["read"], {"queue": "bench_raw", "qty": batch})]
        conn.execute(Q["archive_batch"], {"queue": "bench_raw", "msg_ids": ids})
    return time.perf_counter() - start, n


# -- the engine -----------------------------------------------------------------

FLOWS = {"bench_one": 1, "bench_noarch": 1, "bench_three": 3, "bench_map": 0}
UNARCHIVED = "bench_noarch"  # its queue's archive is off (measure sets it)


def define(conn: Conn) -> None:
    conn.execute(Q["create_queue"], {"queue": "bench_raw"})
    with conn.transaction():
        for flow, steps in FLOWS.items():
            conn.execute(Q["create_flow"], {"flow": flow})
            if steps:
                for i in range(steps):
                    deps = [f"s{i - 1}"] if i else []
                    conn.execute(
                        Q["add_step"], {"flow": flow, "step": f"s{i}", "deps": deps, "step_type": "single"}
                    )
            else:
                conn.execute(Q["add_step"], {"flow": flow, "step": "s0", "deps": [], "step_type": "single"})
                conn.execute(Q["add_step"], {"flow": flow, "step": "s1", "deps": ["s0"], "step_type": "map"})


class Driver:
    def __init__(self, conn: Conn, set_based: bool, batch: int, map_items: int) -> None:
        self.conn = conn
        self.set_based = set_based
        self.batch = batch
        self.map_items = map_items
        self.worker_id = uuid.uuid4()
        self.pairs = {flow: json.dumps(scalar(conn, "pairs", queue=flow)) for flow in FLOWS}

    def start(self, flow: str, runs: int) -> None:
        inputs = [{"i": i} for i in range(runs)]
        if self.set_based:
            for offset in range(0, runs, 500):
                chunk = [json.dumps(x) for x in inputs[offset : offset + 500]]
                self.conn.execute(Q["start_flows"], {"flow": flow, "inputs": chunk})
        else:
            for x in inputs:
                self.conn.execute(Q["start_flow"], {"flow": flow, "input": Jsonb(x)})

    def output(self, flow: str, step: str) -> Any:
        if flow == "bench_map" and step == "s0":
            return list(range(self.map_items))
        return {"ok": True}

    def claim(self, flow: str) -> list[tuple[Any, ...]]:
        if self.set_based:
            params = {
                "queue": flow,
                "qty": self.batch,
                "worker_id": self.worker_id,
                "pairs": self.pairs[flow],
            }
            return self.conn.execute(Q["claim_tasks"], params).fetchall()
        ids = [r[0] for r in self.conn.execute(Q["read"], {"queue": flow, "qty": self.batch})]
        if not ids:
            return []
        params = {"queue": flow, "msg_ids": ids, "worker_id": self.worker_id, "pairs": self.pairs[flow]}
        return self.conn.execute(Q["start_tasks"], params).fetchall()

    def drive(self, flow: str) -> int:
        tasks = 0
        while driven := self.drive_batch(flow):
            tasks += driven
        return tasks

    def drive_batch(self, flow: str) -> int:
        """One claim of up to ``batch`` queued tasks and their completions: how many."""
        claimed = self.claim(flow)
        if claimed:
            if self.set_based:
                results = [
                    {
                        "run_id": str(run_id),
                        "step_slug": step,
                        "task_index": index,
                        "output": self.output(flow, step),
                        "worker_id": str(self.worker_id),
                        "attempt": attempt,
                    }
                    for run_id, step, index, attempt in claimed
                ]
                self.conn.execute(Q["complete_tasks"], {"results": json.dumps(results)})
            else:
                for run_id, step, index, attempt in claimed:
                    params = {
                        "run_id": run_id,
                        "step": step,
                        "task_index": index,
                        "output": Jsonb(self.output(flow, step)),
                        "worker_id": self.worker_id,
                        "attempt": attempt,
                    }
                    self.conn.execute(Q["complete_task"], params)
        return len(claimed)


def engine_round(driver: Driver, flow: str, runs: int, totals: Totals) -> None:
    pid = scalar(driver.conn, "backend_pid")
    cpu0 = backend_cpu(pid)
    t0 = time.perf_counter()
    driver.start(flow, runs)
    t1 = time.perf_counter()
    tasks = driver.drive(flow)
    totals.drive_s += time.perf_counter() - t1
    totals.start_s += t1 - t0
    totals.cpu_s += backend_cpu(pid) - cpu0
    totals.tasks += tasks
    totals.runs += runs


def count_statements(conn: Conn, work: Callable[[], int]) -> float:
    conn.execute("set pg_stat_statements.track = 'all'")
    conn.execute(Q["statements_reset"])
    done = work()
    count = int(scalar(conn, "statements_count"))
    conn.execute("set pg_stat_statements.track = 'none'")
    return count / done


# -- the run ----------------------------------------------------------------------


MODES = ("per-task", "set-based")


def measure(conn: Conn, runs: int, batch: int, rounds: int, map_items: int) -> None:
    define(conn)
    conn.execute(Q["set_archive"], {"queue": UNARCHIVED, "archive": False})
    conn.execute("set pg_stat_statements.track = 'none'")
    raw = {"raw single": raw_single, "raw batched": raw_batched}
    raw_totals = {name: Totals() for name in raw}
    cells = [(mode, flow) for flow in FLOWS for mode in MODES]
    totals = {cell: Totals() for cell in cells}
    drivers = {mode: Driver(conn, mode == "set-based", batch, map_items) for mode in MODES}
    per_round = max(1, runs // rounds)
    items: list[Any] = [*raw, *cells]
    for r in range(rounds):
        shift = r % len(items)
        for item in items[shift:] + items[:shift]:
            if item in raw:
                pid = scalar(conn, "backend_pid")
                cpu0 = backend_cpu(pid)
                seconds, n = raw[item](conn, per_round * 2, batch)
                raw_totals[item].drive_s += seconds
                raw_totals[item].cpu_s += backend_cpu(pid) - cpu0
                raw_totals[item].tasks += n
            else:
                mode, flow = item
                flow_runs = 1 if flow == "bench_map" else per_round
                engine_round(drivers[mode], flow, flow_runs, totals[item])
    # statements per task, in a separate pass
    for name, fn in raw.items():
        raw_totals[name].statements = count_statements(conn, lambda fn=fn: fn(conn, 100, batch)[1])
    for cell in cells:
        mode, flow = cell
        driver = drivers[mode]
        n = 1 if flow == "bench_map" else 50

        def work(driver: Driver = driver, flow: str = flow, n: int = n) -> int:
            driver.start(flow, n)
            return driver.drive(flow)

        totals[cell].statements = count_statements(conn, work)
    report(raw_totals, totals, conn)


def rate(t: Totals) -> tuple[float, float]:
    """Tasks per second: driven (claim + complete), and end to end (with the starts)."""
    return t.tasks / t.drive_s, t.tasks / (t.start_s + t.drive_s)


def report(raw_totals: dict[str, Totals], totals: dict[tuple[str, str], Totals], conn: Conn) -> None:
    raw1 = raw_totals["raw single"].tasks / raw_totals["raw single"].drive_s
    print("raw PGMQ, one loop (messages/s = send + read + archive):")
    for name, t in raw_totals.items():
        msgs = t.tasks / t.drive_s
        print(
            f"  {name:<12} {msgs:9.0f} msg/s  ratio to raw single {msgs / raw1:5.2f}"
            f"  cpu {1000 * t.cpu_s / t.tasks:6.3f} ms/msg  statements/msg {t.statements:5.1f}"
        )
    print()
    header = (
        f"{'workload':<12} {'mode':<10} {'start runs/s':>12} {'drive tasks/s':>13}"
        f" {'e2e tasks/s':>11} {'drive/raw1':>10} {'e2e/raw1':>8} {'cpu ms/task':>11} {'stmts/task':>10}"
    )
    print(header)
    for (mode, flow), t in totals.items():
        drive, e2e = rate(t)
        print(
            f"{flow:<12} {mode:<10} {t.runs / t.start_s:12.0f} {drive:13.0f} {e2e:11.0f}"
            f" {drive / raw1:10.2f} {e2e / raw1:8.2f} {1000 * t.cpu_s / t.tasks:11.3f} {t.statements:10.1f}"
        )
    print()
    for flow in FLOWS:
        if unfinished := scalar(conn, "unfinished_runs", flow=flow):
            raise SystemExit(f"{flow}: {unfinished} runs did not complete")
    conn.execute(Q["stats_flush"])
    updates, hot = conn.execute(Q["task_updates"]).fetchone() or (0, 0)
    print(f"step_tasks updates {updates}, HOT {hot} ({100 * hot / max(updates, 1):.0f} %)")
    print()
    for flow in FLOWS:
        (old_drive, old_e2e), (new_drive, new_e2e) = (rate(totals[(mode, flow)]) for mode in MODES)
        old, new = totals[("per-task", flow)], totals[("set-based", flow)]
        print(
            f"{flow}: set-based / per-task: drive {new_drive / old_drive:5.2f}x,"
            f" end to end {new_e2e / old_e2e:5.2f}x,"
            f" cpu/task {(new.cpu_s / new.tasks) / (old.cpu_s / old.tasks):5.2f}x"
        )
    for mode in MODES:
        (on_drive, on_e2e), (off_drive, off_e2e) = (rate(totals[(mode, flow)])
                                                     for flow in ("bench_one", UNARCHIVED))
        on, off = totals[(mode, "bench_one")], totals[(mode, UNARCHIVED)]
        print(
            f"bench_one {mode}: archive off / on: drive {off_drive / on_drive:5.2f}x,"
            f" end to end {off_e2e / on_e2e:5.2f}x,"
            f" cpu/task {(off.cpu_s / off.tasks) / (on.cpu_s / on.tasks):5.2f}x"
        )


@contextlib.contextmanager
def statements_server(prefix: str) -> Iterator[str]:
    """A throwaway embedded server with pg_stat_statements preloaded: its admin DSN."""
    with statements_pgdata(prefix) as pgdata:
        yield start_server_with_statements(pgdata)


@contextlib.contextmanager
def statements_pgdata(prefix: str) -> Iterator[Path]:
    """A throwaway data directory, its server stopped and the directory removed at the end."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o711)  # run as root, the server account must reach its data directory
    pgdata = tmp / "data"
    try:
        yield pgdata
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)
        shutil.rmtree(tmp, ignore_errors=True)


def start_server_with_statements(pgdata: Path) -> str:
    """An embedded server at ``pgdata`` with pg_stat_statements preloaded; its admin DSN."""
    admin = db.EmbeddedDatabase.start_at(pgdata)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("alter system set shared_preload_libraries = 'pg_stat_statements'")
    db.EmbeddedDatabase.stop_at(pgdata)
    return db.EmbeddedDatabase.start_at(pgdata)


MIGRATE = (
    "import sys, psycopg; from flowlane.core import migrator; "
    "c = psycopg.connect(sys.argv[1], autocommit=True); migrator.ensure_pgmq(c); migrator.migrate(c)"
)


def migrate_with(checkout: Path, dsn: str) -> None:
    """``dsn`` migrated to head by the migrations of ``checkout`` (another flowlane's tree)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    env.pop("FLOWLANE_DSN", None)
    # cwd too: "python -c" puts the working directory ahead of PYTHONPATH
    subprocess.run([sys.executable, "-c", MIGRATE, dsn], check=True, env=env, cwd=checkout)


def migrated_database(admin: str, name: str, checkout: Path | None = None) -> Conn:
    """A new database ``name`` with pg_stat_statements and PGMQ, migrated to head by this
    checkout's migrations, or by ``checkout``'s."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"create database {name}".encode())
    dsn = psycopg.conninfo.make_conninfo(admin, dbname=name)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("create extension pg_stat_statements")
    if checkout is None:
        migrator.ensure_pgmq(conn)
        migrator.migrate(conn)
    else:
        migrate_with(checkout, dsn)
    return conn


WARM_UP = 50  # untimed calls of each kind first: plans made, caches warm, as in a long-running process
Timed = Callable[[int], tuple[Conn, str, Any]]  # call number -> (connection, statement, params)


def medians_ms(kinds: Mapping[str, Timed], calls: int,
               prepare: Mapping[str, Callable[[int], Any]] | None = None) -> dict[str, float]:
    """The median wall time of each kind's statement over ``calls`` calls, the kinds alternating
    (so that the machine's load falls on all alike); ``prepare`` (per kind, optional) runs
    untimed before its call."""
    prepare = prepare or {}
    for n in range(WARM_UP):
        for kind, make in kinds.items():
            if kind in prepare:
                prepare[kind](-n - 1)
            conn, statement, params = make(-n - 1)
            conn.execute(statement, params).fetchall()
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for n in range(calls):
        for kind, make in kinds.items():
            if kind in prepare:
                prepare[kind](n)
            conn, statement, params = make(n)
            start = time.perf_counter()
            conn.execute(statement, params).fetchall()
            times[kind].append((time.perf_counter() - start) * 1000)
    return {kind: statistics.median(taken) for kind, taken in times.items()}


def backend_cpu_ns(pid: int) -> int:
    """CPU time (ns) a backend process has used so far, from /proc/<pid>/schedstat."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def pin_backends(conns: Iterable[Conn]) -> None:
    """The client on the first CPU, the databases' backends together on the second: two
    backends the scheduler placed apart measured up to 1.3x apart with the same code."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    os.sched_setaffinity(0, {cpus[0]})
    for conn in conns:
        os.sched_setaffinity(conn.info.backend_pid, {cpus[1]})


@contextlib.contextmanager
def before_and_after(admin: str, prefix: str, before: Path | None) -> Iterator[dict[str, Conn]]:
    """Database `after` (this checkout's migrations) and, given ``before`` (another
    checkout's tree), database `before` migrated by that one's; closed on exit."""
    conns: dict[str, Conn] = {}
    try:
        if before is not None:
            conns["before"] = migrated_database(admin, f"{prefix}_before", before.resolve())
        conns["after"] = migrated_database(admin, f"{prefix}_after")
        yield conns
    finally:
        for conn in conns.values():
            conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=600, help="runs per chain workload and cell")
    parser.add_argument("--batch", type=int, default=50, help="messages per read / claim")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--map-items", type=int, default=1000, help="items of the map fan-out")
    args = parser.parse_args()
    with statements_server("flowlane-bench-") as admin, before_and_after(admin, "bench", None) as conns:
        print(
            f"cpus: {os.cpu_count()}, batch {args.batch}, {args.runs} runs per chain workload, "
            f"map fan-out of {args.map_items} items, {args.rounds} rounds\n"
        )
        measure(conns["after"], args.runs, args.batch, args.rounds, args.map_items)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
