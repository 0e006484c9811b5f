"""Every error flowlane raises on purpose derives from :class:`FlowlaneError`.

The CLI prints ``str(error)`` (one line per cause, plus a hint when there is
one) and never a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import enum
from typing import Any


class WorkerExit(enum.IntEnum):
    """A worker's exit statuses (every command's are the same), one meaning each, which
    every supervisor answers alike (``flowlane serve``, the systemd unit, the Kubernetes
    manifests; docs/runtime.md's table)."""

    STOPPED = 0  # stopped on request (a signal, ``stop()``): restarted unless the supervisor asked
    FAILED = 1  # refused to start (handlers, shapes, coverage, database) or crashed: backoff
    USAGE = 2  # bad arguments: restarting repeats them
    DISABLED = 3  # the deployment is disabled: never restart until it is enabled again
    RESTART = 4  # stopped for new definitions (a rollout, new routing): restart now, current YAML


# the statuses no supervisor restarts: a worker that must wait for them under a supervisor
# that restarts everything (Kubernetes) runs with ``--when-disabled wait`` and never exits 3
NOT_RESTARTED: frozenset[WorkerExit] = frozenset({WorkerExit.USAGE, WorkerExit.DISABLED})


class FlowlaneError(Exception):
    """A flowlane operation failed."""

    hint: str | None = None
    exit_code: int = WorkerExit.FAILED  # the CLI's exit status for this error

    def lines(self) -> str:
        """The error as every command prints it: its ``error:`` line(s), then ``hint:``."""
        return f"error: {self}" + (f"\nhint: {self.hint}" if self.hint else "")

    def __init__(self, message: str | None = None, *, hint: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        if hint is not None:
            self.hint = hint


class UsageError(FlowlaneError):
    """The command line or a function argument is invalid."""

    exit_code = WorkerExit.USAGE


class MissingExtra(FlowlaneError):
    """A feature needs an optional part of flowlane that is not installed."""

    def __init__(self, extra: str, feature: str, otherwise: str | None = None) -> None:
        install = f"pip install 'flowlane[{extra}]'"
        super().__init__(f"{feature} needs the {extra} extra",
                         hint=f"{install}, or {otherwise}" if otherwise else install)
        self.extra = extra


class DatabaseError(FlowlaneError):
    """The database rejected an operation."""

    def __init__(
        self,
        message: str | None = None,
        *,
        hint: str | None = None,
        detail: str | None = None,
        sqlstate: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.detail = detail
        self.sqlstate = sqlstate


class NotFound(FlowlaneError):
    """No flow, alias or run of that name or id in the database, or a run id prefix that does
    not start exactly one run id: a failure (exit status 1), not a usage error."""


class InputRefused(DatabaseError):
    """The database refused a start's input (its flow's ``input_schema``, a map step's array,
    a run id already in use); no run was started.

    When the flow's ``input_schema`` refused it: ``path`` is where in the input (a JSON
    pointer, ``/`` for the whole input), ``rule`` the schema rule that refused it, and, for a
    start of many runs, ``position`` which input (from 0, over all the inputs given)."""

    def __init__(
        self,
        message: str | None = None,
        *,
        hint: str | None = None,
        detail: str | None = None,
        sqlstate: str | None = None,
        position: int | None = None,
        path: str | None = None,
        rule: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint, detail=detail, sqlstate=sqlstate)
        self.position = position
        self.path = path
        self.rule = rule


class SignalRefused(DatabaseError):
    """The SQL Core refused a signal (unknown run or step, not a wait step, a finished run or
    step, a second signal); nothing changed."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached."""


class MigrationError(DatabaseError):
    """A core migration cannot be applied."""


class CompileError(FlowlaneError):
    """The flow YAML has errors; ``diagnostics`` lists every finding."""

    def __init__(
        self,
        message: str | None = None,
        *,
        hint: str | None = None,
        diagnostics: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(message, hint=hint)
        self.diagnostics = diagnostics


class StaleOutputError(CompileError):
    """The compiled SQL does not match the flow YAML."""


class DeployRefused(FlowlaneError):
    """The database holds a flow whose shape differs from the YAML; nothing was applied."""


class ProjectError(FlowlaneError):
    """The flowlane project cannot be loaded."""


class WorkerError(FlowlaneError):
    """A worker cannot start or had to stop."""


class WorkerDisabled(WorkerError):
    """The worker's deployment is disabled (or was just disabled because the worker met work
    it cannot handle): a supervisor must not restart it until an operator enables it."""

    exit_code = WorkerExit.DISABLED


class WorkerOutdated(WorkerError):
    """The database now routes to the worker's queue a (flow, step) its registry does not
    serve (a new version, an alias move): it stopped before claiming that work and wants
    to be restarted with the project's current YAML."""

    exit_code = WorkerExit.RESTART


class WorkerDeprecated(WorkerError):
    """A rollout deprecated the worker: it stopped gracefully so that it can be restarted
    with the definitions the rollout applies (its restart waits while the rollout keeps its
    deployment disabled, under ``--when-disabled wait``)."""

    exit_code = WorkerExit.RESTART


class DeploymentEnabled(WorkerError):
    """A worker that waited while its deployment was disabled saw it enabled again: it exits
    to be restarted with the project's current YAML and the current definitions."""

    exit_code = WorkerExit.RESTART
