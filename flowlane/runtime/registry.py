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
from typing import Any

from flowlane import errors
from flowlane.compiler.model import HandlerRef, Location

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


def _is_async(func: Any) -> bool:
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
