"""Package attributes imported on first use (PEP 562 module ``__getattr__``).

A package ``__init__`` names what it offers and where it lives; nothing is
imported until asked for. So ``import flowlane.runtime.context`` (what handler
modules import) loads neither the worker nor psycopg_pool nor jinja2, and
``import flowlane.compiler`` never loads psycopg.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def exports(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each module -> the names it defines."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain attribute
        return value

    return __getattr__
