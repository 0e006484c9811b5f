"""Debian's pgbouncer (``sh tools/install-pgbouncer.sh``) in transaction mode in front of the
suite's PostgreSQL: its own configuration in a private directory, a free port on 127.0.0.1,
``scram-sha-256`` for its clients and towards the server (the embedded server's
authentication), every database of the server behind it (``*``).

Run as root, pgbouncer refuses to start: it runs as the embedded server's account, the only
one that may open that server's socket directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

from flowlane.core import embedded
from tests.runtime.rt_support import wait_until

BINARY = "/usr/sbin/pgbouncer"  # where Debian's package puts it (not on every user's PATH)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _password(params: dict[str, object]) -> str:
    """The password of the server's DSN: given, or from its passfile (``*`` fields only)."""
    if params.get("password"):
        return str(params["password"])
    passfile = Path(str(params["passfile"]))
    for line in passfile.read_text().splitlines():
        *_, user, password = line.split(":", 4)
        if user in ("*", params.get("user")):
            return password
    raise AssertionError(f"no password for {params.get('user')} in {passfile}")


class PgBouncer:
    """One pgbouncer process; :meth:`dsn` turns a direct DSN into one through it."""

    def __init__(self, server_dsn: str, *, pool_size: int = 20) -> None:
        binary = shutil.which("pgbouncer") or BINARY
        assert Path(binary).exists(), "pgbouncer is not installed: run `sh tools/install-pgbouncer.sh`"
        self.server_dsn = server_dsn
        params = conninfo_to_dict(server_dsn)
        self.user = str(params.get("user") or embedded.ROLE)
        self.password = _password(params)
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="flowlane-pgbouncer-"))
        self.log = self.dir / "pgbouncer.log"
        server = f"host={params.get('host') or 'localhost'} port={params.get('port') or 5432}"
        (self.dir / "userlist.txt").write_text(f'"{self.user}" "{self.password}"\n')
        (self.dir / "pgbouncer.ini").write_text(
            f"[databases]\n* = {server}\n\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = scram-sha-256\nauth_file = {self.dir / 'userlist.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
            f"logfile = {self.log}\n")
        account = embedded.server_account()  # root: the server's account; else ourselves
        args = [binary, str(self.dir / "pgbouncer.ini")]
        if account.uid is not None:
            for path in (self.dir, *self.dir.iterdir()):
                account.owns(path)
            args[1:1] = ["-u", embedded.SERVER_ACCOUNT]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout=30, interval=0.05, message="pgbouncer to accept connections")

    def dsn(self, server_dsn: str, *, marked: bool = True) -> str:
        """``server_dsn``'s database through pgbouncer; ``marked``: with ``pooler=transaction``."""
        dbname = str(conninfo_to_dict(server_dsn).get("dbname") or self.user)
        url = (f"postgresql://{quote(self.user)}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/"
               f"{quote(dbname)}")
        return url + ("?pooler=transaction" if marked else "")

    def _answers(self) -> bool:
        assert self.process.poll() is None, f"pgbouncer exited: {self.log_text()}"
        try:
            with psycopg.connect(self.dsn(self.server_dsn, marked=False), connect_timeout=2) as conn:
                conn.execute("select 1")
        except psycopg.OperationalError:
            return False
        return True

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def version() -> str:
    """``pgbouncer --version``'s first line (``PgBouncer 1.18.0`` on Debian 12)."""
    binary = shutil.which("pgbouncer") or BINARY
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True,
                          env={**os.environ, "LC_ALL": "C"})
    return done.stdout.splitlines()[0]
