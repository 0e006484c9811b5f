"""Drive the SQL Core purely through its SQL functions, for tests in any area.

``Engine(conn)`` wraps an autocommit psycopg connection. It defines flows,
starts runs, reads and claims messages like a worker (``pgmq.read`` then
``flowlane.start_tasks``), completes or fails tasks, resets visibility (no
sleeping: make messages visible now instead of waiting), and inspects state.

Claiming uses the queue name as the first argument of ``start_tasks``. With
the default routing the queue is ``lower(flow_slug)``, so with lowercase flow
slugs the helpers work against 0001 (``start_tasks(flow_slug, ...)``) and
against head (``start_tasks(queue_name, ...)``). From 0005 on, ``start_tasks``
also takes the (flow, step) pairs the claimer supports: by default every pair
routed to the queue, so that claims behave like a worker serving all of them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

Task = dict[str, Any]


class Engine:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.worker_id = uuid.uuid4()

    # -- plumbing -----------------------------------------------------------

    def rows(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []

    def row(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        found = self.rows(query, params)
        return found[0] if found else None

    def scalar(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return row[0] if row else None

    # -- definitions ----------------------------------------------------------

    def create_flow(self, slug: str, **options: Any) -> dict[str, Any]:
        return self._call("create_flow", {"flow_slug": slug, **options})

    def add_step(
        self, flow: str, step: str, deps: Sequence[str] = (), **options: Any
    ) -> dict[str, Any]:
        return self._call(
            "add_step", {"flow_slug": flow, "step_slug": step, "deps_slugs": list(deps), **options}
        )

    def define(
        self,
        flow: str,
        steps: Iterable[tuple[str, Sequence[str], Mapping[str, Any]]],
        **flow_options: Any,
    ) -> None:
        """``steps``: (slug, deps, add_step options) in definition order."""
        self.create_flow(flow, **flow_options)
        for slug, deps, opts in steps:
            self.add_step(flow, slug, deps, **opts)

    def _call(self, function: str, args: Mapping[str, Any]) -> dict[str, Any]:
        names = sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in args
        )
        query = sql.SQL("select * from flowlane.{}({})").format(sql.Identifier(function), names)
        params = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in args.items()}
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            row = cur.fetchone()
        assert row is not None
        return row

    # -- runs -----------------------------------------------------------------

    def start(self, flow: str, input: Any = None, run_id: uuid.UUID | None = None) -> uuid.UUID:
        row = self.row(
            "select run_id from flowlane.start_flow(%s, %s, %s)",
            (flow, Jsonb({} if input is None else input), run_id),
        )
        assert row is not None
        return uuid.UUID(str(row["run_id"]))

    def read(self, queue: str, qty: int = 1000, vt: int = 30) -> list[int]:
        return [
            r[0]
            for r in self.conn.execute("select msg_id from pgmq.read(%s, %s, %s)", (queue, vt, qty))
        ]

    def start_tasks(
        self, queue: str, msg_ids: Sequence[int], worker_id: uuid.UUID | None = None
    ) -> list[Task]:
        """Claim like a worker that serves every pair on ``queue``; only claimed rows."""
        if not self._claims_with_pairs():
            return self.rows(
                "select * from flowlane.start_tasks(%s, %s, %s)",
                (queue, list(msg_ids), worker_id or self.worker_id),
            )
        rows = self.classify(queue, msg_ids, self.routed_pairs(queue), worker_id)
        unsupported = [r for r in rows if r["outcome"] != "claimed"]
        assert not unsupported, f"unexpected unsupported messages: {unsupported}"
        return [{k: v for k, v in r.items() if k != "outcome"} for r in rows]

    def classify(
        self,
        queue: str,
        msg_ids: Sequence[int],
        pairs: Sequence[tuple[str, str]],
        worker_id: uuid.UUID | None = None,
    ) -> list[Task]:
        """``start_tasks`` with explicit supported pairs: every row, claimed or unsupported."""
        return self.rows(
            "select * from flowlane.start_tasks(%s, %s, %s, %s)",
            (queue, list(msg_ids), worker_id or self.worker_id, Jsonb([list(p) for p in pairs])),
        )

    def routed_pairs(self, queue: str) -> list[tuple[str, str]]:
        return [
            (r["flow_slug"], r["step_slug"])
            for r in self.rows(
                "select flow_slug, step_slug from flowlane.steps where queue_name = %s order by 1, 2",
                (queue,),
            )
        ]

    def _claims_with_pairs(self) -> bool:
        return bool(
            self.scalar(
                "select to_regprocedure('flowlane.start_tasks(text, bigint[], uuid, jsonb)') is not null"
            )
        )

    def claim(
        self,
        queue: str,
        qty: int = 1000,
        worker_id: uuid.UUID | None = None,
        *,
        flow_slug: str | None = None,
    ) -> list[Task]:
        """Read visible messages and claim them, like one worker poll.

        ``flow_slug``: on a 0001 database ``start_tasks`` takes the flow slug,
        which differs from the queue for a mixed-case slug.
        """
        return self.start_tasks(flow_slug or queue, self.read(queue, qty), worker_id)

    def complete(self, task: Mapping[str, Any], output: Any = None) -> dict[str, Any] | None:
        return self.row(
            "select * from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
            (
                task["run_id"],
                task["step_slug"],
                task["task_index"],
                Jsonb(output),
                self.worker_id,
                task.get("attempt"),
            ),
        )

    def complete_raw(
        self,
        run_id: uuid.UUID,
        step: str,
        index: int,
        output: Any,
        worker_id: uuid.UUID | None = None,
        attempt: int | None = None,
    ) -> dict[str, Any] | None:
        return self.row(
            "select * from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
            (run_id, step, index, Jsonb(output), worker_id, attempt),
        )

    def fail(self, task: Mapping[str, Any], error: str = "boom") -> dict[str, Any] | None:
        return self.row(
            "select * from flowlane.fail_task(%s, %s, %s, %s, %s, %s)",
            (
                task["run_id"],
                task["step_slug"],
                task["task_index"],
                error,
                self.worker_id,
                task.get("attempt"),
            ),
        )

    def make_visible(self, queue: str) -> int:
        """Make every message of ``queue`` visible now (instead of sleeping)."""
        table = sql.Identifier(
            "pgmq", self.scalar("select pgmq.format_table_name(%s, 'q')", (queue,))
        )
        cur = self.conn.execute(
            sql.SQL("update {} set vt = clock_timestamp() - interval '1 second'").format(table)
        )
        return cur.rowcount

    def drive(
        self,
        queue: str,
        handler: Callable[[Task], Any],
        *,
        max_polls: int = 100,
        flow_slug: str | None = None,
    ) -> int:
        """Claim and complete until the queue has no visible message; return tasks completed."""
        done = 0
        for _ in range(max_polls):
            tasks = self.claim(queue, flow_slug=flow_slug)
            if not tasks:
                return done
            for task in tasks:
                self.complete(task, handler(task))
                done += 1
        raise AssertionError(f"queue {queue} still had work after {max_polls} polls")

    # -- inspection -----------------------------------------------------------

    def run(self, run_id: uuid.UUID) -> dict[str, Any]:
        row = self.row("select * from flowlane.runs where run_id = %s", (run_id,))
        assert row is not None, f"no run {run_id}"
        return row

    def states(self, run_id: uuid.UUID) -> dict[str, dict[str, Any]]:
        return {
            r["step_slug"]: r
            for r in self.rows(f"select * from {step_states(self.conn)} where run_id = %s", (run_id,))
        }

    def statuses(self, run_id: uuid.UUID) -> dict[str, str]:
        return {slug: s["status"] for slug, s in self.states(run_id).items()}

    def tasks(self, run_id: uuid.UUID, step: str | None = None) -> list[dict[str, Any]]:
        return self.rows(
            "select * from flowlane.step_tasks where run_id = %s "
            "and (%s::text is null or step_slug = %s) order by step_slug, task_index",
            (run_id, step, step),
        )

    def task(self, run_id: uuid.UUID, step: str, index: int = 0) -> dict[str, Any]:
        row = self.row(
            "select * from flowlane.step_tasks "
            "where run_id = %s and step_slug = %s and task_index = %s",
            (run_id, step, index),
        )
        assert row is not None
        return row

    def queue_messages(self, queue: str) -> list[dict[str, Any]]:
        """Messages still on the queue (not archived), visible or not."""
        table = sql.Identifier(
            "pgmq", self.scalar("select pgmq.format_table_name(%s, 'q')", (queue,))
        )
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(
                sql.SQL(
                    "select msg_id, vt, read_ct, message, "
                    "extract(epoch from vt - clock_timestamp())::float8 as vt_in "
                    "from {} order by msg_id"
                ).format(table)
            )
            return cur.fetchall()

    def archived_ids(self, queue: str) -> list[int]:
        table = sql.Identifier(
            "pgmq", self.scalar("select pgmq.format_table_name(%s, 'a')", (queue,))
        )
        return [
            r[0]
            for r in self.conn.execute(
                sql.SQL("select msg_id from {} order by msg_id").format(table)
            )
        ]

    def vt_in(self, queue: str, msg_id: int) -> float:
        """Seconds until message ``msg_id`` becomes visible (negative = visible)."""
        for message in self.queue_messages(queue):
            if message["msg_id"] == msg_id:
                return float(message["vt_in"])
        raise AssertionError(f"message {msg_id} is not on queue {queue}")

    def backdate(self, run_id: uuid.UUID, step: str, seconds: float, index: int = 0) -> None:
        """Pretend a started task was claimed ``seconds`` ago (never sleep)."""
        self.conn.execute(
            "update flowlane.step_tasks set started_at = now() - make_interval(secs => %s), "
            "lease_renewed_at = null, queued_at = least(queued_at, now() - make_interval(secs => %s)) "
            "where run_id = %s and step_slug = %s and task_index = %s",
            (seconds, seconds, run_id, step, index),
        )


RUN_STATE: dict[str, str] = {
    # an ended run leaves no task waiting or running
    "finished run with unfinished task": """
        select t.run_id, t.step_slug, t.task_index from flowlane.step_tasks t
        join flowlane.runs r on r.run_id = t.run_id
        where r.status not in ('started', 'waiting') and t.status in ('queued', 'started')""",
}
# 0015+: an ended run ends every step: terminal with an end time, or 'cancelled' (which
# says, with its time, that the run ended before the step could finish or start)
ENDED_STEPS = """
    select s.run_id, s.step_slug, s.status from {states} s
    join flowlane.runs r on r.run_id = s.run_id
    where r.status not in ('started', 'waiting') and s.status in ('created', 'started')"""


def _run_state_queries(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The run-state invariant's queries that the database's migration version knows."""
    queries = dict(RUN_STATE)
    has_cancelled_steps = conn.execute(
        "select exists (select 1 from information_schema.columns where table_schema = 'flowlane' "
        "and table_name = 'step_states' and column_name = 'cancelled_at')").fetchone()
    if has_cancelled_steps == (True,):
        ended = ENDED_STEPS.format(states=step_states(conn))
        queries["ended run with a step still created or started"] = ended
    return queries


def step_states(conn: psycopg.Connection[Any]) -> str:
    """Where every step's state reads: the view all_step_states (0004+: a root step of one
    task keeps its state in its task), else the table step_states."""
    found = conn.execute("select to_regclass('flowlane.all_step_states') is not null").fetchone()
    return "flowlane.all_step_states" if found == (True,) else "flowlane.step_states"


def run_state_violations(conn: psycopg.Connection[Any]) -> dict[str, list[Any]]:
    """The run-state consistency invariant, on a database of any migration version."""
    if conn.execute("select to_regclass('flowlane.runs')").fetchone() == (None,):
        return {}
    queries = _run_state_queries(conn)
    found = {name: conn.execute(query).fetchall() for name, query in queries.items()}
    return {name: rows for name, rows in found.items() if rows}


def assert_invariants(engine: Engine) -> None:
    """Global state-machine invariants of a head (0002+) database; raise AssertionError."""
    violations: dict[str, str] = {
        **_run_state_queries(engine.conn),
        "completed run with unfinished step or counter": """
            select r.run_id from flowlane.runs r
            where r.status = 'completed' and (r.remaining_steps <> 0 or exists (
              select 1 from {states} s
              where s.run_id = r.run_id and s.status not in ('completed', 'skipped')))""",
        "remaining_steps out of sync": """
            select r.run_id from flowlane.runs r
            where r.status = 'started' and r.remaining_steps <> (
              select count(*) from {states} s
              where s.run_id = r.run_id and s.status not in ('completed', 'skipped'))""",
        "remaining_deps out of sync": """
            select s.run_id, s.step_slug from {states} s
            join flowlane.runs r on r.run_id = s.run_id and r.status = 'started'
            where s.status = 'created' and s.remaining_deps <> (
              select count(*) from flowlane.deps d
              join {states} p on p.run_id = s.run_id and p.step_slug = d.dep_slug
              where d.flow_slug = s.flow_slug and d.step_slug = s.step_slug
                and p.status not in ('completed', 'skipped'))""",
        "remaining_tasks out of sync": """
            select s.run_id, s.step_slug from {states} s
            join flowlane.runs r on r.run_id = s.run_id and r.status = 'started'
            join flowlane.steps st on st.flow_slug = s.flow_slug and st.step_slug = s.step_slug
            where s.status = 'started' and st.queue_name is not null
              and s.remaining_tasks <> s.initial_tasks - (
              select count(*) from flowlane.step_tasks t
              where t.run_id = s.run_id and t.step_slug = s.step_slug
                and t.status = 'completed')""",
        "completed step with wrong task count": """
            select s.run_id, s.step_slug from {states} s
            join flowlane.steps st on st.flow_slug = s.flow_slug and st.step_slug = s.step_slug
            where s.status = 'completed' and st.queue_name is not null and s.initial_tasks <> (
              select count(*) from flowlane.step_tasks t
              where t.run_id = s.run_id and t.step_slug = s.step_slug
                and t.status = 'completed')""",
        "task queue differs from step queue": """
            select t.run_id, t.step_slug from flowlane.step_tasks t
            join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
            where t.queue_name <> s.queue_name""",
    }
    if engine.scalar("select to_regclass('flowlane.step_cache') is not null"):
        # 0004+: a task has a queue message unless it completed from its step's cache
        violations["task without a message that did not complete from the cache"] = """
            select t.run_id, t.step_slug from flowlane.step_tasks t
            where t.message_id is null and not (t.cached and t.status = 'completed')"""
    if engine.scalar("select to_regproc('flowlane.stuck_runs') is not null"):
        # 0006+: every started run has a task that can move it
        violations["started run that no task can move"] = "select * from flowlane.stuck_runs()"
    if engine.scalar("select to_regclass('flowlane.all_step_states') is not null"):
        # 0004+: a task holds its step's state only for a root step of one task, while the task is
        # queued, started or completed (anything else writes the state into step_states), and
        # never for a step that has a step_states row
        violations["task holding a state it may not hold"] = """
            select t.run_id, t.step_slug, t.task_index, t.status from flowlane.step_tasks t
            join flowlane.steps s on s.flow_slug = t.flow_slug and s.step_slug = t.step_slug
            where t.step_started_at is not null
              and (t.status not in ('queued', 'started', 'completed') or s.deps_count <> 0
                   or s.step_type <> 'single' or t.task_index <> 0
                   or exists (select 1 from flowlane.step_states ss
                              where ss.run_id = t.run_id and ss.step_slug = t.step_slug))"""
    states = step_states(engine.conn)
    violations = {name: query.replace("{states}", states) for name, query in violations.items()}
    for name, query in violations.items():
        rows = engine.rows(query)
        assert rows == [], f"invariant violated: {name}: {rows[:5]}"
    # live messages: exactly the queued/started (not permanently stalled) tasks
    for queue in [r["queue_name"] for r in engine.rows("select queue_name from flowlane.queues")]:
        live = {
            m["msg_id"]
            for m in engine.queue_messages(queue)
            if isinstance(m["message"], dict) and "run_id" in m["message"]
        }
        active = {
            r["message_id"]
            for r in engine.rows(
                "select message_id from flowlane.step_tasks where queue_name = %s "
                "and status in ('queued', 'started') and permanently_stalled_at is null",
                (queue,),
            )
        }
        assert live == active, f"queue {queue}: live messages {live} != active tasks {active}"


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
