"""Run one worker in a process of its own from a :class:`WorkerConfig`: how ``flowlane
serve`` starts its workers (``python -m flowlane.runtime.launch JSON``, the JSON of
the flow paths and the settings that differ from the defaults; no command line to parse
again). The DSN travels in the environment (``FLOWLANE_DSN``), never in the arguments,
where any user of the machine could read it.

The exit status is the worker's, a :class:`flowlane.errors.WorkerExit` (0 after a stop,
1 an error, 2 bad options, 3 disabled, 4 restart with the current YAML). An error is
printed as ``error:`` and ``hint:`` lines, the last ``error:`` line being what
``flowlane serve`` shows beside the worker's status.

A worker started this way ends when ``serve`` ends, however ``serve`` ends: it asks the
kernel for SIGTERM at its parent's death (a graceful stop, in-flight handlers finished or
handed back), so that a killed ``serve`` leaves no orphan workers serving beside the next.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flowlane import errors
from flowlane.runtime.config import WorkerConfig

if TYPE_CHECKING:
    from flowlane.runtime.worker import Worker

SUPERVISOR_PID = "FLOWLANE_SUPERVISOR_PID"  # set by serve: the worker ends when that process does
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
PARENT_CHECK = 1.0  # seconds between looks at the parent where prctl is not available

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
    # what the process holds by now (modules, the project) lives as long as it does: frozen,
    # the collector's full passes, which a drain's tasks and futures set off, leave it out
    # (the collector took 12 % of a draining worker's CPU, 5 % with the freeze)
    gc.freeze()
    with beside(worker) if beside is not None else contextlib.nullcontext():
        worker.run()


def supervisor_environment() -> dict[str, str]:
    """What a supervisor adds to its workers' environment: its pid, which they outlive never."""
    return {SUPERVISOR_PID: str(os.getpid())}


def end_with_supervisor() -> bool:
    """Arrange that this worker gets SIGTERM (a graceful stop) when the supervisor that
    started it dies, however it dies (SIGKILL included); False when it is gone already.
    Linux: the kernel's parent-death signal; elsewhere a thread that watches the parent."""
    expected = os.environ.get(SUPERVISOR_PID)
    if not expected:
        return True
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    else:
        threading.Thread(target=_watch_parent, args=(int(expected),), daemon=True,
                         name="flowlane-supervisor-watch").start()
    return os.getppid() == int(expected)  # it may have died before the request took effect


def _watch_parent(expected: int) -> None:
    while os.getppid() == expected:
        time.sleep(PARENT_CHECK)
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str]) -> int:
    if not end_with_supervisor():
        return errors.WorkerExit.STOPPED
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
