"""Options that `flowlane worker` and `flowlane serve` share, and the WorkerConfig they give."""

from __future__ import annotations

import argparse
import dataclasses

from flowlane.runtime.config import LOG_FORMATS, LOG_LEVELS, WorkerConfig

DEFAULTS = WorkerConfig()  # for help texts only: the parsers pass what the user gave


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


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    """The options the user gave (the parsers leave the others out), validated."""
    return WorkerConfig.from_options(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(WorkerConfig)
           if hasattr(args, f.name)}
    )
