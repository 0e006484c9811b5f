"""``flowlane serve`` (one supervised worker per queue) and ``flowlane demo``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from flowlane import defaults, errors, project_root
from flowlane.cli.common import add_dsn_argument, flow_paths
from flowlane.cli.worker_options import add_metrics_port, add_worker_options, worker_config


def configure(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run and supervise one worker per queue of the project",
        description="Start one worker per `kind: worker` document and per other queue the "
        "flows route to; restart a worker that exits, with backoff, except one that exits "
        f"with status {errors.WorkerExit.DISABLED} (deployment disabled or unsupported work; tried again "
        "when its deployment is enabled); a worker that exits with status "
        f"{errors.WorkerExit.RESTART} (definitions changed beyond its registry) is restarted at once. "
        "Follows the database: when definitions change (`flowlane apply`, `rollout`, "
        "`worker enable`), the workers are derived again from the project's YAML. A running "
        "worker is never stopped for code that cannot start (a flow not applied, a handler "
        "that does not import): serve says why and keeps it. serve never applies anything. "
        "On SIGTERM or SIGINT stop every worker gracefully; the workers also stop when serve dies "
        "however it dies. Refuses to start beside live workers of the same queues. "
        "Worker logs: .flowlane/logs/NAME.log.",
    )
    serve.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    add_dsn_argument(serve)
    serve.add_argument("--log-dir", metavar="DIR", help="worker logs (default: .flowlane/logs/)")
    serve.add_argument(
        "--reload", action=argparse.BooleanOptionalAction, default=None,
        help="restart the workers when a Python file or a flow file of the project changes, once "
        "the new code can start (default: on with the embedded development database, off with "
        "--dsn / FLOWLANE_DSN / DATABASE_URL)")
    serve.add_argument(
        "--beside-live-workers", action="store_true",
        help="start even though live workers already serve the project's queues (by default "
        "serve refuses, naming them: another serve is running, or workers started by hand)")
    add_worker_options(serve, every=" (passed to every worker)")
    add_metrics_port(serve, "the tasks and handler durations of every worker it runs")
    serve.set_defaults(func=cmd_serve)

    demo = subparsers.add_parser(
        "demo",
        help="end to end on the embedded database: compile flows/, migrate, apply, run workers",
    )
    demo.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    demo.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the runs")
    demo.set_defaults(func=cmd_demo)


def cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses
    import os
    from pathlib import Path

    from flowlane.app import fleet
    from flowlane.core import db
    from flowlane.runtime import serve

    if hasattr(args, "import_paths"):
        args.import_paths = [os.path.abspath(d) for d in args.import_paths]
    # what every worker gets, validated before any starts; the DSN goes in the environment
    options = dataclasses.replace(worker_config(args), dsn=None)
    plan = serve.Plan(tuple(flow_paths(args)), options)
    specs = plan.specs()
    if not specs:
        raise errors.UsageError("the project routes no step to any queue: nothing to serve",
                                hint="add a flow under flows/")
    target = db.resolve(args.dsn)
    if not args.beside_live_workers:
        fleet.refuse_doubling(sorted({spec.queue for spec in specs}), target.dsn)
    root = project_root.find_root()
    log_dir = Path(args.log_dir).resolve() if args.log_dir else root / project_root.STATE_DIRNAME / "logs"
    env = {**os.environ, "FLOWLANE_DSN": target.dsn, "PYTHONUNBUFFERED": "1"}
    print(f"serving {len(specs)} queue(s) on {db.redact(target.dsn)} ({target.source}); "
          f"worker logs in {project_root.relative(log_dir)}/; following definition changes; "
          "stop with Ctrl-C or SIGTERM", flush=True)
    if target.pooled:
        print(f"the DSN goes through a transaction-mode pooler (pooler=transaction), where LISTEN "
              f"cannot work: the workers poll for new work and serve polls for definition changes "
              f"every {serve.DEFINITIONS_POLL:g}s", flush=True)
    with _probe(args.metrics_port, target.dsn, env) as probe:
        return serve.serve(
            plan,
            dsn=target.dsn,
            env=env,
            cwd=root,
            log_dir=log_dir,
            shutdown_timeout=options.shutdown_timeout + defaults.SHUTDOWN_MARGIN,
            reload=target.embedded if args.reload is None else args.reload,
            watch=probe.watch if probe is not None else None,
        )


@contextlib.contextmanager
def _probe(port: int | None, dsn: str, env: dict[str, str]) -> Iterator[Any]:
    """With --metrics-port: the endpoint, and a directory where the workers write their
    metrics (prometheus_client's multiprocess mode), removed when serve stops."""
    if port is None:
        yield None
        return
    import tempfile

    from flowlane.app.observability import ServeProbe

    with tempfile.TemporaryDirectory(prefix="flowlane-metrics-") as directory:
        env["PROMETHEUS_MULTIPROC_DIR"] = directory
        probe = ServeProbe(port, dsn, directory)
        print(f"metrics, health and readiness on port {port}: /metrics /healthz /readyz", flush=True)
        try:
            yield probe
        finally:
            probe.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from flowlane.app.demo import run_demo

    return run_demo(flow_paths(args), timeout=args.timeout)
