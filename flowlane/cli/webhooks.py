"""``flowlane webhooks``: the project's webhooks with what they started, and ``flowlane
webhooks serve``: their endpoint for a project without a web application to mount it in."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from flowlane import errors, extras
from flowlane.cli.common import add_dsn_argument, add_format, json_errors

if TYPE_CHECKING:
    from flowlane.runtime.client import WebhookActivity


def configure(subparsers: Any) -> None:
    webhooks = subparsers.add_parser(
        "webhooks",
        help="list the webhooks and what they started, or serve their endpoint",
        description="`flowlane webhooks`: every webhook (`kind: webhook` in the project's YAML) "
        "with its scheme, its flow or signalled step, the runs it started and the signals it sent "
        "(in all and in the last day). `flowlane webhooks serve`: serve `POST /<name>` for each "
        "webhook, with each secret read from the environment variable its `secret_env` names.",
    )
    webhooks.add_argument("action", nargs="?", choices=["list", "serve"], default="list")
    webhooks.add_argument("--host", default="127.0.0.1",
                          help="with serve: address to bind (default 127.0.0.1)")
    webhooks.add_argument("--port", type=int, default=8766,
                          help="with serve: port (default 8766; 0 picks a free one)")
    add_dsn_argument(webhooks)
    add_format(webhooks)
    webhooks.set_defaults(func=cmd_webhooks)


@json_errors
def cmd_webhooks(args: argparse.Namespace) -> int:
    from flowlane.compiler import api

    if args.action == "serve":
        return _serve(args)
    from flowlane.runtime.client import Client

    project = api.load_project()

    with Client(args.dsn) as client:
        activity = client.webhook_activity()
    found = [_row(w, activity.get(w.name)) for w in project.webhooks]
    if args.format == "json":
        print(json.dumps(found, indent=2, default=str))
        return 0
    if not found:
        print("no webhooks (declare `kind: webhook` documents in the project's YAML)")
        return 0
    print(f"{'NAME':<24}  {'SCHEME':<8}  {'STARTS':<32}  {'RUNS':>6}  {'SIGNALS':>7}  {'LAST DAY':>8}  LAST")
    for row in found:
        last = row["last_at"].strftime("%Y-%m-%d %H:%M:%S") if row["last_at"] else "never"
        print(f"{row['name']:<24}  {row['scheme']:<8}  {row['starts']:<32}  {row['runs']:>6}  "
              f"{row['signals']:>7}  {row['runs_last_day'] + row['signals_last_day']:>8}  {last}")
    return 0


def _row(webhook: Any, activity: WebhookActivity | None) -> dict[str, Any]:
    starts = (f"signal {webhook.flow}.{webhook.signal_step}" if webhook.signal_step
              else f"run {webhook.flow}")
    from flowlane.runtime.client import WebhookActivity

    done = activity or WebhookActivity(webhook.name, 0, 0, 0, 0, None)
    return {"name": webhook.name, "scheme": webhook.scheme, "secret_env": webhook.secret_env,
            "starts": starts, "runs": done.runs, "runs_last_day": done.runs_last_day,
            "signals": done.signals, "signals_last_day": done.signals_last_day, "last_at": done.last_at}


def _serve(args: argparse.Namespace) -> int:
    from flowlane.compiler import api
    from flowlane.core import db

    with extras.needs("webhooks", "flowlane webhooks serve"):
        import standardwebhooks  # noqa: F401  (scheme: standard needs it: said before anything starts)
        import uvicorn

        from flowlane.ui import server, webhooks

    if not 0 <= args.port <= 65535:
        raise errors.UsageError(f"--port must be between 0 and 65535, not {args.port}")
    project = api.load_project()
    target = db.resolve(args.dsn)
    application = webhooks.app(project, dsn=target.dsn)
    sock = server.bind(args.host, args.port)
    names = ", ".join(f"/{w.name}" for w in project.webhooks) or "none declared"
    print(f"flowlane webhooks: serving {server.url(sock)} ({names}) on {db.redact(target.dsn)}", flush=True)
    config = uvicorn.Config(application, log_level="warning", lifespan="off", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0
