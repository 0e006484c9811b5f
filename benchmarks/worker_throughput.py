"""End-to-end worker throughput and pickup latency, next to raw PGMQ on the same database.

    PYTHONPATH=. python benchmarks/worker_throughput.py [--tasks 2000] [--rounds 3] [--dsn DSN]
        [--before DIR] [--worker-args "--batch-size 50 ..."] [--after-sql FILE ...]

What it measures: what real `flowlane worker` processes deliver, draining and picking up
one-step runs, as a fraction of raw PGMQ consumers on the same server.

Without --dsn it starts a throwaway embedded PostgreSQL. With --before DIR (a
checkout of an older flowlane, e.g. `git archive main | tar -x -C DIR`) the
flowlane columns are measured for both: workers from DIR on a database
migrated by DIR's migrations, and workers from this checkout on one migrated
to head, interleaved with the raw PGMQ figures in the same run. --after-sql FILE
(repeatable) runs FILE on this checkout's database after its migrations: a
schema experiment (an index or trigger dropped, say) measured against the
same code without it, before anyone writes it as a migration. Measured:

1. end to end: one producer sends N messages (raw PGMQ, one pgmq.send per
   transaction) or starts N one-step runs while 1 / 4 consumer processes
   drain them: raw consumers read batches of 1 ("raw single") or --raw-batch
   (polling every 5 ms when idle) and archive them; flowlane consumers are
   real worker processes (`flowlane worker`, no-op handler) that claim, run
   and complete. flowlane's producer starts one run per transaction
   (start_flow), then, in a second measurement, --raw-batch runs per
   transaction (start_flows, the batched start; "nan" for a checkout
   without start_flows);
2. drain only: the consumers start and wait on an empty queue; the backlog
   is then committed in one transaction (one start_flow per run on a
   version older than start_flows) and the drain is timed in the
   database, from that commit to the last completion (so starting 4
   processes costs nothing of it); the database server's CPU time per task
   during the drain (all its processes, from /proc; embedded only) and the
   worker processes' own (from /proc). --rounds
   rounds, one and four consumers in alternating order; each figure is the
   median of its rounds;
   slots (--slots, 8 and 32 by default): the same drain by one worker with that
   many handler slots and 1 ms handlers, against as many raw consumers that
   each sleep 1 ms per message between their read and their archive;
3. latency from start_flow's commit to the handler starting, one run at a
   time on an idle worker, with PGMQ insert notifications on (--samples) and
   off (--samples-off; polling fallback: read_with_poll, 100 ms interval):
   p50 / p95 / p99; with --before, one idle worker per version, their samples
   alternating. Between samples the worker idles 100-200 ms (uniformly drawn),
   so that starts land anywhere in a polling worker's interval.

Every measurement runs on a new database cloned from its version's template
(migrated, benchmark flows applied) and dropped afterwards: the tables a
measurement leaves behind (runs, archives, dead rows for autovacuum) would
slow the next one down by up to a third.

How to read it: the ratio columns (flowlane's tasks/s over raw PGMQ's msg/s, each measured
in the same run: raw1 reads one message at a time, raw50 --raw-batch) are what to compare
between runs and machines; the rates themselves move by 5-10 % from run to run here. With
--before, compare the before and after columns of the same run. The drain's "4 / 1" row is
four consumers against one. Pickup latency is absolute: p50 of a few ms with notifications,
about half the 100 ms polling interval without.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.engine_throughput import migrate_with  # noqa: E402
from benchmarks.engine_throughput import scalar as engine_scalar  # noqa: E402
from flowlane import defaults  # noqa: E402
from flowlane.compiler import compile_project, load_project  # noqa: E402
from flowlane.core import db  # noqa: E402

FLOWS = REPO / "benchmarks" / "flows"
RAW_QUEUE = "bench_raw"
TICK = os.sysconf("SC_CLK_TCK")
SLOTS = (8, 32)  # handler slots of the one worker, and raw consumers, of the slots cases


@contextlib.contextmanager
def admin_server(dsn: str | None, prefix: str) -> Iterator[tuple[str, Path | None]]:
    """``dsn`` (and no data directory), or a throwaway embedded server: (admin DSN, its data)."""
    if dsn is not None:
        yield dsn, None
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    os.chmod(tmp, 0o711)  # run as root, the server account must reach its data directory
    pgdata = Path(tmp) / "pgdata"
    try:
        yield db.EmbeddedDatabase.start_at(pgdata), pgdata
    finally:
        db.EmbeddedDatabase.stop_at(pgdata)


def template_database(
    admin_dsn: str, repo: Path, experiments: Sequence[Path] = (), flows: Path = FLOWS
) -> str:
    """A database migrated by ``repo``'s migrations, then changed by the ``experiments``' SQL,
    with the flows of ``flows`` (the benchmark flows) applied."""
    name = f"flowlane_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}"'.encode())
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    migrate_with(repo, dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for experiment in experiments:
            conn.execute(experiment.read_bytes())
        for path, text in sorted(compile_project(load_project([flows])).items()):
            if path.startswith("flows/"):
                conn.execute(text.encode())
    return dsn


@contextlib.contextmanager
def fresh_database(admin_dsn: str, template_dsn: str) -> Iterator[str]:
    """A new database cloned from ``template_dsn``'s, dropped on exit."""
    template = psycopg.conninfo.conninfo_to_dict(template_dsn)["dbname"]
    name = f"flowlane_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'create database "{name}" template "{template}"'.encode())
    try:
        yield psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'drop database "{name}" with (force)'.encode())


def _env(repo: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("FLOWLANE_DSN", None)
    return env


def _stat(stat: Path) -> tuple[int, int]:
    """(parent pid, user + system clock ticks) of a process, from its /proc/<pid>/stat."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


class ServerCpu:
    """CPU seconds of every process of the embedded server (postmaster and its children)."""

    def __init__(self, pgdata: Path | None) -> None:
        self.pid = int((pgdata / "postmaster.pid").read_text().split()[0]) if pgdata else None

    def seconds(self) -> float | None:
        if self.pid is None:
            return None
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent, ticks = _stat(stat)
            except OSError:
                continue
            if int(stat.parent.name) == self.pid or parent == self.pid:
                total += ticks
        return total / TICK


# -- raw PGMQ -----------------------------------------------------------------


def _raw_consumer(dsn: str, stop_at: int, done: Any, ready: Any, qty: int, work: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with ready.get_lock():
            ready.value += 1
        while done.value < stop_at:
            rows = conn.execute(b"select msg_id from pgmq.read(%s, 30, %s)", (RAW_QUEUE, qty)).fetchall()
            if not rows:
                time.sleep(0.005)  # an idle consumer polls every 5 ms (no 1 s read_with_poll tail)
                continue
            ids = [r[0] for r in rows]
            if work:
                time.sleep(work * len(ids))  # the handler's time, like --flow bench_sleep's
            conn.execute(b"select pgmq.archive(%s, %s::bigint[])", (RAW_QUEUE, ids))
            with done.get_lock():
                done.value += len(ids)


def raw_pgmq(
    dsn: str, n: int, consumers: int, qty: int, *, backlog: bool = False, work: float = 0.0
) -> float:
    """Messages/s: one send per transaction while the consumers drain; or (backlog) all n
    committed in one transaction once every consumer is polling, timed from the commit.
    ``work``: seconds each consumer sleeps per message between its read and its archive."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(b"select pgmq.create(%s)", (RAW_QUEUE,))
        conn.execute(b"select pgmq.purge_queue(%s)", (RAW_QUEUE,))
    done = multiprocessing.Value("i", 0)
    ready = multiprocessing.Value("i", 0)
    procs = [
        multiprocessing.Process(target=_raw_consumer, args=(dsn, n, done, ready, qty, work))
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    while ready.value < consumers:
        time.sleep(0.01)
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        if backlog:
            with conn.transaction():
                for offset in range(0, n, 500):
                    batch = [json.dumps({"n": i}) for i in range(offset, min(n, offset + 500))]
                    conn.execute(b"select pgmq.send_batch(%s, %s::jsonb[])", (RAW_QUEUE, batch))
            started = time.perf_counter()
        else:
            for i in range(n):
                conn.execute(b"select pgmq.send(%s, %s::jsonb)", (RAW_QUEUE, json.dumps({"n": i})))
    for p in procs:
        p.join()
    return n / (time.perf_counter() - started)


# -- flowlane workers ---------------------------------------------------------


class Workers:
    def __init__(
        self, dsn: str, count: int, *extra: str, repo: Path = REPO, flow: str = "bench_noop",
        flows: Path = FLOWS,
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="flowlane-bench-workers-"))
        self.paths = [self.folder / f"worker-{i}.log" for i in range(count)]
        self.logs = [path.open("w") for path in self.paths]
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flowlane",
                    "worker",
                    str(flows),
                    "--flow",
                    flow,
                    "--dsn",
                    dsn,
                    "--import-path",
                    str(REPO / "benchmarks"),
                    "--log-level",
                    "INFO",
                    *extra,
                ],
                cwd=repo,
                env=_env(repo),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for log in self.logs
        ]
        deadline = time.monotonic() + 60
        with psycopg.connect(dsn, autocommit=True) as conn:
            while live_workers(conn) < count:  # registered = polling
                for path, proc in zip(self.paths, self.procs, strict=True):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"worker did not start:\n{path.read_text()}")
                time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """CPU seconds the worker processes have used so far."""
        return sum(_stat(Path(f"/proc/{proc.pid}/stat"))[1] for proc in self.procs) / TICK

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc, log, path in zip(self.procs, self.logs, self.paths, strict=True):
            proc.wait(60)
            log.close()
            path.unlink()
        self.folder.rmdir()


def live_workers(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(b"select count(*) from flowlane.workers where stopped_at is null").fetchone()
    return int(row[0]) if row else 0


def start_runs(conn: psycopg.Connection[Any], n: int, per_call: int = 1, flow: str = "bench_noop") -> None:
    """n runs: one start_flow per call, or start_flows of ``per_call`` inputs per call."""
    inputs = [json.dumps({"i": i}) for i in range(n)]
    with conn.cursor() as cur:
        if per_call == 1:
            cur.executemany(b"select flowlane.start_flow(%s, %s::jsonb)", [(flow, i) for i in inputs])
            return
        cur.executemany(
            b"select count(*) from flowlane.start_flows(%s, %s::jsonb[])",
            [(flow, inputs[at : at + per_call]) for at in range(0, n, per_call)],
        )


def has_start_flows(conn: psycopg.Connection[Any]) -> bool:
    """Whether the version has the batched start, by name: later versions added arguments
    with defaults (start_at, priority), which the benchmark's two-argument call leaves out."""
    return bool(engine_scalar(conn, "has_function", name="start_flows"))


def wait_drained(conn: psycopg.Connection[Any]) -> None:
    """Until no run is started. An index finds the started runs: polling costs the server
    next to nothing, whereas counting completed runs would read them all every 10 ms, on
    the server being measured."""
    while True:
        row = conn.execute(b"select exists (select 1 from flowlane.runs where status = 'started')").fetchone()
        if not (row and row[0]):
            return
        time.sleep(0.01)


class Engine:
    """One flowlane version: its code (workers) and a database migrated by it."""

    def __init__(self, admin: str, repo: Path, extra: list[str], experiments: list[Path]) -> None:
        self.admin = admin
        self.repo = repo
        self.extra = extra
        self.template = template_database(admin, repo, experiments)
        with psycopg.connect(self.template) as conn:
            self.batched_starts = has_start_flows(conn)

    def end_to_end(self, n: int, workers: int, per_call: int = 1) -> float:
        """Tasks/s end to end: ``per_call`` runs started per transaction while the workers
        drain (NaN for a batched start on a version without start_flows)."""
        if per_call > 1 and not self.batched_starts:
            return math.nan
        with fresh_database(self.admin, self.template) as dsn:
            return self._end_to_end(dsn, n, workers, per_call)

    def _end_to_end(self, dsn: str, n: int, workers: int, per_call: int) -> float:
        pool = Workers(dsn, workers, *self.extra, repo=self.repo)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                started = time.perf_counter()
                start_runs(conn, n, per_call)
                wait_drained(conn)
                return n / (time.perf_counter() - started)
        finally:
            pool.stop()

    def drain(
        self, n: int, workers: int, cpu: ServerCpu, flow: str = "bench_noop", extra: tuple[str, ...] = ()
    ) -> tuple[float, float | None, float]:
        """(tasks/s of the workers draining a backlog, server CPU ms per task during the
        drain, the workers' own CPU ms per task). The workers start on an empty queue; the
        backlog is committed in one transaction once all of them are registered, and the
        drain is timed in the database, from that commit to the last run's completion."""
        with fresh_database(self.admin, self.template) as dsn:
            return self._drain(dsn, n, workers, cpu, flow, extra)

    def _drain(
        self, dsn: str, n: int, workers: int, cpu: ServerCpu, flow: str, extra: tuple[str, ...]
    ) -> tuple[float, float | None, float]:
        pool = Workers(dsn, workers, *self.extra, *extra, repo=self.repo, flow=flow)
        try:  # a version older than start_flows: one run per call
            return timed_drain(dsn, pool, n, 500 if self.batched_starts else 1, cpu, flow)
        finally:
            pool.stop()


def timed_drain(
    dsn: str, pool: Workers, n: int, per_call: int, cpu: ServerCpu, flow: str = "bench_noop"
) -> tuple[float, float | None, float]:
    """(tasks/s, server CPU ms per task, the workers' own CPU ms per task) of ``pool``
    draining ``n`` runs committed in one transaction (``per_call`` per start call), timed in
    the database from that commit to the last run's completion."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            start_runs(conn, n, per_call, flow)
        mark = conn.execute(b"select clock_timestamp()").fetchone()
        assert mark is not None
        cpu0, own0 = cpu.seconds(), pool.cpu_seconds()
        wait_drained(conn)
        cpu1, own1 = cpu.seconds(), pool.cpu_seconds()
        row = conn.execute(
            b"select extract(epoch from max(completed_at) - %s) from flowlane.runs",
            (mark[0],),
        ).fetchone()
        assert row is not None
    per_task = None if cpu0 is None or cpu1 is None else 1000 * (cpu1 - cpu0) / n
    return n / float(row[0]), per_task, 1000 * (own1 - own0) / n


def latency(
    dsns: dict[str, str], repos: dict[str, Path], samples: int, notify: bool
) -> dict[str, list[float]]:
    """Milliseconds from start_flow's commit to the handler's start, per version: one idle
    worker per version (each on its own database), the versions' samples alternating."""
    pools = {
        name: Workers(dsn, 1, *([] if notify else ["--no-notify"]), repo=repos[name])
        for name, dsn in dsns.items()
    }
    delays: dict[str, list[float]] = {name: [] for name in dsns}
    conns = {name: psycopg.connect(dsn, autocommit=True) for name, dsn in dsns.items()}
    try:
        time.sleep(0.5)  # let the idle workers settle into their wait
        for _ in range(samples):
            for name, conn in conns.items():
                delays[name].append(_pickup(conn))
                # idle gap: the worker is back in its wait when the next run starts; its random
                # part spreads the starts over a polling worker's interval (a fixed gap as long
                # as the interval started each run at the same point of it, late)
                time.sleep(0.1 + random.uniform(0, defaults.READ_POLL_MS / 1000))
    finally:
        for conn in conns.values():
            conn.close()
        for pool in pools.values():
            pool.stop()
    return delays


def _pickup(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute(b"select run_id from flowlane.start_flow('bench_noop', '{}')").fetchone()
    committed = time.time()
    assert row is not None
    while True:
        out = conn.execute(
            b"select output from flowlane.runs where run_id = %s and status = 'completed'", (row[0],)
        ).fetchone()
        if out:
            return float((out[0]["only"]["t"] - committed) * 1000)
        time.sleep(0.02)  # the handler stamps the time: slow polling adds no error


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * p) - 1)]


def _cpu(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


class Bench:
    """One run of the script: its engines, the raw PGMQ baseline and the printed tables."""

    def __init__(self, args: argparse.Namespace, admin: str, cpu: ServerCpu) -> None:
        self.args = args
        self.admin = admin
        self.cpu = cpu
        self.engines = {"after": Engine(admin, REPO, shlex.split(args.worker_args), args.after_sql)}
        if args.before:
            self.engines = {"before": Engine(admin, args.before.resolve(), [], []), **self.engines}
        self.names = list(self.engines)
        self.q = args.raw_batch

    def raw(self, consumers: int, qty: int, *, backlog: bool = False) -> float:
        with fresh_database(self.admin, self.engines["after"].template) as dsn:
            return raw_pgmq(dsn, self.args.tasks, consumers, qty, backlog=backlog)

    def _columns(self) -> tuple[str, str]:
        cols = "".join(f"  {name + ' tasks/s':>15}" for name in self.names)
        ratios = "".join(f"  {name + '/raw1':>12}  {name + f'/raw{self.q}':>12}" for name in self.names)
        return cols, ratios

    def end_to_end(self) -> None:
        q, names, tasks = self.q, self.names, self.args.tasks
        cols, ratios = self._columns()
        print("end to end: one producer while the consumers drain; raw PGMQ sends one message")
        print(f"per transaction; flowlane starts one run per transaction, then (batched) {q} per")
        print("transaction with start_flows")
        batched = "".join(f"  {name + ' batched':>15}" for name in names)
        batched_ratio = "".join(f"  {name + ' b/raw1':>12}" for name in names)
        print(
            f"{'consumers':>9}  {'raw1 msg/s':>10}  {f'raw{q} msg/s':>11}{cols}{batched}"
            f"{ratios}{batched_ratio}"
        )
        for consumers in (1, 4):
            raw1, rawq = self.raw(consumers, 1), self.raw(consumers, q)
            rates = {name: e.end_to_end(tasks, consumers) for name, e in self.engines.items()}
            fast = {name: e.end_to_end(tasks, consumers, q) for name, e in self.engines.items()}
            line = "".join(f"  {rates[n]:>15.0f}" for n in names)
            line += "".join(f"  {fast[n]:>15.0f}" for n in names)
            line += "".join(f"  {rates[n] / raw1:>12.2f}  {rates[n] / rawq:>12.2f}" for n in names)
            line += "".join(f"  {fast[n] / raw1:>12.2f}" for n in names)
            print(f"{consumers:>9}  {raw1:>10.0f}  {rawq:>11.0f}{line}")

    def drains(self) -> None:
        """The drain table: medians over --rounds rounds of 1 and 4 consumers (alternating
        which goes first), then four consumers against one per column."""
        q, names, rounds = self.q, self.names, self.args.rounds
        cells: dict[tuple[int, str], list[float]] = {}
        for r in range(rounds):
            for consumers in (1, 4) if r % 2 == 0 else (4, 1):
                for key, value in self._drain_round(consumers, r).items():
                    cells.setdefault((consumers, key), []).append(value)
        med = {key: statistics.median(values) for key, values in cells.items()}
        cols, ratios = self._columns()
        print("drain only: consumers idle on an empty queue, then the backlog committed in one")
        print(f"transaction; timed from that commit; medians of {rounds} round(s)")
        cpu_cols = "".join(f"  {name + ' cpu ms/task':>19}  {name + ' worker ms':>16}" for name in names)
        print(f"{'consumers':>9}  {'raw1 msg/s':>10}  {f'raw{q} msg/s':>11}{cols}{ratios}{cpu_cols}")
        for c in (1, 4):
            line = "".join(f"  {med[c, n]:>15.0f}" for n in names)
            line += "".join(
                f"  {med[c, n] / med[c, 'raw1']:>12.2f}  {med[c, n] / med[c, 'rawq']:>12.2f}" for n in names
            )
            line += "".join(
                f"  {_cpu(med.get((c, n + ' cpu'))):>19}  {med[c, n + ' worker cpu']:>16.3f}" for n in names
            )
            print(f"{c:>9}  {med[c, 'raw1']:>10.0f}  {med[c, 'rawq']:>11.0f}{line}")
        four = "".join(f"  {med[4, n] / med[1, n]:>15.2f}" for n in names)
        raw = f"{med[4, 'raw1'] / med[1, 'raw1']:>10.2f}  {med[4, 'rawq'] / med[1, 'rawq']:>11.2f}"
        print(f"{'4 / 1':>9}  {raw}{four}   (four consumers against one)")

    def _in_turn(self, r: int) -> list[tuple[str, Engine]]:
        """The versions in round ``r``'s order: the first one measured changes every round (run
        after run, the second of the same code measured up to 1.1x faster than the first)."""
        engines = list(self.engines.items())
        return engines if r % 2 == 0 else engines[::-1]

    def _drain_round(self, consumers: int, r: int) -> dict[str, float]:
        values = {
            "raw1": self.raw(consumers, 1, backlog=True),
            "rawq": self.raw(consumers, self.q, backlog=True),
        }
        for name, engine in self._in_turn(r):
            rate, cpu_ms, worker_ms = engine.drain(self.args.tasks, consumers, self.cpu)
            values[name] = rate
            values[name + " worker cpu"] = worker_ms
            if cpu_ms is not None:
                values[name + " cpu"] = cpu_ms
        return values

    def slots(self) -> None:
        """One worker with n handler slots and 1 ms handlers against n raw consumers that each
        read one message (raw1) or --raw-batch messages (rawq), sleep 1 ms per message and
        archive them, for each n of --slots: what a slot costs beyond its handler."""
        names, rounds, q = self.names, self.args.rounds, self.q
        print("handler slots, 1 ms handlers, drain (as above); raw: as many consumers as slots,")
        print(f"each reading 1 (raw1) or {q} (raw{q}), sleeping 1 ms a message, archiving what it")
        print(f"read; medians of {rounds} round(s)")
        cols = "".join(f"  {name + ' tasks/s':>15}" for name in names)
        ratios = "".join(f"  {name + '/raw1':>12}  {name + f'/raw{q}':>12}" for name in names)
        print(f"{'slots':>5}  {'raw1 msg/s':>10}  {f'raw{q} msg/s':>11}{cols}{ratios}")
        for slots in self.args.slots:
            med = self._slots_medians(slots)
            line = "".join(f"  {med[n]:>15.0f}" for n in names) + "".join(
                f"  {med[n] / med['raw1']:>12.2f}  {med[n] / med['rawq']:>12.2f}" for n in names
            )
            print(f"{slots:>5}  {med['raw1']:>10.0f}  {med['rawq']:>11.0f}{line}")

    def _slots_medians(self, slots: int) -> dict[str, float]:
        extra = ("--max-concurrent", str(slots))
        cells: dict[str, list[float]] = {}
        for r in range(self.args.rounds):
            for qty, key in ((1, "raw1"), (self.q, "rawq")):
                with fresh_database(self.admin, self.engines["after"].template) as dsn:
                    raw = raw_pgmq(dsn, self.args.tasks, slots, qty, backlog=True, work=0.001)
                cells.setdefault(key, []).append(raw)
            for name, engine in self._in_turn(r):
                rate, _, _ = engine.drain(self.args.tasks, 1, self.cpu, "bench_sleep", extra)
                cells.setdefault(name, []).append(rate)
        return {key: statistics.median(values) for key, values in cells.items()}

    def latency(self) -> None:
        names = self.names
        print("pickup latency, start_flow commit -> handler start, one idle worker per version,")
        print("the versions' samples alternating")
        for notify, samples in ((True, self.args.samples), (False, self.args.samples_off)):
            if samples < 1:
                continue
            with contextlib.ExitStack() as stack:
                dsns = {
                    name: stack.enter_context(fresh_database(self.admin, engine.template))
                    for name, engine in self.engines.items()
                }
                repos = {name: engine.repo for name, engine in self.engines.items()}
                delays = latency(dsns, repos, samples, notify)
            label = "notifications on " if notify else "notifications off"
            for name in names:
                d = delays[name]
                print(
                    f"  {label} {name:<6}: p50 {percentile(d, 0.5):7.1f} ms"
                    f"   p95 {percentile(d, 0.95):7.1f} ms"
                    f"   p99 {percentile(d, 0.99):7.1f} ms   ({len(d)} samples)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="admin DSN (may CREATE DATABASE); default: a temporary embedded server")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the drain measurement (medians)")
    parser.add_argument("--samples", type=int, default=1000, help="pickup latency samples, notifications on")
    parser.add_argument("--samples-off", type=int, default=100, help="the same, notifications off (0: skip)")
    parser.add_argument("--raw-batch", type=int, default=50, help="raw PGMQ batched read size")
    parser.add_argument("--before", type=Path, help="a checkout of an older flowlane to compare")
    parser.add_argument("--worker-args", default="", help="extra arguments for this checkout's workers")
    parser.add_argument(
        "--after-sql", type=Path, action="append", default=[], metavar="FILE",
        help="SQL run on this checkout's database after its migrations (repeatable)",
    )
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument(
        "--slots", type=lambda text: [int(n) for n in text.split(",")], default=list(SLOTS),
        help="handler slots of the slots cases, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--skip-slots", action="store_true", help="skip the slots cases (1 ms handlers)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for path in args.after_sql:
        if not path.is_file():
            parser.error(f"--after-sql {path}: no such file")
    with admin_server(args.dsn, "flowlane-bench-") as (admin, pgdata):
        bench = Bench(args, admin, ServerCpu(pgdata))
        print(
            f"tasks per measurement: {args.tasks}; cpus: {os.cpu_count()}; "
            f"after's worker arguments: {args.worker_args or '(defaults)'}"
            + "".join(f"; after's database: {path}" for path in args.after_sql)
        )
        if not args.skip_end_to_end:
            bench.end_to_end()
            print()
        if not args.skip_drain:
            bench.drains()
            print()
        if not args.skip_slots:
            bench.slots()
        if not args.skip_latency:
            print()
            bench.latency()


if __name__ == "__main__":
    main()
