"""The console's database side (`flowlane ui`): bounded read queries and the operator actions.

Queries live in ``flowlane/core/sql/console.sql``. The web layer (``flowlane/ui``) never
touches psycopg: it calls :class:`Console` and renders what it returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from flowlane import errors
from flowlane.app.fleet import waiting_reasons
from flowlane.core import db, migrator
from flowlane.core.queries import query
from flowlane.runtime.client import PREFIX_CANDIDATES, Client, Repair, RunFilter, only_run, prefix_range
from flowlane.runtime.report import first_waits

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
TASKS_PER_STEP = 20
PAYLOAD_LIMIT = 64 * 1024  # characters of a JSON value shown on demand
THROUGHPUT_MINUTES = 15
FAILURE_HOURS = 24


# The operator actions and their named queries: the same as `flowlane cancel|retry [--from]` and
# `flowlane worker enable|disable`. Their SQL functions exist wherever the console runs
# (open() refuses a database with pending migrations).
ACTIONS = {
    "cancel": "client_cancel_run",
    "retry": "client_retry_run",
    "rerun": "client_retry_run_from",  # a failed or completed run, from a step
    "approve": "console_decide",  # a signal {approved: true, by, at, comment}
    "reject": "console_decide",
    "set_deployment_enabled": "fleet_set_enabled",
    "pause_schedule": "console_pause_schedule",
    "resume_schedule": "console_resume_schedule",
    "trigger_schedule": "console_trigger_schedule",
}


@dataclass(frozen=True)
class RunPage:
    """One page of runs, newest first; ``next_cursor`` continues after its last row."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


def encode_cursor(started_at: datetime, run_id: uuid.UUID | str) -> str:
    return f"{started_at.isoformat()}_{run_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    started, _, run_id = cursor.rpartition("_")
    try:
        return datetime.fromisoformat(started), str(uuid.UUID(run_id))
    except ValueError:
        raise errors.UsageError(f"invalid page cursor {cursor!r}") from None


def parse_run_id(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


class Console:
    """Read access (and, when asked for, actions) over a small connection pool."""

    def __init__(self, target: db.Target, *, max_connections: int = 4) -> None:
        self.target = target
        self._pool: ConnectionPool[Any] = ConnectionPool(
            target.conninfo, min_size=1, max_size=max_connections, open=False,
            # custom plans only: the filters are "param is null or ..." and a generic plan
            # cannot drop the branches that do not apply
            kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": None},
        )

    def open(self) -> None:
        # fail now with flowlane's clear error rather than on the first page view
        with db.connect(self.target) as conn:
            pending = [s.migration.filename for s in migrator.status(conn) if s.migration and not s.applied]
        if pending:
            raise errors.FlowlaneError(
                f"{db.redact(self.target.dsn)} is not migrated: pending {', '.join(pending)}",
                hint="migrate it first: `flowlane db migrate`",
            )
        self._pool.open(wait=True)

    def close(self) -> None:
        self._pool.close()

    def _rows(self, query_name: str, **params: Any) -> list[dict[str, Any]]:
        with db.wrap_errors(f"console query {query_name}"), self._pool.connection() as conn:
            rows: list[dict[str, Any]] = conn.execute(query(query_name), params).fetchall()
            return rows

    def _row(self, query_name: str, **params: Any) -> dict[str, Any] | None:
        rows = self._rows(query_name, **params)
        return rows[0] if rows else None

    # flows and aliases

    def flows(self) -> list[dict[str, Any]]:
        return self._rows("console_flows")

    def aliases(self) -> list[dict[str, Any]]:
        return self._rows("console_aliases")

    def alias_history(self, aliases: Sequence[str]) -> list[dict[str, Any]]:
        return self._rows("console_alias_history", aliases=list(aliases))

    def flow(self, flow_slug: str) -> dict[str, Any] | None:
        return self._row("console_flow", flow_slug=flow_slug)

    def flow_steps(self, flow_slug: str) -> list[dict[str, Any]]:
        return self._rows("console_flow_steps", flow_slug=flow_slug)

    def flow_names(self, name: str) -> list[str]:
        """The concrete slugs a runs filter stands for (an alias: every version it named);
        the same rule as ``flowlane runs --flow``."""
        row = self._row("client_flow_filter", flow=name)
        return list(row["flows"] or []) if row else []

    # runs

    def runs(self, *, flow: str | None = None, status: str | None = None,
             since: datetime | None = None, until: datetime | None = None,
             cursor: str | None = None, limit: int = PAGE_SIZE) -> RunPage:
        after_started_at, after_run_id = decode_cursor(cursor) if cursor else (None, None)
        params = {"status": status, "since": since, "until": until, "after_started_at": after_started_at,
                  "after_run_id": after_run_id, "limit": limit + 1}
        if flow:
            rows = self._rows("console_runs_of_flows", flows=self.flow_names(flow), **params)
        else:
            rows = self._rows("console_runs", **params)
        more = len(rows) > limit
        rows = self._with_waits(rows[:limit])
        last = rows[-1] if more else None
        return RunPage(rows, encode_cursor(last["started_at"], last["run_id"]) if last else None)

    def _with_waits(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The runs with what each waits for first (``waiting_for``), as `flowlane runs` says."""
        waiting = [r["run_id"] for r in rows if r["status"] in ("started", "waiting")]
        waits = first_waits(self._rows("run_waits", run_ids=waiting)
                            if waiting else [])
        return [{**r, "waiting_for": waits.get(str(r["run_id"]))} for r in rows]

    def run(self, run_id: str) -> dict[str, Any] | None:
        return self._row("console_run", run_id=run_id)

    def run_by_prefix(self, prefix: str) -> str:
        """The one run id that starts with ``prefix``, by the client's rule (as the CLI
        takes it); errors.UsageError or errors.NotFound, with the candidates, otherwise."""
        low, high = prefix_range(prefix)
        rows = self._rows("client_runs_by_prefix", low=low, high=high, limit=PREFIX_CANDIDATES)
        return only_run(rows, prefix.strip())

    def family(self, run_id: str) -> dict[str, Any]:
        """The run's parent (or None) and child runs, as ``flowlane run`` shows them."""
        row = self._row("console_run_family", run_id=run_id)
        family: dict[str, Any] = (row or {}).get("family") or {"parent": None, "children": []}
        return family

    def waiting(self, run_id: str) -> list[str]:
        """Why the run's queued work waits (no live worker, a disabled deployment)."""
        return waiting_reasons(
            self._rows("fleet_waiting_queues", run_id=run_id))

    def holds(self, run_id: str) -> list[dict[str, Any]]:
        """What the run and its steps and tasks wait for (``run_waits``: concurrency, queue
        limits, a signal, a child run, a stale worker's task)."""
        return self._rows("run_waits", run_ids=[run_id])

    def run_steps(self, run_id: str) -> list[dict[str, Any]]:
        return self._rows("console_run_steps", run_id=run_id)

    def run_tasks(self, run_id: str, per_step: int = TASKS_PER_STEP) -> list[dict[str, Any]]:
        return self._rows("console_run_tasks", run_id=run_id, per_step=per_step)

    def run_attempts(self, run_id: str, per_step: int = TASKS_PER_STEP) -> list[dict[str, Any]]:
        """Failed and stalled attempts with their error type, message and traceback."""
        return self._rows("console_run_attempts", run_id=run_id, per_step=per_step)

    def payload(self, run_id: str, what: str, step_slug: str | None = None,
                task_index: int | None = None, limit: int = PAYLOAD_LIMIT) -> dict[str, Any] | None:
        """A run's input/output, a step's output or a task's output: at most ``limit`` characters
        of its JSON text (``text``) and its full size (``bytes``); None when there is no such row."""
        if what in ("input", "output") and step_slug is None:
            return self._row(f"console_run_{what}", run_id=run_id, limit=limit)
        if what == "output" and step_slug is not None and task_index is None:
            return self._row("console_step_output", run_id=run_id, step_slug=step_slug, limit=limit)
        if what == "output" and step_slug is not None:
            return self._row("console_task_output", run_id=run_id, step_slug=step_slug,
                             task_index=task_index, limit=limit)
        raise errors.UsageError(f"no payload {what!r} for this selection")

    # failures

    def failures(self, hours: int = FAILURE_HOURS) -> list[dict[str, Any]]:
        """The runs failed in the last ``hours``, grouped by flow, failed step and error type,
        most first: each group's count, first and last failure, and count per hour (oldest
        first)."""
        groups: dict[tuple[str, str | None, str | None], dict[str, Any]] = {}
        for row in self._rows("console_failures", hours=hours):
            key = (row["flow_slug"], row["step_slug"], row["error_type"])
            group = groups.setdefault(key, {"flow_slug": key[0], "step_slug": key[1], "error_type": key[2],
                                            "runs": 0, "first_failed_at": row["first_failed_at"],
                                            "last_failed_at": row["last_failed_at"], "hourly": [0] * hours})
            group["runs"] += row["runs"]
            group["first_failed_at"] = min(group["first_failed_at"], row["first_failed_at"])
            group["last_failed_at"] = max(group["last_failed_at"], row["last_failed_at"])
            if 0 <= row["hours_ago"] < hours:
                group["hourly"][hours - 1 - row["hours_ago"]] += row["runs"]
        return sorted(groups.values(), key=lambda g: (-g["runs"], g["flow_slug"], g["step_slug"] or "",
                                                      g["error_type"] or ""))

    def retry_failures(self, flow: str, step: str, error_type: str) -> Repair:
        """Retry every failed run of a failures group (the bulk retry of `flowlane retry
        --flow --step --error-type`, in its batches)."""
        with Client(self.target.dsn) as client:
            return client.repair("retry", RunFilter(flow=flow, step=step, error_type=error_type))

    # queues and workers

    def queues(self) -> list[dict[str, Any]]:
        return self._rows("console_queues")

    def throughput(self, minutes: int = THROUGHPUT_MINUTES) -> dict[str, list[int]]:
        """Per queue, tasks completed in each of the last ``minutes`` minutes (oldest first)."""
        series: dict[str, list[int]] = {}
        for row in self._rows("console_queue_throughput", minutes=minutes):
            counts = series.setdefault(row["queue_name"], [0] * minutes)
            if 0 <= row["minutes_ago"] < minutes:
                counts[minutes - 1 - row["minutes_ago"]] = row["completed"]
        return series

    def queue_routes(self) -> dict[str, list[tuple[str, str]]]:
        routes: dict[str, list[tuple[str, str]]] = {}
        for row in self._rows("console_queue_routes"):
            routes.setdefault(row["queue_name"], []).append((row["flow_slug"], row["step_slug"]))
        return routes

    def workers(self, limit: int = 200) -> list[dict[str, Any]]:
        return self._rows("console_workers", limit=limit)

    def schedules(self) -> list[dict[str, Any]]:
        return self._rows("client_schedules")

    def triggers(self) -> list[dict[str, Any]]:
        return self._rows("client_triggers")

    def webhooks(self) -> list[dict[str, Any]]:
        """The webhooks that started a run or sent a signal (webhooks live in the YAML, which
        the console does not read)."""
        return self._rows("client_webhook_activity")

    def deployments(self) -> list[dict[str, Any]]:
        return self._rows("console_deployments")

    # actions

    def perform(self, name: str, **params: Any) -> str | None:
        """Carry out an action; what it did, when there is more to say than "done"."""
        if name == "retry_failures":
            done = self.retry_failures(**params)
            return (f"retried {done.changed} of {done.matched} matching runs in {done.batches} "
                    f"batch{'es' if done.batches != 1 else ''}")
        if name not in ACTIONS:
            raise errors.UsageError(f"unknown action {name!r}")
        self._rows(ACTIONS[name], **params)
        return None
