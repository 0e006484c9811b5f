"""Import the handlers a worker serves, before it polls anything.

A handler that cannot be imported refuses the start with every problem
listed, each naming the YAML ``file:line`` that references it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowlane import errors, project_root
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

    def __len__(self) -> int:
        return len(self._entries)


class _ImportProblem(Exception):
    pass


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
        raise _ImportProblem(f"module {exc.name!r} not found") from exc
    except Exception as exc:  # the handler module itself is broken
        raise _ImportProblem(
            f"importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise _ImportProblem(f"module {module_name} has no attribute {attr!r}") from exc
    if not callable(target):
        raise _ImportProblem(f"{module_name}:{attr} is not callable")
    func: Handler = target
    return func


def check_handlers(project: Project, import_paths: Iterable[str] = ()) -> list[Diagnostic]:
    """FL072 for every step whose handler cannot be imported or called as ``f(input, ctx)``."""
    for path in import_paths:
        if path not in sys.path:
            sys.path.insert(0, path)
    found: list[Diagnostic] = []
    for flow in project.flows:
        for step in flow.steps:
            if step.handler is None:
                continue  # a wait step
            problem = _handler_problem(step.handler)
            if problem is None:
                continue
            where = step.handler_location or step.location or flow.location
            found.append(Diagnostic(
                where.path if where else flow.slug, where.line if where else 1,
                where.col if where else 1, "FL072",
                f"handler `{step.handler}` of step {flow.slug}.{step.slug}: {problem}",
                "fix the `handler:` entry or make its module importable from the project root "
                "(or pass --import-path)",
                _source_line(where),
            ))
    return found


def _handler_problem(handler: str) -> str | None:
    try:
        func = _import(handler)
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
