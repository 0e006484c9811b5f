"""Run one worker in a process of its own from a :class:`WorkerConfig`: how ``flowlane
serve`` starts its workers (``python -m flowlane.runtime.launch JSON``, the JSON of
the flow paths and the settings that differ from the defaults; no command line to parse
again). The DSN travels in the environment (``FLOWLANE_DSN``), never in the arguments,
where any user of the machine could read it.

The exit status is the worker's, a :class:`flowlane.errors.WorkerExit` (0 after a stop,
1 an error, 2 bad options, 3 disabled, 4 restart with the current YAML). An error is
printed as ``error:`` and ``hint:`` lines, the last ``error:`` line being what
``flowlane serve`` shows beside the worker's status.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flowlane import errors
from flowlane.runtime.config import WorkerConfig

if TYPE_CHECKING:
    from flowlane.runtime.worker import Worker

# what runs beside a worker while it serves (an HTTP endpoint for metrics and probes)
Beside = Callable[["Worker"], contextlib.AbstractContextManager[object]]


def worker_command(paths: Sequence[str], config: WorkerConfig) -> list[str]:
    """The command that runs a worker with ``config`` over the flows under ``paths``."""
    if config.dsn:
        raise ValueError("a launched worker takes its DSN from the environment (FLOWLANE_DSN)")
    spec = {"paths": [os.path.abspath(p) for p in paths], "config": config.changed()}
    return [sys.executable, "-m", "flowlane.runtime.launch", json.dumps(spec)]


def run_worker(paths: Sequence[str], config: WorkerConfig, beside: Beside | None = None) -> None:
    """Configure the logs, load the project, serve until stopped (errors raise)."""
    from flowlane.compiler.api import load_project
    from flowlane.runtime import log
    from flowlane.runtime.worker import Worker

    log.configure(config.log_level, config.log_format)
    worker = Worker(load_project(list(paths)), config)
    with beside(worker) if beside is not None else contextlib.nullcontext():
        worker.run()


def main(argv: Sequence[str]) -> int:
    try:
        spec = json.loads(argv[0])
        config = WorkerConfig.from_options(**spec["config"])
        run_worker(spec["paths"], config)
    except errors.FlowlaneError as exc:
        print(exc.lines(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return errors.WorkerExit.STOPPED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
