"""Where the database is and how to reach it.

Resolution order for a DSN: explicit ``--dsn``, ``FLOWLANE_DSN``,
``DATABASE_URL``, else the project's embedded PostgreSQL in ``.flowlane/``
(started on demand, left running for the next command).

A DSN says that it goes through a transaction-mode pooler (pgbouncer's ``pool_mode =
transaction``) with the parameter ``pooler=transaction`` (``?pooler=transaction`` in a URL,
``pooler=transaction`` among key=value pairs). flowlane removes it before libpq sees the
DSN, and such a connection uses nothing that lives in a server session: no server-side
prepared statements, no LISTEN, no session locks or settings (see ``Target.pooled``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from flowlane import errors, project_root
from flowlane.core.embedded import EmbeddedServer

EMBEDDED_DIRNAME = ".flowlane"
PGDATA_DIRNAME = "pgdata"
ENV_VARS = ("FLOWLANE_DSN", "DATABASE_URL")
POOLER_PARAMETER = "pooler"
POOLER_MODES = ("transaction",)  # a session-mode pooler needs no parameter: it changes nothing
# the parameter in a URL's query, or among key=value pairs (a quoted value or a word)
_URL_POOLER = re.compile(rf"(?<=[?&]){POOLER_PARAMETER}=([^&#]*)&?")
_PAIR_POOLER = re.compile(rf"(?:^|\s+){POOLER_PARAMETER}\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


@dataclass(frozen=True)
class Target:
    """A resolved database: its DSN and, for messages, where it came from."""

    dsn: str
    source: str

    @property
    def embedded(self) -> bool:
        return self.source == "embedded"

    @property
    def conninfo(self) -> str:
        """The DSN libpq gets: without flowlane's ``pooler`` parameter."""
        return split_pooler(self.dsn)[0]

    @property
    def pooled(self) -> bool:
        """True when the DSN says it goes through a transaction-mode pooler: every transaction
        may land on another server session, so nothing may be left in one."""
        return split_pooler(self.dsn)[1] is not None

    def connection_kwargs(self) -> dict[str, Any]:
        """psycopg's settings for this route: through a pooler, no server-side prepared
        statements (the next transaction's session does not have them)."""
        return {"prepare_threshold": None} if self.pooled else {}


def require_direct(target: Target, command: str) -> None:
    """Refuse a transaction-mode pooler for ``command``, which needs one server session
    throughout (a migration holds a session advisory lock so that concurrent migrations
    apply each file once)."""
    if target.pooled:
        raise errors.UsageError(
            f"{command} needs a direct connection to PostgreSQL, not a transaction-mode pooler "
            f"({redact(target.dsn)} says {POOLER_PARAMETER}=transaction)",
            hint="give it the server's own host and port (not pgbouncer's), without "
            f"{POOLER_PARAMETER}=transaction")


def split_pooler(dsn: str) -> tuple[str, str | None]:
    """``dsn`` without its ``pooler`` parameter, and that parameter's value (None: absent)."""
    url = dsn.startswith(("postgresql://", "postgres://"))
    found = (_URL_POOLER if url else _PAIR_POOLER).search(dsn)
    if found is None:
        return dsn, None
    mode = found.group(1).strip("'")
    if mode not in POOLER_MODES:
        raise errors.UsageError(
            f"unknown {POOLER_PARAMETER}={mode} in the connection string {redact(dsn)}",
            hint=f"{POOLER_PARAMETER}=transaction says that the DSN goes through a "
            "transaction-mode pooler (pgbouncer's pool_mode = transaction); leave it out otherwise")
    rest = dsn[:found.start()] + dsn[found.end():]
    return (rest.rstrip("?&") if url else rest.strip()), mode


def resolve(dsn: str | None = None, project_dir: Path | None = None, *, start: bool = True) -> Target:
    """Find the database to use; start the embedded one when nothing else is configured."""
    if dsn:
        return Target(dsn, "--dsn")
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return Target(value, name)
    embedded = EmbeddedDatabase(project_dir or project_root.find_root())
    try:
        return Target(embedded.up() if start else embedded.url(), "embedded")
    except errors.MissingExtra as exc:  # a production install: the database is not given
        raise errors.MissingExtra(exc.extra, "a command without --dsn, FLOWLANE_DSN or DATABASE_URL",
                                  otherwise="set FLOWLANE_DSN to a PostgreSQL server") from exc


class EmbeddedDatabase:
    """The project-local development server under ``.flowlane/`` (see ``core/embedded.py``)."""

    def __init__(self, project_dir: Path) -> None:
        self.root = project_dir.resolve() / EMBEDDED_DIRNAME

    @property
    def pgdata(self) -> Path:
        """``.flowlane/pgdata``, or the server's own directory when root cannot share it."""
        return _server(self.root).pgdata

    def up(self) -> str:
        """Start the server if needed (initialising it the first time); return its DSN."""
        self.root.mkdir(parents=True, exist_ok=True)
        gitignore = self.root / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("*\n")
        return _server(self.root).start()

    def running(self) -> bool:
        return _server(self.root).running()

    def url(self) -> str:
        server = _server(self.root)
        if not server.running():
            raise errors.DatabaseUnavailable(
                f"the embedded database in {server.pgdata} is not running",
                hint="start it with `flowlane db up`",
            )
        return server.dsn()

    @staticmethod
    def start_at(pgdata: Path) -> str:
        """Start (initialising if needed) a server in ``pgdata``; return its DSN. Its private
        files (password, socket directory) go next to it: the parent must be the caller's."""
        return _server(pgdata.parent, pgdata).start()

    @staticmethod
    def stop_at(pgdata: Path) -> None:
        _server(pgdata.parent, pgdata).stop("immediate")

    def down(self) -> bool:
        """Stop the server; return False when it was not running."""
        return _server(self.root).stop()


def _server(root: Path, pgdata: Path | None = None) -> EmbeddedServer:
    return EmbeddedServer(root.resolve(), pgdata.resolve() if pgdata else None)


def redact(dsn: str) -> str:
    """Hide the password of a DSN for messages."""
    # userinfo ends at the last "@" before the path: a raw "@" in a password stays hidden
    dsn = re.sub(r"(://[^:/@]*:)[^/?#]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def connect(target: Target | str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a connection; an unreachable database becomes one clear error."""
    target = as_target(target)
    with _connect_errors(target):
        return psycopg.connect(target.conninfo, autocommit=autocommit,
                               **{**target.connection_kwargs(), **kwargs})


async def connect_async(
    target: Target | str, *, autocommit: bool = False, **kwargs: Any
) -> psycopg.AsyncConnection[Any]:
    """:func:`connect` for asyncio, with the same errors."""
    target = as_target(target)
    with _connect_errors(target):
        return await psycopg.AsyncConnection.connect(
            target.conninfo, autocommit=autocommit, **{**target.connection_kwargs(), **kwargs})


def as_target(target: Target | str) -> Target:
    return Target(target, "dsn") if isinstance(target, str) else target


@contextlib.contextmanager
def _connect_errors(target: Target) -> Iterator[None]:
    try:
        yield
    except psycopg.ProgrammingError as exc:  # the DSN itself cannot be parsed
        raise invalid_dsn(target, exc) from exc
    except psycopg.OperationalError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise errors.DatabaseUnavailable(
            f"cannot connect to {redact(target.dsn)} (from {target.source}): {first_line}",
            hint="start the server, fix the DSN (--dsn, FLOWLANE_DSN or DATABASE_URL), "
            "or unset them to use the embedded database (`flowlane db up`)",
        ) from exc


def invalid_dsn(target: Target, exc: psycopg.ProgrammingError) -> errors.UsageError:
    """The usage error for a connection string libpq cannot parse."""
    shown = redact(target.dsn)
    # libpq quotes fragments of the string: show them only when no password is hidden
    reason = f": {str(exc).strip()}" if shown == target.dsn else ""
    return errors.UsageError(
        f"invalid connection string {shown} (from {target.source}){reason}",
        hint="use a URL (postgresql://user@host:5432/dbname) or key=value pairs "
        "(host=... dbname=...)",
    )


@contextlib.contextmanager
def wrap_errors(action: str | None = None) -> Iterator[None]:
    """Turn psycopg errors into :class:`flowlane.errors.DatabaseError` at the boundary."""
    try:
        yield
    except psycopg.OperationalError as exc:
        if exc.sqlstate is None:
            raise errors.DatabaseUnavailable(_message(exc, action)) from exc
        raise _database_error(exc, action) from exc
    except psycopg.Error as exc:
        raise _database_error(exc, action) from exc


def _message(exc: psycopg.Error, action: str | None) -> str:
    text = exc.diag.message_primary or str(exc).strip().splitlines()[0]
    return f"{action}: {text}" if action else text


def _database_error(exc: psycopg.Error, action: str | None) -> errors.DatabaseError:
    return errors.DatabaseError(
        _message(exc, action),
        hint=exc.diag.message_hint,
        detail=exc.diag.message_detail,
        sqlstate=exc.sqlstate,
    )
