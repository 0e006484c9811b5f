"""``flowlane worker``: run the handlers of one queue (and the deployment actions
``worker list|enable|disable``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from flowlane import defaults, errors
from flowlane.cli.common import add_dsn_argument, flow_paths
from flowlane.cli.fleet import WORKER_ACTIONS, add_worker_admin_arguments, run_worker_admin
from flowlane.runtime.config import LOG_FORMATS, LOG_LEVELS, WHEN_DISABLED, WorkerConfig

DEFAULTS = WorkerConfig()  # for help texts only: the parsers pass what the user gave


def configure(subparsers: Any) -> None:
    worker = subparsers.add_parser(
        "worker",
        help="run the handlers of one queue",
        description="Poll one queue and run its handlers: --flow F (one queue per flow), "
        "--flow F --step S (per-step queues), --queue Q (any routing), or --name D "
        "(the `kind: worker` document D). Deployments: `flowlane worker list`, "
        "`flowlane worker enable NAME`, `flowlane worker disable NAME --reason TEXT`. "
        "Exit statuses: 0 stopped on request, 1 failed, 2 bad arguments, 3 deployment disabled "
        "(do not restart), 4 stopped for new definitions (restart at once).",
    )
    worker.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    # every worker option defaults to "not given" (SUPPRESS): WorkerConfig holds the defaults
    given = argparse.SUPPRESS
    selector = worker.add_argument_group("queue selection")
    selector.add_argument("--flow", default=given, help="flow slug or alias")
    selector.add_argument("--step", default=given, help="step slug (flows with per-step queues)")
    selector.add_argument("--queue", default=given, help="queue name")
    selector.add_argument(
        "--flows",
        default=given,
        type=_flow_list,
        help="with --queue: comma-separated flows/aliases to serve "
        "(default: the queue's `kind: worker` document, else every flow routed to it)",
    )
    add_dsn_argument(worker)
    worker.add_argument(
        "--name",
        default=given,
        help="deployment name (default: the worker document's name, else the queue); "
        "alone, it selects the `kind: worker` document of that name",
    )
    worker.add_argument(
        "--compile",
        action="store_true",
        default=given,
        help="development databases only: create flows missing from the database with the "
        "same SQL `flowlane apply` runs (never changes existing flows or aliases)",
    )
    worker.add_argument(
        "--max-concurrent",
        type=int,
        default=given,
        help="handlers running at once (default: the worker document's max_concurrent, "
        f"else {defaults.MAX_CONCURRENT})",
    )
    worker.add_argument(
        "--batch-size",
        type=int,
        default=given,
        help="messages claimed per poll (default: the worker document's batch_size, "
        f"else {defaults.BATCH_SIZE})",
    )
    add_worker_options(worker)
    add_metrics_port(worker, "this worker's tasks and handler durations")
    worker.add_argument(
        "--poll-interval",
        type=float,
        default=given,
        help=f"fallback poll, seconds (default {DEFAULTS.poll_interval:g})",
    )
    worker.add_argument(
        "--requeue-interval",
        type=float,
        default=given,
        help="seconds between calls to requeue_stalled_tasks "
        f"(default {DEFAULTS.requeue_interval:g})",
    )
    worker.add_argument(
        "--when-disabled",
        default=given,
        choices=WHEN_DISABLED,
        help="while the deployment is disabled: exit with status 3 (for supervisors told not to "
        "restart it: serve, systemd's RestartPreventExitStatus) or wait, claiming nothing, "
        "until it is enabled and then exit 4 (for supervisors that restart every exit: "
        "Kubernetes; and systemd, so that a rollout's restart waits for its end) "
        "(default exit)",
    )
    worker.add_argument("--heartbeat-interval", type=float, default=given, help=argparse.SUPPRESS)
    add_worker_admin_arguments(worker)
    worker.set_defaults(func=cmd_worker)


def add_metrics_port(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--metrics-port", type=_port, metavar="PORT",
        help=f"serve /metrics (Prometheus: {what} and the database's queue gauges), /healthz "
        "and /readyz on this TCP port (all interfaces); default: none")


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return int(text)


def add_worker_options(parser: argparse.ArgumentParser, every: str = "") -> None:
    """The options `flowlane serve` hands to every worker, on both commands; not given, a
    worker takes WorkerConfig's defaults."""
    parser.add_argument(
        "--no-notify",
        dest="notify",
        action="store_false",
        default=argparse.SUPPRESS,
        help="do not LISTEN for PGMQ insert notifications; poll with read_with_poll only "
        f"(implied by a DSN with pooler=transaction){every}",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=argparse.SUPPRESS,
        help="on SIGTERM/SIGINT, seconds to let in-flight handlers finish "
        f"(default {DEFAULTS.shutdown_timeout:g}){every}",
    )
    parser.add_argument(
        "--import-path",
        dest="import_paths",
        action="append",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help="extra directory to import handler modules from (repeatable; "
        f"the current directory is always searched){every}",
    )
    parser.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)} (default {DEFAULTS.log_level}){every}",
    )
    parser.add_argument(
        "--log-format",
        default=argparse.SUPPRESS,
        metavar="FORMAT",
        help=f"{' or '.join(LOG_FORMATS)} (default {DEFAULTS.log_format}){every}",
    )


def _flow_list(text: str) -> tuple[str, ...] | None:
    """``--flows a,b``: the names; blank means not given."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return names or None


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    """The options the user gave (the parsers leave the others out), validated."""
    return WorkerConfig.from_options(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(WorkerConfig)
           if hasattr(args, f.name)}
    )


def cmd_worker(args: argparse.Namespace) -> int:
    from flowlane.runtime.launch import run_worker

    if args.paths and args.paths[0] in WORKER_ACTIONS:
        return run_worker_admin(args)
    _refuse_misspelled_action(args.paths)
    config = worker_config(args)  # bad options fail here, before the project or a database
    beside = None
    if args.metrics_port is not None:
        from flowlane.app.observability import beside_worker

        beside = beside_worker(args.metrics_port, config.dsn)
    run_worker(flow_paths(args), config, beside)
    return 0


def _refuse_misspelled_action(paths: list[str]) -> None:
    """``worker lst``: a path that does not exist but reads like an action."""
    import difflib
    import os

    if paths and not os.path.exists(paths[0]):
        close = difflib.get_close_matches(paths[0], WORKER_ACTIONS, n=1, cutoff=0.5)
        if close:
            raise errors.UsageError(
                f"no such flow path or worker action: {paths[0]}",
                hint=f"did you mean `flowlane worker {close[0]}`?")
