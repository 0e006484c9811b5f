"""Every default of a flow and of a worker, defined once.

The compiler's model and analysis, the JSON Schema's ``default`` values and the
descriptions that quote them, ``WorkerConfig`` and docs/runtime.md take their numbers
from here (tests/test_defaults.py holds the copies in text equal); the SQL Core's
``create_flow`` fills the same flow defaults when called without them. A worker gets the same
limits whichever way it starts: a ``kind: worker`` document that leaves them out,
``flowlane worker`` without the flags, ``flowlane serve``, ``Worker(...)`` in Python.
"""

from __future__ import annotations

from typing import Final

# -- flow options: a step without its own takes its flow's -----------------------
MAX_ATTEMPTS: Final = 3  # attempts in all, the first included
BASE_DELAY: Final = 5  # seconds; the retry delay is floor(base_delay * 2^attempts)
TIMEOUT: Final = 60  # seconds a task may run before it counts as stalled (+ 30 s grace)

FLOW: Final = {"max_attempts": MAX_ATTEMPTS, "base_delay": BASE_DELAY, "timeout": TIMEOUT}
# seconds a finished run is kept before pruning deletes it (`retention: forever`: None);
# compiled SQL states a flow's retention only when it differs, so files written before the
# option existed compile to the same bytes
RETENTION: Final = 30 * 24 * 3600

# -- worker limits ----------------------------------------------------------------
# chosen with benchmarks/worker_throughput.py (docs/benchmarks.md): 10/10 left the database
# idle between small claims; twice as many slots as the batch keep two claims in flight, so
# one overlaps the other's result commit; batches of 100 rather than 50 mean fewer, larger
# transactions, which four workers sharing two cores need to drain as fast as one; 300
# slots slowed one worker (its reads skip more leased messages)
MAX_CONCURRENT: Final = 200  # handlers running at once
BATCH_SIZE: Final = 100  # messages claimed per poll
# while handlers run, a worker reads again only once this share of a batch of slots is
# free: claims stay worth a round trip, and the next one starts before the previous
# batch's results have all committed (half a batch left one worker idle between claims)
CLAIM_SHARE: Final = 4  # a quarter


def claim_threshold(max_concurrent: int, batch_size: int) -> int:
    """Free handler slots a busy worker waits for before it claims again (at least 1)."""
    return max(1, min(batch_size, max_concurrent) // CLAIM_SHARE)


WORKER_LIMITS: Final = {"max_concurrent": MAX_CONCURRENT, "batch_size": BATCH_SIZE}

# -- worker timing ----------------------------------------------------------------
POLL_INTERVAL: Final = 2.0  # seconds between polls when no notification wakes the worker
READ_VT: Final = 5  # seconds a message read without notifications stays invisible
# ms a worker about to wait for a notification waits at most (for each inserter lock) for the
# queue's inserting transactions to end (a notification of one of them may have been left to
# another's); while a wait times out (a long transaction inserts), the worker claims again
AWAIT_INSERTS_MS: Final = 50
READ_POLL_MS: Final = 100  # ms between a read_with_poll's checks, without notifications
SHUTDOWN_TIMEOUT: Final = 30.0  # seconds in-flight handlers get after SIGTERM
# seconds a supervisor (serve, systemd, Kubernetes) waits beyond shutdown_timeout before it
# kills a stopping worker: the time to commit the last results and mark the worker stopped
SHUTDOWN_MARGIN: Final = 10.0
HEARTBEAT_INTERVAL: Final = 5.0  # seconds
# seconds without a heartbeat after which a worker counts as gone (its started tasks wait
# for stalled recovery): the SQL Core's flowlane.worker_stale_after() decides, everywhere;
# this names the same number for messages (a test holds them equal)
STALE_AFTER: Final = 30.0
REQUEUE_INTERVAL: Final = 15.0  # seconds between stalled-task recoveries
# seconds between maintenance ticks (schedules fire, delayed runs begin, overdue runs fail):
# a schedule's run or a delayed start is late by at most this much while any worker, `serve`
# or `flowlane ui` runs
TICK_INTERVAL: Final = 1.0
