"""``WorkerConfig``: every setting of a worker, its default and its validation, in one place.

``flowlane worker`` passes only the options the user gave (its parser has no
defaults of its own), ``Worker(project, queue=..., **options)`` builds one from
keywords, ``flowlane serve`` validates the options it hands to every worker
through it, and the demo builds one per queue. Which queue and (flow, step)
pairs the selector options name is decided with the project at hand
(``flowlane.runtime.selection``); everything else is checked here, without
a project or a database.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowlane import defaults, errors

if TYPE_CHECKING:
    from flowlane.compiler.model import WorkerDoc

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
# what a worker does when its deployment is disabled: exit 3 (a supervisor that can be told
# not to restart it: serve, systemd) or wait until it is enabled, then exit 4 (Kubernetes)
WHEN_DISABLED = ("exit", "wait")

# intervals: seconds greater than 0
_POSITIVE_SECONDS = ("poll_interval", "heartbeat_interval", "requeue_interval")
_PYTHON_ONLY = frozenset({"read_vt", "handle_signals"})  # no `flowlane worker` flag
# counts that must be at least 1 when given (None: the worker document's value, else the default)
_POSITIVE_COUNTS = ("max_concurrent", "batch_size", "read_vt")


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker selects its queue, connects, claims, stops and logs.

    ``max_concurrent`` and ``batch_size`` left at None take the ``kind: worker``
    document's values, else the defaults (:meth:`limits`); a document that leaves them
    out has the same defaults. Every default here comes from ``flowlane.defaults``.
    ``log_level`` and ``log_format`` configure the logs of
    ``flowlane worker``; a program that embeds a ``Worker`` configures its own.
    """

    queue: str | None = None
    flow: str | None = None
    step: str | None = None
    flows: Sequence[str] | None = None  # with --queue or --name: the flows/aliases served
    name: str | None = None  # the deployment name; alone, selects the `kind: worker` document
    dsn: str | None = None
    compile: bool = False
    max_concurrent: int | None = None
    batch_size: int | None = None
    notify: bool = True
    poll_interval: float = defaults.POLL_INTERVAL
    read_vt: int = defaults.READ_VT
    shutdown_timeout: float = defaults.SHUTDOWN_TIMEOUT
    heartbeat_interval: float = defaults.HEARTBEAT_INTERVAL
    requeue_interval: float = defaults.REQUEUE_INTERVAL
    import_paths: Sequence[str] = ()
    handle_signals: bool = True
    log_level: str = "INFO"
    log_format: str = "text"
    when_disabled: str = "exit"

    def __post_init__(self) -> None:
        for option in ("flows", "import_paths"):  # a caller's lists are stored as tuples
            value = getattr(self, option)
            if value is not None:
                object.__setattr__(self, option, tuple(_strings(option, value)))
        for option in ("queue", "flow", "step", "name"):
            _check_text(option, getattr(self, option))
        if self.dsn is not None and not isinstance(self.dsn, str):  # "": not given (db.resolve)
            raise errors.UsageError(f"dsn must be a connection string, not {self.dsn!r}")
        for option in ("compile", "notify", "handle_signals"):
            _check_flag(option, getattr(self, option))
        for option in _POSITIVE_COUNTS:
            _check_count(option, getattr(self, option))
        for option in _POSITIVE_SECONDS:
            _check_interval(option, getattr(self, option))
        _check_shutdown_timeout(self.shutdown_timeout)
        object.__setattr__(self, "log_level", _choice("log_level", self.log_level, LOG_LEVELS))
        object.__setattr__(self, "log_format", _choice("log_format", self.log_format, LOG_FORMATS))
        object.__setattr__(self, "when_disabled",
                           _choice("when_disabled", self.when_disabled, WHEN_DISABLED))

    @classmethod
    def from_options(cls, config: WorkerConfig | None = None, **options: Any) -> WorkerConfig:
        """``config`` (or the defaults) with ``options`` replaced; an unknown option is a
        usage error that lists the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise errors.UsageError(
                f"unknown worker option(s): {', '.join(unknown)}",
                hint=f"worker options: {', '.join(sorted(known))}",
            )
        return dataclasses.replace(config or cls(), **options)

    def limits(self, document: WorkerDoc | None) -> tuple[int, int]:
        """``(max_concurrent, batch_size)``: as given, else the worker document's, else the
        defaults (0 is refused when given, never taken for "unset")."""
        if document is not None:
            return (_first(self.max_concurrent, document.max_concurrent),
                    _first(self.batch_size, document.batch_size))
        return (_first(self.max_concurrent, defaults.MAX_CONCURRENT),
                _first(self.batch_size, defaults.BATCH_SIZE))

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults (what a user would have to type)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }


def _first(*values: int | None) -> int:
    return next(v for v in values if v is not None)


def _flag(option: str) -> str:
    """How a user sets ``option``: its ``flowlane worker`` flag, else its keyword."""
    return option if option in _PYTHON_ONLY else "--" + option.replace("_", "-")


def _strings(option: str, value: Any) -> Sequence[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise errors.UsageError(
            f"{option} must be a list of strings, not {value!r}",
            hint=f"pass a list, e.g. {option}=[{'a'!r}, {'b'!r}]",
        )
    for item in value:
        _check_text(option, item)
    return value


def _check_text(option: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise errors.UsageError(
            f"{option} must be a non-empty string, not {value!r}",
            hint=f"leave {option} out to use its default",
        )


def _check_flag(option: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise errors.UsageError(f"{option} must be True or False, not {value!r}")


def _check_count(option: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.UsageError(
            f"{option} must be a whole number, not {value!r}",
            hint=f"{_flag(option)} takes a positive whole number",
        )
    if value < 1:
        raise errors.UsageError(
            f"{option} must be at least 1, not {value}",
            hint=f"{_flag(option)} takes a positive whole number",
        )


def _check_interval(option: str, value: Any) -> None:
    seconds = _seconds(option, value)
    if not 0 < seconds < math.inf:  # also NaN; 0 would make the worker spin on the database
        raise errors.UsageError(
            f"{option} must be a positive number of seconds, not {seconds:g}",
            hint=f"{_flag(option)} takes seconds greater than 0",
        )


def _check_shutdown_timeout(value: Any) -> None:
    if not _seconds("shutdown_timeout", value) >= 0:  # also NaN
        raise errors.UsageError(
            f"shutdown_timeout must be 0 or more seconds, not {value:g}",
            hint="--shutdown-timeout 0 abandons in-flight handlers at once",
        )


def _seconds(option: str, value: Any) -> float:
    """``value`` as seconds (NaN passes: the callers' comparisons refuse it)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.UsageError(
            f"{option} must be a number of seconds, not {value!r}",
            hint=f"{_flag(option)} takes seconds, e.g. 2 or 0.5",
        )
    return float(value)


def _choice(option: str, value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str):
        for choice in choices:
            if value.casefold() == choice.casefold():
                return choice
    raise errors.UsageError(
        f"{option} must be one of {', '.join(choices)}, not {value!r}",
        hint=f"e.g. {_flag(option)} {choices[0]}",
    )
