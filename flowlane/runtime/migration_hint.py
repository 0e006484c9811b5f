"""The hint an error of a database without flowlane's SQL Core (or with an older one) gets:
run `flowlane db migrate`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flowlane import errors

# undefined schema, function, table: flowlane's SQL Core is missing or older than this code
_NOT_MIGRATED = {"3F000", "42883", "42P01"}


@contextlib.contextmanager
def missing_core_hint() -> Iterator[None]:
    try:
        yield
    except errors.DatabaseError as exc:
        if exc.sqlstate in _NOT_MIGRATED:
            exc.hint = (
                "the database lacks flowlane's SQL Core (or an older version): "
                "run `flowlane db migrate`, then `flowlane apply`"
            )
        raise
