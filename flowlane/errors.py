"""Every error flowlane raises on purpose derives from :class:`FlowlaneError`.

The CLI prints ``str(error)`` (one line per cause, plus a hint when there is
one) and never a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

from typing import Any


class FlowlaneError(Exception):
    """A flowlane operation failed."""

    hint: str | None = None

    def __init__(self, message: str | None = None, *, hint: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        if hint is not None:
            self.hint = hint


class UsageError(FlowlaneError):
    """The command line or a function argument is invalid."""


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
