"""Every database call the worker makes (SQL text lives in core/sql/runtime.sql)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from flowlane import defaults
from flowlane.core import db
from flowlane.core.queries import query
from flowlane.runtime import log
from flowlane.runtime.limits import safe_loads
from flowlane.runtime.tasks import ClaimedTask

# the exception classes that may be transient; is_transient() decides for one error
TRANSIENT: tuple[type[BaseException], ...] = (psycopg.OperationalError, PoolTimeout)
DATABASE_ERRORS: tuple[type[BaseException], ...] = (psycopg.Error, PoolTimeout)

# SQLSTATEs a retry can fix: connection exceptions (class 08), the server shutting
# down or starting, serialization failures and deadlocks, too many connections.
# Other OperationalErrors (program limits, out of memory, a cancelled query) are
# permanent: the same call fails the same way.
_RETRYABLE_STATES = frozenset({"57P01", "57P02", "57P03", "40001", "40P01", "53300"})


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same call may succeed (connection lost, deadlock, ...)."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is None:  # no answer from the server: the connection was lost or refused
        return True
    return state.startswith("08") or state in _RETRYABLE_STATES

Row = dict[str, Any]  # a row as psycopg reads it, before it becomes one of the row types below
Pairs = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class TaskOutcome:
    """A task as a batch of results left it (``worker_complete_tasks``, ``worker_fail_tasks``):
    its status, and whose claim holds it (``last_worker_id`` and ``attempts_count``: a result
    counts only when they are the sender's)."""

    run_id: str
    step_slug: str
    task_index: int
    status: str
    attempts_count: int
    last_worker_id: str | None
    error_message: str | None

    @classmethod
    def from_row(cls, r: Row) -> TaskOutcome:
        worker = r["last_worker_id"]
        return cls(str(r["run_id"]), r["step_slug"], int(r["task_index"]), r["status"],
                   int(r["attempts_count"]), None if worker is None else str(worker), r["error_message"])

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.run_id, self.step_slug, self.task_index)


@dataclass(frozen=True)
class UnservedPair:
    """A (flow, step) the database routes to a queue that a worker there does not serve
    (``worker_coverage``), with what routes it there (``sources``)."""

    flow_slug: str
    step_slug: str
    sources: tuple[str, ...]

    @classmethod
    def from_row(cls, r: Row) -> UnservedPair:
        return cls(r["flow_slug"], r["step_slug"], tuple(r["sources"] or ()))


@dataclass(frozen=True)
class DeploymentState:
    """Whether a deployment's workers may run (``worker_deployment``), and why not."""

    enabled: bool
    reason: str | None


@dataclass(frozen=True)
class FlowCheck:
    """A flow's shape in the database against the YAML's (``worker_verify_flow``): ``status``
    missing, verified or mismatch, and for a mismatch the database's words for each difference."""

    status: str | None
    differences: tuple[str, ...]


@dataclass(frozen=True)
class Unsupported:
    """A message ``start_tasks`` refused: no task on the queue (``flow_slug`` None) or a
    (flow, step) pair the worker does not serve. Identities only, never the body."""

    msg_id: int
    flow_slug: str | None
    step_slug: str | None

    @property
    def pair(self) -> str:
        return f"{self.flow_slug}.{self.step_slug}" if self.flow_slug else "(no flowlane task)"


@dataclass
class Claim:
    """What one ``start_tasks`` call did: tasks claimed, or (nothing claimed) the
    unsupported messages that made it hand the whole batch back."""

    tasks: list[ClaimedTask] = field(default_factory=list)
    unsupported: list[Unsupported] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)  # every message read (claim_tasks)
    # the queue's limits allowed no start: its concurrency is reached (a task's end wakes
    # the queue's listeners), or its rate limit allows the next start in rate_limited_ms
    at_capacity: bool = False
    rate_limited_ms: int | None = None


def channel(queue_name: str) -> str:
    """The channel flowlane's insert trigger notifies (``flowlane._notify_queue_insert``;
    the name PGMQ's own trigger used)."""
    return f"pgmq.q_{queue_name}.INSERT"


def json_param(value: Any) -> str:
    return json.dumps(value, allow_nan=False)


class Store:
    """The worker's connection pool and its calls.

    Handlers never hold a connection: the poller, the lease loop and the
    maintenance loop each use at most one at a time (the poller keeps its own
    between calls, ``_polling``), the completion flusher at most two (two
    commits in flight), so the pool is sized to those five, not to
    ``max_concurrent``. The four busy while tasks flow (poller, two flushes,
    leases) are opened at start: a connection opened during a burst costs the
    burst its setup and a cold backend (one worker draining 6,000 queued tasks:
    5.3-5.7k tasks/s with one connection open at start, 6.2-6.6k with three).
    """

    def __init__(
        self, dsn: str, *, application_name: str, min_size: int = 4, max_size: int = 5
    ) -> None:
        log.quiet_pool_logs()
        self.dsn = dsn
        self.target = db.as_target(dsn)
        self.application_name = application_name
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Row]] = AsyncConnectionPool(
            self.target.conninfo,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=5.0,
            # no background reconnection schedule: a failed connect gives the slot up at once and
            # the next checkout (our callers retry with their own backoff) tries again
            reconnect_timeout=0,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "application_name": application_name,
                **self.target.connection_kwargs(),
            },
            configure=_configure,
            connection_class=psycopg.AsyncConnection[Row],
            name=application_name,
        )
        self._poller: psycopg.AsyncConnection[Row] | None = None

    async def open(self, timeout: float = 10.0) -> None:
        # one direct connection first: its error says why (the pool's only says "timed out")
        probe = await psycopg.AsyncConnection.connect(
            self.target.conninfo, connect_timeout=max(1, int(timeout))
        )
        await probe.close()
        await self.pool.open(wait=True, timeout=timeout)

    async def close(self) -> None:
        if self._poller is not None:
            await self.pool.putconn(self._poller)
            self._poller = None
        await self.pool.close(timeout=2.0)

    @contextlib.asynccontextmanager
    async def _polling(self) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        """The poller's connection, kept between its calls. The pool hands its idle
        connections out in turn, so an idle worker's claim met a backend that had not run
        one for a while (its caches cold: the claim's round trip is most of a pickup). A
        call that fails gives the connection back (the pool drops a broken one); the next
        takes another."""
        if self._poller is None:
            self._poller = await self.pool.getconn()
        conn = self._poller
        try:
            yield conn
        except BaseException:
            self._poller = None
            await self.pool.putconn(conn)
            raise

    async def _poll(self, name: str, **params: Any) -> list[Row]:
        async with self._polling() as conn:
            cur = await conn.execute(query(name), params)
            return await cur.fetchall()

    async def fetch(self, name: str, **params: Any) -> list[Row]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query(name), params)
            return await cur.fetchall()

    async def verify_flow(self, flow_slug: str, shape: dict[str, Any]) -> FlowCheck:
        """The flow in the database against ``shape`` (read-only)."""
        rows = await self.fetch("worker_verify_flow", flow_slug=flow_slug, shape=json_param(shape))
        result = rows[0]["result"] or {}
        return FlowCheck(result.get("status"), tuple(map(str, result.get("differences") or ())))

    async def coverage(self, queue_name: str, pairs: Pairs) -> list[UnservedPair]:
        """The pairs routed to the queue that ``pairs`` leaves out, each with its sources."""
        rows = await self.fetch("worker_coverage", queue_name=queue_name, pairs=json_param(pairs))
        return [UnservedPair.from_row(r) for r in rows]

    async def enable_notify(self, queue_name: str) -> bool:
        """Install flowlane's insert notification on the queue unless it is already there."""
        rows = await self.fetch("worker_enable_notify", queue_name=queue_name)
        return bool(rows and rows[0]["installed"])

    async def register(
        self, worker_id: str, queue_name: str, worker_name: str, deployment: str, pairs: Pairs
    ) -> None:
        await self.fetch(
            "worker_register",
            worker_id=worker_id,
            queue_name=queue_name,
            worker_name=worker_name,
            deployment=deployment,
            pairs=json_param(pairs),
        )

    async def deployment(self, deployment: str) -> DeploymentState | None:
        """A deployment's state, None before its first worker registered."""
        rows = await self.fetch("worker_deployment", deployment=deployment)
        return DeploymentState(bool(rows[0]["enabled"]), rows[0]["reason"]) if rows else None

    async def disable_deployment(self, deployment: str, reason: str) -> None:
        await self.fetch("worker_disable_deployment", deployment=deployment, reason=reason)

    async def record_refusal(self, queue_name: str, deployment: str, reason: str,
                             hint: str | None) -> None:
        """Say in the database why this worker refuses to start (cleared by the next
        worker registered on the queue)."""
        await self.fetch("worker_record_refusal", queue_name=queue_name, deployment=deployment,
                         reason=reason, hint=hint)

    async def heartbeat(self, worker_id: str) -> bool:
        rows = await self.fetch("worker_heartbeat", worker_id=worker_id)
        return bool(rows and rows[0]["deprecated"])

    async def mark_stopped(self, worker_id: str) -> None:
        await self.fetch("worker_mark_stopped", worker_id=worker_id)

    async def maintenance_tick(self) -> dict[str, int]:
        """Fire due schedules, begin due delayed runs, fail runs past their deadline."""
        rows = await self.fetch("maintenance_tick")
        done: dict[str, int] = rows[0]["done"] if rows else {}
        return done

    async def requeue_stalled(self) -> int:
        rows = await self.fetch("worker_requeue_stalled")
        return int(rows[0]["requeued"] or 0) if rows else 0

    async def trace_parents(self, run_ids: list[str]) -> dict[str, str]:
        rows = await self.fetch("worker_trace_parents", run_ids=run_ids)
        return {str(r["run_id"]): r["trace_parent"] for r in rows}

    async def read(
        self, queue_name: str, *, vt: int, qty: int, poll_seconds: int | None
    ) -> list[int]:
        if poll_seconds is None:
            rows = await self._poll("worker_read", queue_name=queue_name, vt=vt, qty=qty)
        else:
            rows = await self._poll(
                "worker_read_with_poll",
                queue_name=queue_name,
                vt=vt,
                qty=qty,
                max_poll_seconds=poll_seconds,
                poll_interval_ms=defaults.READ_POLL_MS,
            )
        return [int(r["msg_id"]) for r in rows]

    async def start_tasks(
        self, queue_name: str, msg_ids: Sequence[int], worker_id: str, pairs: Pairs
    ) -> Claim:
        rows = await self._poll(
            "worker_start_tasks",
            queue_name=queue_name,
            msg_ids=list(msg_ids),
            worker_id=worker_id,
            pairs=json_param(pairs),
        )
        return _claim(rows)

    async def claim_tasks(self, queue_name: str, qty: int, worker_id: str, pairs: Pairs) -> Claim:
        """Read and claim in one round trip (``flowlane.claim_tasks``)."""
        rows = await self._poll(
            "worker_claim_tasks",
            queue_name=queue_name,
            qty=qty,
            worker_id=worker_id,
            pairs=json_param(pairs),
        )
        return _claim(rows)

    async def await_inserts(self, queue_name: str, timeout_ms: int) -> bool:
        """Wait (at most ``timeout_ms``) for the transactions inserting into the queue to end
        (``flowlane.await_queue_inserts``); False when the wait timed out."""
        rows = await self._poll("worker_await_inserts", queue_name=queue_name, timeout_ms=timeout_ms)
        return bool(rows and rows[0]["settled"])

    async def extend_leases(self, worker_id: str, held: list[dict[str, Any]]) -> int:
        """Extend the leases of the tasks this worker holds (see ``flowlane.extend_leases``)."""
        rows = await self.fetch("worker_extend_leases", worker_id=worker_id, tasks=json_param(held))
        return int(rows[0]["extended"] or 0) if rows else 0

    async def complete_tasks(self, completions: list[dict[str, Any]]) -> list[TaskOutcome]:
        rows = await self.fetch("worker_complete_tasks", results=json_param(completions))
        return [TaskOutcome.from_row(r) for r in rows]

    async def fail_tasks(self, failures: list[dict[str, Any]]) -> list[TaskOutcome]:
        rows = await self.fetch("worker_fail_tasks", results=json_param(failures))
        return [TaskOutcome.from_row(r) for r in rows]

    async def listen_connection(self, queue_name: str) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            self.target.conninfo, autocommit=True, application_name=f"{self.application_name}-listen"
        )
        try:
            stmt = sql.SQL(query("worker_listen")).format(
                channel=sql.Identifier(channel(queue_name))
            )
            await conn.execute(stmt)
            await conn.execute(query("listen_definitions"))
        except BaseException:
            await conn.close()
            raise
        return conn


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # a claimed input nested too deep for json.loads fails its task, not the whole batch
    set_json_loads(safe_loads, conn)
    # ids as PostgreSQL writes them (lowercase, dashed: what str(UUID) gives), the form the
    # worker keys and sends them in, without a UUID object per id and row to format again
    conn.adapters.register_loader("uuid", TextLoader)


def _claim(rows: list[Row]) -> Claim:
    """The rows of start_tasks / claim_tasks. claim_tasks sends a run's input once per
    batch (null on the run's later rows): those tasks share the first row's object."""
    claim = Claim()
    run_inputs: dict[str, Any] = {}
    for r in rows:
        if r["outcome"] == "at_capacity":
            claim.at_capacity = True
            continue
        if r["outcome"] == "rate_limited":
            claim.rate_limited_ms = max(1, int((r["input"] or {}).get("wait_ms") or 1))
            continue
        claim.batch.append(int(r["msg_id"]))
        if r["outcome"] == "claimed":
            run_id = str(r["run_id"])
            if run_id in run_inputs:  # by position: a run's input may itself be JSON null
                r["flow_input"] = run_inputs[run_id]
            else:
                run_inputs[run_id] = r["flow_input"]
            claim.tasks.append(_claimed(r))
        elif r["outcome"] == "unsupported":
            claim.unsupported.append(Unsupported(int(r["msg_id"]), r["flow_slug"], r["step_slug"]))
    return claim


def _claimed(r: Row) -> ClaimedTask:
    return ClaimedTask(
        flow_slug=r["flow_slug"],
        step_slug=r["step_slug"],
        queue_name=r["queue_name"],
        run_id=str(r["run_id"]),
        task_index=int(r["task_index"]),
        input=r["input"],
        flow_input=r["flow_input"],
        attempt=int(r["attempt"]),
        msg_id=int(r["msg_id"]),
        deadline=r.get("deadline_at"),
    )
