"""``flowlane db``: the embedded development database and core migrations."""

from __future__ import annotations

import argparse
from typing import Any

from flowlane import project_root
from flowlane.cli.common import add_dsn_argument, report_error


def configure(subparsers: Any) -> None:
    parser = subparsers.add_parser("db", help="embedded database and core migrations")
    commands = parser.add_subparsers(dest="db_command", metavar="ACTION")
    commands.required = True

    up = commands.add_parser(
        "up", help="start the embedded database (initialise it the first time)"
    )
    up.set_defaults(func=cmd_up)
    down = commands.add_parser("down", help="stop the embedded database")
    down.set_defaults(func=cmd_down)
    url = commands.add_parser("url", help="print the connection URL of the database in use")
    add_dsn_argument(url)
    url.set_defaults(func=cmd_url)
    migrate = commands.add_parser(
        "migrate", help="install PGMQ if absent and apply core migrations"
    )
    add_dsn_argument(migrate)
    migrate.add_argument("--to", metavar="VERSION", help="stop after this migration (e.g. 0001)")
    migrate.add_argument(
        "--roles", action="store_true",
        help="also grant the roles of docs/security.md (creating them when this role may) and "
        "revoke PUBLIC's access; later migrates keep them up to date")
    migrate.set_defaults(func=cmd_migrate)
    roles = commands.add_parser(
        "roles", help="print the statements that create the roles, for a role administrator")
    roles.set_defaults(func=cmd_roles)
    status = commands.add_parser("status", help="list applied and pending core migrations")
    add_dsn_argument(status)
    status.set_defaults(func=cmd_status)
    reset = commands.add_parser(
        "reset", help="drop every flow, run and queue of a development database and migrate it again")
    add_dsn_argument(reset)
    reset.add_argument("--yes", action="store_true", help="confirm: the database's runs are lost")
    reset.set_defaults(func=cmd_reset)


def cmd_up(args: argparse.Namespace) -> int:
    from flowlane.core import db, migrator

    embedded = db.EmbeddedDatabase(project_root.find_root())
    was_running = embedded.running()
    url = embedded.up()
    print(f"embedded PostgreSQL {'already running' if was_running else 'started'}: {url}")
    with db.connect(url, autocommit=True) as conn:
        states = migrator.status(conn)
    pending = [s for s in states if not s.applied]
    if foreign := [f"{s.version}_{s.name}" for s in states if s.foreign]:
        report_error(migrator.development_build(foreign))
    elif pending:
        print(f"{len(pending)} core migration(s) pending; next: `flowlane db migrate`")
    else:
        print("core migrations are up to date; next: `flowlane apply`")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from flowlane.core import db

    embedded = db.EmbeddedDatabase(project_root.find_root())
    stopped = embedded.down()
    print("embedded PostgreSQL stopped" if stopped else "embedded PostgreSQL was not running")
    return 0


def cmd_url(args: argparse.Namespace) -> int:
    from flowlane.core import db

    print(db.resolve(args.dsn, start=False).dsn)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from flowlane.core import db, migrator

    target = db.resolve(args.dsn)
    db.require_direct(target, "flowlane db migrate")
    with db.connect(target, autocommit=True) as conn:
        applied = migrator.migrate(conn, to=args.to, roles=args.roles)
        roles = migrator.roles_applied(conn)
        missing = migrator.missing_roles(conn) if roles else []
        newest = max((s.version for s in migrator.status(conn) if s.applied), default=None)
    for migration in applied:
        print(f"applied {migration.filename}")
    if applied:
        print(f"{len(applied)} migration(s) applied")
    elif args.to and newest and newest > args.to:
        print(f"database is already at {newest}, past {args.to}: migrations are never rolled back")
    else:
        print("database is up to date")
    if roles:
        granted = [role for role in migrator.ROLES if role not in missing]
        print(f"roles {', '.join(granted)} are up to date; grant them to login roles "
              "(docs/security.md)")
    if missing:
        print(f"roles {', '.join(missing)} do not exist: have a role administrator run the "
              "statements `flowlane db roles` prints, then migrate again")
    return 0


def cmd_roles(args: argparse.Namespace) -> int:
    from flowlane.core import migrator

    print(migrator.role_statements(), end="")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from flowlane.core import db, migrator

    target = db.resolve(args.dsn)
    with db.connect(target, autocommit=True) as conn:
        states = migrator.status(conn)
    print(f"database: {db.redact(target.dsn)} ({target.source})")
    pending = 0
    for state in states:
        if state.foreign:
            label = "applied by a development build: no release ships it"
        elif state.applied:
            label = f"applied {state.applied_at:%Y-%m-%d %H:%M:%S%z}"
        else:
            label = "pending"
            pending += 1
        print(f"  {state.version}_{state.name:<24} {label}")
    if foreign := [f"{s.version}_{s.name}" for s in states if s.foreign]:
        report_error(migrator.development_build(foreign))
        return 1
    print(f"{pending} pending" if pending else "up to date")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    from flowlane import errors
    from flowlane.core import db, migrator

    target = db.resolve(args.dsn)
    if not args.yes:
        raise errors.UsageError(
            f"flowlane db reset drops every flow, run and queue in {db.redact(target.dsn)}",
            hint="run it again with --yes where that is what you want (a development database)")
    db.require_direct(target, "flowlane db reset")
    with db.connect(target, autocommit=True) as conn:
        applied = migrator.reset(conn)
    print(f"dropped schemas flowlane and pgmq; applied {len(applied)} migration(s); next: `flowlane apply`")
    return 0
