"""``flowlane ui``: the local web console."""

from __future__ import annotations

import argparse
import os
from typing import Any

from flowlane import errors, extras
from flowlane.cli.common import add_dsn_argument


def configure(subparsers: Any) -> None:
    ui = subparsers.add_parser(
        "ui",
        help="serve the web console: flows, runs, queues, workers",
        description="A local web console over the database. Binds 127.0.0.1 by default; "
        "any other address requires a token that every request must carry. Read-only "
        "unless --allow-actions.",
    )
    add_dsn_argument(ui)
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    ui.add_argument(
        "--token",
        help="require this token on every request (default: $FLOWLANE_UI_TOKEN); "
        "mandatory for a non-loopback --host",
    )
    ui.add_argument(
        "--allow-actions",
        action="store_true",
        help="offer cancel, retry and deployment enable/disable (each confirmed, CSRF-protected)",
    )
    ui.add_argument("--refresh", type=float, default=2.0,
                    help="seconds between live updates of the runs list and a running run (default 2)")
    ui.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    from flowlane.core import db

    with extras.needs("console", "flowlane ui"):
        from flowlane.ui import app, security, server

    if not 0 <= args.port <= 65535:
        raise errors.UsageError(f"--port must be between 0 and 65535, not {args.port}")
    if args.refresh <= 0:
        raise errors.UsageError(f"--refresh must be positive, not {args.refresh:g}")
    token = args.token or os.environ.get(security.TOKEN_ENV) or None
    security.check_bind(args.host, token)
    settings = app.Settings(token=token, allow_actions=args.allow_actions,
                            refresh_ms=max(int(args.refresh * 1000), 100))
    server.serve(db.resolve(args.dsn), args.host, args.port, settings)
    return 0
