"""The embedded database is private to the user who starts it."""

from __future__ import annotations

import stat
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from flowlane import errors
from flowlane.core import db
from flowlane.core.embedded import SOCKET_PATH_MAX, Account, EmbeddedServer

pytestmark = pytest.mark.slow  # embedded PostgreSQL servers of their own


@pytest.fixture
def long_project(reachable_tmp_path: Path) -> Path:
    # the wheel put the socket of such a project in a shared 0777 directory, with trust auth
    project = reachable_tmp_path / ("p" * 60) / ("q" * 60)
    project.mkdir(parents=True)
    assert len(str(project / ".flowlane" / "run" / ".s.PGSQL.5432")) > SOCKET_PATH_MAX
    return project


def private(path: Path) -> bool:
    return not path.stat().st_mode & 0o077


def test_a_long_path_project_keeps_its_socket_private(long_project: Path) -> None:
    embedded = db.EmbeddedDatabase(long_project)
    before = {p: p.stat().st_mode for p in long_project.parents}
    try:
        dsn = embedded.up()
        params = conninfo_to_dict(dsn)
        socket_dir = Path(str(params["host"]))
        assert private(socket_dir) and socket_dir.is_dir()
        assert stat.S_IMODE((socket_dir / ".s.PGSQL.5432").stat().st_mode) == 0o700
        passfile = Path(str(params["passfile"]))
        assert passfile.parent == long_project / ".flowlane"
        assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
        assert private(embedded.pgdata)
        with psycopg.connect(dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        # the password is required: the same socket without the passfile is refused
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=str(socket_dir), user="postgres", dbname="postgres").close()
        # nothing outside .flowlane/ changed its permissions
        assert {p: p.stat().st_mode for p in long_project.parents} == before
        assert embedded.up() == dsn  # a second up finds the same private directory
    finally:
        embedded.down()


def test_the_server_runs_without_group_0(reachable_tmp_path: Path) -> None:
    embedded = db.EmbeddedDatabase(reachable_tmp_path)
    try:
        embedded.up()
        pid = int((embedded.pgdata / "postmaster.pid").read_text().splitlines()[0])
        status = Path(f"/proc/{pid}/status").read_text()
        gids = next(line for line in status.splitlines() if line.startswith("Gid:")).split()[1:]
        groups = next(line for line in status.splitlines() if line.startswith("Groups:"))
        assert "0" not in gids and groups.split()[1:] in ([], [gids[0]])
        hba = (embedded.pgdata / "pg_hba.conf").read_text()
        assert "trust" not in hba and "scram-sha-256" in hba
    finally:
        embedded.down()


def test_an_unreachable_data_directory_given_explicitly_is_refused_not_opened_up(
    reachable_tmp_path: Path,
) -> None:
    # the wheel added o+rx to every ancestor of the data directory; flowlane never does
    closed = reachable_tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    root = closed / "project" / ".flowlane"
    server = EmbeddedServer(root, root / "pgdata")
    server.account = Account(uid=65534, gid=65534)  # as for root: a server account, not us
    with pytest.raises(errors.DatabaseUnavailable, match="is not searchable by it") as caught:
        server.start()
    assert "chmod o+x" in str(caught.value.hint)
    assert stat.S_IMODE(closed.stat().st_mode) == 0o700
    assert not (server.pgdata).exists()


def test_root_in_a_private_directory_runs_the_quick_start() -> None:
    """Root's 0700 home, any `mktemp -d`: the server's files go to a directory of the server
    account's own, recorded in .flowlane/; nothing outside .flowlane/ changes its mode."""
    import os
    import shutil
    import tempfile

    from tests.cli_support import run_flowlane

    private_dir = Path(tempfile.mkdtemp(prefix="flowlane-private-"))  # 0700, like root's home
    project = private_dir / "proj"
    project.mkdir()
    before = {p: p.stat().st_mode for p in (private_dir, *private_dir.parents)}
    home: Path | None = None
    try:
        for command in (("init",), ("demo",)):
            result = run_flowlane(*command, cwd=project, timeout=300)
            assert result.returncode == 0, result.stdout + result.stderr
        state = project / ".flowlane"
        if os.geteuid() == 0:  # the server runs as its own account, which cannot enter here
            home = Path((state / "server_dir").read_text().strip())
            owner = home.stat()
            assert owner.st_uid != 0 and stat.S_IMODE(owner.st_mode) == 0o700
            assert (home / "pgdata" / "PG_VERSION").exists()
            assert not (state / "pgdata").exists()
        assert {p: p.stat().st_mode for p in (private_dir, *private_dir.parents)} == before
        assert stat.S_IMODE((state / "pgpass").stat().st_mode) == 0o600
        dsn = db.EmbeddedDatabase(project).url()
        params = conninfo_to_dict(dsn)
        with psycopg.connect(dsn) as conn:  # no TCP listener
            assert conn.execute("show listen_addresses").fetchone() == ("",)
        without_password = {k: v for k, v in params.items() if k != "passfile"}
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(**without_password).close()
    finally:
        db.EmbeddedDatabase(project).down()
        shutil.rmtree(private_dir, ignore_errors=True)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [("postgresql://u:p@ss@host/db", "postgresql://u:***@host/db"),
     ("postgresql://u:secret@h:5/db?x=1", "postgresql://u:***@h:5/db?x=1"),
     ("postgresql://u:pw@/db?host=/tmp/x@y", "postgresql://u:***@/db?host=/tmp/x@y"),
     ("host=h password=a@b user=u", "host=h password=*** user=u")],
)
def test_redact_hides_a_password_with_a_raw_at_sign(dsn: str, shown: str) -> None:
    assert db.redact(dsn) == shown


def test_a_trust_data_directory_from_before_gets_a_password(reachable_tmp_path: Path) -> None:
    # what the wheel's initdb left in .flowlane/pgdata before: trust for every connection
    root = reachable_tmp_path / ".flowlane"
    server = EmbeddedServer(root)
    root.mkdir()
    server.pgdata.mkdir(mode=0o700)
    server.account.owns(server.pgdata)
    server._run("initdb", "-D", str(server.pgdata), "-U", "postgres", "--auth=trust")
    try:
        dsn = server.start()
        assert "trust" not in (server.pgdata / "pg_hba.conf").read_text()
        assert stat.S_IMODE(server.pgpass.stat().st_mode) == 0o600
        with psycopg.connect(dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        socket_dir = str(conninfo_to_dict(dsn)["host"])
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=socket_dir, user="postgres", dbname="postgres").close()
    finally:
        server.stop()
