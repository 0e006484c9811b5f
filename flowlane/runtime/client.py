"""Start runs and inspect them."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg.rows import dict_row

from flowlane import errors
from flowlane.core import db
from flowlane.core.queries import query
from flowlane.runtime import hints

TERMINAL = ("completed", "failed")


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    flow_slug: str
    status: str
    remaining_steps: int
    started_at: datetime
    completed_at: datetime | None
    failed_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "flow_slug": self.flow_slug,
            "status": self.status,
            "remaining_steps": self.remaining_steps,
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
            "failed_at": _iso(self.failed_at),
        }


@dataclass(frozen=True)
class StuckRun:
    """A started run that no task can move (``flowlane.stuck_runs()``)."""

    run_id: str
    flow_slug: str
    started_at: datetime
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "flow_slug": self.flow_slug,
                "started_at": _iso(self.started_at), "reason": self.reason}


# start_flow's refusals of the caller's input (not of the database state)
_START_HINTS = {
    "22023": "this flow's first step maps over the run input: pass a JSON array, e.g. --input '[1, 2, 3]'",
    "23505": "a run id names one run: pass another --run-id, or none for a new one",
}


def _run_id(text: str) -> str:
    """``text`` as a canonical UUID string; a usage error when it is not one."""
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise errors.UsageError(
            f"{text!r} is not a run id (expected a UUID)",
            hint="`flowlane runs` lists run ids",
        ) from None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class Client:
    """``Client(dsn)``: one connection; also a context manager.

    ``dsn`` None resolves like the CLI: ``FLOWLANE_DSN``, ``DATABASE_URL``, else
    the embedded database of ``project_dir`` (default: the current directory).
    """

    def __init__(self, dsn: str | None = None, *, project_dir: Path | None = None) -> None:
        self.target = db.resolve(dsn, project_dir)
        self._conn: psycopg.Connection[dict[str, Any]] | None = None

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self.target, autocommit=True, row_factory=dict_row)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _rows(self, name: str, action: str, **params: Any) -> list[dict[str, Any]]:
        with hints.migrate_hint(), db.wrap_errors(action):
            return self._connection().execute(query(name), params).fetchall()

    def start_run(self, flow: str, input: Any = None, *, run_id: str | None = None) -> str:
        """Start a run of a concrete flow or an alias; return its id."""
        return self.start(flow, input, run_id=run_id)[0]

    def start(self, flow: str, input: Any = None, *, run_id: str | None = None) -> tuple[str, str]:
        """Start a run; return ``(run_id, concrete flow slug)`` (an alias: its active version)."""
        try:
            payload = json.dumps({} if input is None else input, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise errors.UsageError(f"the run input is not JSON-serialisable: {exc}") from exc
        if run_id is not None:
            run_id = _run_id(run_id)
        try:
            rows = self._rows(
                "client_start_flow", f"cannot start {flow}", flow=flow, input=payload, run_id=run_id
            )
        except errors.DatabaseError as exc:
            if (exc.sqlstate or "") not in _START_HINTS:
                raise
            hint = exc.hint or _START_HINTS[exc.sqlstate or ""]  # the database's hint first
            raise errors.UsageError(str(exc), hint=hint) from exc
        if not rows:
            raise errors.DatabaseError(f"start_flow({flow!r}) returned no run")
        return str(rows[0]["run_id"]), str(rows[0]["flow_slug"])

    def list_runs(
        self, *, limit: int = 20, flow: str | None = None, status: str | None = None
    ) -> list[RunSummary]:
        if limit < 0:
            raise errors.UsageError(f"the run limit must be 0 or more, not {limit}")
        rows = self._rows("client_list_runs", "cannot list runs", limit=limit, flow=flow, status=status)
        return [
            RunSummary(
                run_id=str(r["run_id"]),
                flow_slug=r["flow_slug"],
                status=r["status"],
                remaining_steps=r["remaining_steps"],
                started_at=r["started_at"],
                completed_at=r["completed_at"],
                failed_at=r["failed_at"],
            )
            for r in rows
        ]

    def stuck_runs(self) -> list[StuckRun]:
        """Started runs without a queued, leased or retry-delayed task: nothing will move them."""
        rows = self._rows("client_stuck_runs", "cannot check for stuck runs")
        return [StuckRun(str(r["run_id"]), r["flow_slug"], r["started_at"], r["reason"])
                for r in rows]

    def get_run(self, run_id: str) -> dict[str, Any]:
        """``{"run": {...}, "steps": [...], "tasks": [...]}``; raises when there is no such run."""
        rows = self._rows("client_get_run", "cannot read the run", run_id=_run_id(run_id))
        if not rows or rows[0]["run"] is None:
            raise errors.FlowlaneError(f"no run {run_id}", hint="`flowlane runs` lists recent runs")
        run: dict[str, Any] = rows[0]["run"]
        return run

    def wait(self, run_id: str, *, timeout: float = 60.0, interval: float = 0.1) -> dict[str, Any]:
        """Poll until the run is completed or failed; raise after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.get_run(run_id)
            if state["run"]["status"] in TERMINAL:
                return state
            if time.monotonic() >= deadline:
                raise errors.FlowlaneError(
                    f"run {run_id} is still {state['run']['status']} after {timeout:g}s"
                )
            time.sleep(interval)
