"""``flowlane manifests kubernetes``: deployment manifests for the project's workers."""

from __future__ import annotations

import argparse
from typing import Any

from flowlane import defaults
from flowlane.cli.common import flow_paths

DEFAULT_OUTPUT = "-"


def configure(subparsers: Any) -> None:
    from flowlane.app.manifests import METRICS_PORT, KubernetesOptions

    given = KubernetesOptions()
    parser = subparsers.add_parser(
        "manifests", help="deployment manifests for the project's workers (Kubernetes)")
    kinds = parser.add_subparsers(dest="manifests_command", metavar="KIND")
    kinds.required = True
    kube = kinds.add_parser(
        "kubernetes",
        help="a Deployment and a KEDA ScaledObject per worker deployment unit",
        description="One Deployment per worker deployment unit (each `kind: worker` document, "
        "then each other queue the flows route to: what `flowlane serve` runs), with probes on "
        "/healthz and /readyz of the metrics port and a grace period that covers "
        "--shutdown-timeout; and one KEDA ScaledObject per Deployment that scales it on its "
        "queue's depth (KEDA's postgresql scaler reading flowlane.queue_depth). The image "
        "holds the project (examples/Dockerfile); the DSN comes from a Secret.",
    )
    kube.add_argument("paths", nargs="*", metavar="PATHS", help="flow YAML (default: flows/)")
    kube.add_argument("--out", metavar="DIR", default=DEFAULT_OUTPUT,
                      help="write one file per deployment unit into DIR (default: print all)")
    kube.add_argument("--image", default=given.image,
                      help=f"the workers' container image (default {given.image})")
    kube.add_argument("--namespace", help="metadata.namespace of every object (default: none)")
    kube.add_argument("--secret", default=given.secret,
                      help=f"the Secret whose key `dsn` holds the DSN (default {given.secret})")
    kube.add_argument("--metrics-port", type=int, default=METRICS_PORT,
                      help=f"the workers' --metrics-port, probed (default {METRICS_PORT})")
    kube.add_argument("--shutdown-timeout", type=float, default=defaults.SHUTDOWN_TIMEOUT,
                      help="the workers' --shutdown-timeout; the grace period adds "
                      f"{defaults.SHUTDOWN_MARGIN:g} s (default {defaults.SHUTDOWN_TIMEOUT:g})")
    kube.add_argument("--min-replicas", type=int, default=given.min_replicas,
                      help=f"per Deployment (default {given.min_replicas}; 0 scales to zero)")
    kube.add_argument("--max-replicas", type=int, default=given.max_replicas,
                      help=f"per Deployment (default {given.max_replicas})")
    for option, what in (("cpu_request", "CPU request"), ("memory_request", "memory request"),
                         ("cpu_limit", "CPU limit"), ("memory_limit", "memory limit")):
        default = getattr(given, option)
        kube.add_argument(f"--{option.replace('_', '-')}", default=default, metavar="QUANTITY",
                          type=_quantity,
                          help=f"each worker container's {what}, `none` for none "
                          f"(default {default if default is not None else 'none'})")
    kube.set_defaults(func=cmd_kubernetes)


def _quantity(text: str) -> str | None:
    return None if text.strip().lower() == "none" else text.strip()


def cmd_kubernetes(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from flowlane.app import manifests
    from flowlane.compiler.api import load_project

    options = manifests.KubernetesOptions(
        image=args.image, namespace=args.namespace, secret=args.secret,
        metrics_port=args.metrics_port, shutdown_timeout=args.shutdown_timeout,
        min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        cpu_request=args.cpu_request, memory_request=args.memory_request,
        cpu_limit=args.cpu_limit, memory_limit=args.memory_limit)
    made = manifests.kubernetes(load_project(flow_paths(args)), options)
    if args.out == DEFAULT_OUTPUT:
        sys.stdout.write(manifests.render(made))
        return 0
    for path in manifests.write(made, Path(args.out)):
        print(f"wrote {path}")
    return 0
