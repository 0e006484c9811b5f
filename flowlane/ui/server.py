"""Serve the console with uvicorn on a socket we bind ourselves (so ``--port 0`` works)."""

from __future__ import annotations

import socket
import threading

import uvicorn

from flowlane import errors
from flowlane.app.console import Console
from flowlane.core import db
from flowlane.runtime.ticker import Ticker
from flowlane.ui import app, security


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio sets TCP_NODELAY only on sockets that say IPPROTO_TCP,
    # and without it every keep-alive response waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise errors.UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                                hint="choose another --port (0 picks a free one) or --host") from exc
    sock.listen(128)
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(target: db.Target, host: str, port: int, settings: app.Settings) -> None:
    """Check the bind rule, open the database, print the address, serve until SIGINT/SIGTERM."""
    security.check_bind(host, settings.token)
    sock = bind(host, port)
    console = Console(target)
    try:
        console.open()
    except BaseException:
        sock.close()
        raise
    mode = "actions enabled" if settings.allow_actions else "read-only"
    auth = ", token required" if settings.token else ""
    print(f"flowlane ui: serving {url(sock)} ({mode}{auth}) on {db.redact(target.dsn)}", flush=True)
    config = uvicorn.Config(app.create_app(console, settings), log_level="warning", lifespan="on",
                            access_log=False)
    server = uvicorn.Server(config)
    stopping = threading.Event()
    Ticker(target.dsn, stopping, who="ui").start()  # the console fires schedules too
    try:
        server.run(sockets=[sock])
    finally:
        stopping.set()
