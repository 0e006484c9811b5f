"""Import the handlers a worker serves, before it polls anything.

A handler that cannot be imported refuses the start with every problem
listed, each naming the YAML ``file:line`` that references it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlane import errors, project_root
from flowlane.compiler import codes
from flowlane.compiler.diagnostics import Diagnostic
from flowlane.compiler.model import HandlerRef, Location, Project

Handler = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Registered:
    ref: HandlerRef
    func: Handler
    is_async: bool


class HandlerRegistry:
    """``(flow_slug, step_slug) -> handler`` for the pairs routed to one queue."""

    def __init__(self, entries: dict[tuple[str, str], Registered]) -> None:
        self._entries = entries

    @classmethod
    def load(
        cls, handlers: Iterable[HandlerRef], import_paths: Iterable[str] = ()
    ) -> HandlerRegistry:
        for path in import_paths:
            if path not in sys.path:
                sys.path.insert(0, path)
        entries: dict[tuple[str, str], Registered] = {}
        problems: list[str] = []
        for ref in handlers:
            where = f"{ref.flow_slug}.{ref.step_slug}"
            if not ref.handler:
                problems.append(f"step {where} has no handler")
                continue
            try:
                func = _import(ref.handler)
            except _ImportProblem as exc:
                problems.append(
                    f"{source_line(ref.location, ref.flow_slug)}: "
                    f"handler {ref.handler} of step {where}: {exc}"
                )
                continue
            entries[(ref.flow_slug, ref.step_slug)] = Registered(ref, func, _is_async(func))
        if problems:
            raise errors.WorkerError(
                "cannot import the handlers routed to this worker:\n  " + "\n  ".join(problems),
                hint="fix the `handler:` entries or make the modules importable "
                "(run the worker from the project root or pass --import-path)",
            )
        return cls(entries)

    def get(self, flow_slug: str, step_slug: str) -> Registered | None:
        return self._entries.get((flow_slug, step_slug))

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return sorted(self._entries)

    @property
    def serves_sync(self) -> bool:
        """Whether a handler is a plain ``def`` (run in a thread: the worker needs some)."""
        return any(not entry.is_async for entry in self._entries.values())

    @property
    def serves_only_sync(self) -> bool:
        """Whether every handler is a plain ``def`` (the handler threads are then the slots)."""
        return bool(self._entries) and not any(entry.is_async for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)


class _ImportProblem(Exception):
    pass


class _ModuleProblem(_ImportProblem):
    """The handler's module cannot be imported (itself or one of its dependencies)."""

    def __init__(self, module: str, why: str) -> None:
        super().__init__(why)
        self.module = module


def source_line(location: Location | None, fallback: str) -> str:
    """``path:line`` of a YAML declaration, as worker errors cite it."""
    return f"{location.path}:{location.line}" if location else fallback


def _import(handler: str) -> Handler:
    module_name, _, attr = (part.strip() for part in handler.partition(":"))
    if not module_name or not attr:
        raise _ImportProblem("expected `module:callable`")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _ModuleProblem(module_name, f"module {exc.name!r} not found") from exc
    except Exception as exc:  # the handler module itself is broken
        raise _ModuleProblem(
            module_name, f"importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise _ImportProblem(f"module {module_name} has no attribute {attr!r}"
                                 f"{_did_you_mean(attr, module)}") from exc
    if not callable(target):
        raise _ImportProblem(f"{module_name}:{attr} is not callable")
    func: Handler = target
    return func


def _did_you_mean(attr: str, module: Any) -> str:
    """The module's public callables closest to a missing attribute, as a suggestion."""
    callables = [name for name, value in vars(module).items()
                 if callable(value) and not name.startswith("_")]
    close = difflib.get_close_matches(attr, callables, n=3)
    return f"; did you mean {' or '.join(f'`{name}`' for name in close)}?" if close else ""


@dataclass
class HandlerCheck:
    """What importing the handlers found: FL072 findings, and the modules that could not be
    imported here (``module -> why``) when that is not a finding."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    unimportable: dict[str, str] = field(default_factory=dict)

    def notes(self) -> list[str]:
        """One line per module that could not be imported: its handlers were not checked."""
        return [f"note: handlers of module {module} not checked: it cannot be imported here "
                f"({why}); --handlers makes that an error" for module, why in self.unimportable.items()]


def check_handlers(project: Project, import_paths: Iterable[str] = (), *,
                   strict: bool = True) -> HandlerCheck:
    """FL072 for every step whose handler does not resolve to something callable as
    ``f(input, ctx)``. A module that cannot be imported is a finding when ``strict``,
    else it is only listed in ``unimportable`` (its dependencies may be missing here)."""
    for path in import_paths:
        if path not in sys.path:
            sys.path.insert(0, path)
    result = HandlerCheck()
    for flow in project.flows:
        for step in flow.steps:
            if step.handler is None:
                continue  # a wait step
            try:
                problem = _handler_problem(step.handler)
            except _ModuleProblem as exc:
                if not strict:
                    result.unimportable.setdefault(exc.module, str(exc))
                    continue
                problem = str(exc)
            if problem is None:
                continue
            where = step.handler_location or step.location or flow.location
            result.diagnostics.append(Diagnostic(
                where.path if where else flow.slug, where.line if where else 1,
                where.col if where else 1, codes.HANDLER_NOT_CALLABLE,
                f"handler `{step.handler}` of step {flow.slug}.{step.slug}: {problem}",
                "fix the `handler:` entry or make its module importable from the project root "
                "(or pass --import-path)",
                _source_line(where),
            ))
    return result


def _handler_problem(handler: str) -> str | None:
    """What is wrong with a handler, None when nothing is; raises :class:`_ModuleProblem`
    when its module cannot be imported."""
    try:
        func = _import(handler)
    except _ModuleProblem:
        raise
    except _ImportProblem as exc:
        return str(exc)
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin without a signature: trust it
        return None
    try:
        signature.bind(None, None)
    except TypeError as exc:
        return f"cannot be called with (input, ctx): {exc}"
    return None


def _source_line(where: Location | None) -> str | None:
    if where is None:
        return None
    try:
        lines = Path(project_root.find_root(), where.path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        try:
            lines = Path(where.path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            return None
    return lines[where.line - 1] if 0 < where.line <= len(lines) else None


def _is_async(func: Any) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
