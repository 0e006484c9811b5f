"""``flowlane worker|start|runs|run|demo``: the runtime commands."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any

from flowlane import errors
from flowlane.cli.db import add_dsn_argument
from flowlane.cli.fleet import WORKER_ACTIONS, add_worker_admin_arguments, run_worker_admin


def configure(subparsers: Any) -> None:
    worker = subparsers.add_parser(
        "worker",
        help="run the handlers of one queue",
        description="Poll one queue and run its handlers: --flow F (one queue per flow), "
        "--flow F --step S (per-step queues), --queue Q (any routing), or --name D "
        "(the `kind: worker` document D). Deployments: `flowlane worker list`, "
        "`flowlane worker enable NAME`, `flowlane worker disable NAME --reason TEXT`. "
        "Exit status 3: the worker's deployment is disabled (do not restart it automatically).",
    )
    worker.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    selector = worker.add_argument_group("queue selection")
    selector.add_argument("--flow", help="flow slug or alias")
    selector.add_argument("--step", help="step slug (flows with per-step queues)")
    selector.add_argument("--queue", help="queue name")
    selector.add_argument(
        "--flows",
        help="with --queue: comma-separated flows/aliases to serve "
        "(default: the queue's `kind: worker` document, else every flow routed to it)",
    )
    add_dsn_argument(worker)
    worker.add_argument(
        "--name",
        help="deployment name (default: the worker document's name, else the queue); "
        "alone, it selects the `kind: worker` document of that name",
    )
    worker.add_argument(
        "--compile",
        action="store_true",
        help="development databases only: create flows missing from the database with the "
        "same SQL `flowlane apply` runs (never changes existing flows or aliases)",
    )
    worker.add_argument("--max-concurrent", type=int, help="handlers running at once (default 10)")
    worker.add_argument("--batch-size", type=int, help="messages read per poll (default 10)")
    worker.add_argument(
        "--no-notify",
        action="store_true",
        help="do not LISTEN for PGMQ insert notifications; poll with read_with_poll only",
    )
    worker.add_argument("--poll-interval", type=float, default=2.0, help="fallback poll, seconds")
    worker.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds to let in-flight handlers finish (default 30)",
    )
    worker.add_argument(
        "--requeue-interval",
        type=float,
        default=15.0,
        help="seconds between calls to requeue_stalled_tasks (default 15)",
    )
    worker.add_argument("--heartbeat-interval", type=float, default=5.0, help=argparse.SUPPRESS)
    worker.add_argument(
        "--import-path",
        action="append",
        default=[],
        metavar="DIR",
        help="extra directory to import handler modules from (repeatable; "
        "the current directory is always searched)",
    )
    levels = ["DEBUG", "INFO", "WARNING", "ERROR"]
    worker.add_argument("--log-level", default="INFO", choices=levels)
    worker.add_argument("--log-format", default="text", choices=["text", "json"])
    add_worker_admin_arguments(worker)
    worker.set_defaults(func=cmd_worker)

    start = subparsers.add_parser("start", help="start a run, print its id")
    start.add_argument("flow", metavar="FLOW_OR_ALIAS")
    start.add_argument("--input", default="{}", help="run input as JSON (default {})")
    start.add_argument("--run-id", help="use this run id (UUID) instead of a generated one")
    add_dsn_argument(start)
    _add_format(start)
    start.set_defaults(func=cmd_start)

    runs = subparsers.add_parser("runs", help="list recent runs")
    runs.add_argument("--flow", help="only runs of this concrete flow")
    runs.add_argument("--status", choices=["started", "completed", "failed"])
    runs.add_argument("--limit", type=int, default=20)
    add_dsn_argument(runs)
    _add_format(runs)
    runs.set_defaults(func=cmd_runs)

    run = subparsers.add_parser("run", help="show a run: status, step states, output")
    run.add_argument("run_id", metavar="RUN_ID")
    add_dsn_argument(run)
    _add_format(run)
    run.set_defaults(func=cmd_run)

    demo = subparsers.add_parser(
        "demo",
        help="end to end on the embedded database: compile flows/, migrate, apply, run workers",
    )
    demo.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    demo.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the runs")
    demo.set_defaults(func=cmd_demo)


def _add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=["text", "json"], default="text")


def _json_errors(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """With ``--format json``, an error is also printed to stdout as one JSON object
    (``{"error": ..., "hint": ...}``), so that a caller parsing stdout always gets JSON;
    the ``error:`` line on stderr and the exit code stay as for text."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except errors.FlowlaneError as exc:
            if args.format == "json":
                print(json.dumps({"error": str(exc), "hint": exc.hint}))
            raise

    return run


def _paths(args: argparse.Namespace) -> list[str]:
    return list(args.paths) or ["flows"]


def cmd_worker(args: argparse.Namespace) -> int:
    from flowlane.compiler.model import Project
    from flowlane.runtime import log
    from flowlane.runtime.worker import Worker

    if args.paths and args.paths[0] in WORKER_ACTIONS:
        return run_worker_admin(args)
    log.configure(args.log_level, args.log_format)
    worker = Worker(
        Project.load(*_paths(args)),
        queue=args.queue,
        flow=args.flow,
        step=args.step,
        flows=[f.strip() for f in args.flows.split(",") if f.strip()] if args.flows else None,
        dsn=args.dsn,
        name=args.name,
        max_concurrent=args.max_concurrent,
        batch_size=args.batch_size,
        notify=not args.no_notify,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        requeue_interval=args.requeue_interval,
        heartbeat_interval=args.heartbeat_interval,
        import_paths=args.import_path,
        compile=args.compile,
    )
    worker.run()
    return 0


@_json_errors
def cmd_start(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    try:
        payload = json.loads(args.input)
    except json.JSONDecodeError as exc:
        raise errors.UsageError(
            f"--input is not valid JSON: {exc}",
            hint="""quote a JSON document for the shell, e.g. --input '{"name": "Ada"}'""",
        ) from exc
    with Client(args.dsn) as client:
        run_id, flow_slug = client.start(args.flow, payload, run_id=args.run_id)
    if args.format == "json":
        print(json.dumps({"run_id": run_id, "flow": args.flow, "flow_slug": flow_slug}))
    else:
        print(run_id)
    return 0


@_json_errors
def cmd_runs(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client

    with Client(args.dsn) as client:
        runs = client.list_runs(limit=args.limit, flow=args.flow, status=args.status)
    if args.format == "json":
        print(json.dumps([r.as_dict() for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs")
        return 0
    print(f"{'RUN ID':<36}  {'FLOW':<28}  {'STATUS':<9}  STARTED")
    for r in runs:
        print(f"{r.run_id:<36}  {r.flow_slug:<28}  {r.status:<9}  {r.started_at:%Y-%m-%d %H:%M:%S}")
    return 0


@_json_errors
def cmd_run(args: argparse.Namespace) -> int:
    from flowlane.runtime.client import Client
    from flowlane.runtime.report import render_run

    with Client(args.dsn) as client:
        state = client.get_run(args.run_id)
    if args.format == "json":
        print(json.dumps(state, indent=2, default=str))
    else:
        print(render_run(state))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from flowlane.runtime.demo import run_demo

    return run_demo(_paths(args), timeout=args.timeout)
