"""``flowlane worker``: run the handlers of one queue (and the deployment actions
``worker list|enable|disable``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flowlane import defaults, errors
from flowlane.cli.common import add_dsn_argument, flow_paths
from flowlane.cli.worker_options import DEFAULTS, add_metrics_port, add_worker_options, worker_config
from flowlane.runtime.config import WHEN_DISABLED

WORKER_ACTIONS = ("enable", "disable", "list")


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


def _flow_list(text: str) -> tuple[str, ...] | None:
    """``--flows a,b``: the names; blank means not given."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return names or None


def add_worker_admin_arguments(worker: argparse.ArgumentParser) -> None:
    admin = worker.add_argument_group(
        "deployments: `flowlane worker list`, `flowlane worker enable NAME`, "
        "`flowlane worker disable NAME --reason TEXT`"
    )
    admin.add_argument("--reason", help="with `worker disable`: why (shown to operators)")
    admin.add_argument("--format", choices=["text", "json"], default="text",
                       help="with `worker list`: output format")


def run_worker_admin(args: argparse.Namespace) -> int:
    """``flowlane worker ACTION ...``: the first positional is the action."""
    action, *rest = args.paths
    from flowlane.app import fleet

    if action == "list":
        if rest:
            raise errors.UsageError(f"`worker list` takes no names, got {' '.join(rest)}")
        _print_fleet(fleet.fleet(args.dsn), args.format)
        return 0
    if len(rest) != 1:
        raise errors.UsageError(f"`worker {action}` takes one deployment name",
                                hint=f"flowlane worker {action} NAME (see `flowlane worker list`)")
    row = fleet.set_enabled(rest[0], action == "enable", args.reason, args.dsn)
    state = "enabled" if row["enabled"] else f"disabled ({row['reason'] or 'no reason given'})"
    print(f"worker deployment {row['deployment_name']} (queue {row['queue_name']}): {state}")
    return 0


def _print_fleet(found: Any, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps({"deployments": found.deployments, "draining": found.draining},
                         indent=2, default=str))
        return
    if not found.deployments:
        print("no worker deployments yet (one is recorded when its first worker starts)")
    for d in found.deployments:
        state = "enabled" if d["enabled"] else f"DISABLED: {d['reason'] or 'no reason given'}"
        live = sum(1 for w in d["workers"] if w["live"])
        stale = len(d["workers"]) - live
        print(f"{d['deployment_name']}  queue {d['queue_name']}  {state}  "
              f"{live} live worker(s)" + (f", {stale} stale" if stale else ""))
        for w in d["workers"]:
            pairs = ", ".join(f"{f}.{s}" for f, s in w["pairs"])
            flag = ("" if w["live"] else "  STALE (its started tasks wait for stalled recovery)") \
                + ("  deprecated" if w["deprecated"] else "")
            print(f"  worker {w['worker_id']}  heartbeat {w['heartbeat_age']}s ago{flag}  "
                  f"serves {pairs}")
    for v in found.draining:
        state = ("drained" if v["drained"] else
                 f"draining: {v['started_runs']} started run(s), {v['active_tasks']} task(s)")
        print(f"alias {v['alias']}: version {v['flow_slug']} {state}")


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
