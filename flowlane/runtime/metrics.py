"""A worker's own Prometheus metrics: tasks started, completed and failed, handler
durations, stalled tasks recovered.

They live in prometheus_client's default registry of the worker process. Under `flowlane
serve --metrics-port`, serve gives its workers a ``PROMETHEUS_MULTIPROC_DIR`` and each
worker writes its values there, for serve's endpoint to add up (prometheus_client's
multiprocess mode); ``flowlane worker --metrics-port`` serves its own registry. The
database's view (queue depth, live workers, ...) is read at scrape time:
``flowlane.app.observability``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from flowlane.runtime.tasks import ClaimedTask, TaskResult

_STEP = ("flow", "step")
# handlers from a fraction of a millisecond to the longest default timeout and beyond
HANDLER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60, 300, 900)

TASKS_STARTED = Counter("flowlane_tasks_started", "Tasks claimed and handed to their handler", _STEP)
TASKS_COMPLETED = Counter("flowlane_tasks_completed", "Handler runs that returned an output", _STEP)
TASKS_FAILED = Counter("flowlane_tasks_failed",
                       "Handler runs that raised or returned what cannot be stored", _STEP)
HANDLER_SECONDS = Histogram("flowlane_handler_duration_seconds", "How long a handler ran", _STEP,
                            buckets=HANDLER_BUCKETS)
STALLS_RECOVERED = Counter("flowlane_stalled_tasks_recovered",
                           "Stalled tasks this worker's maintenance handed back to the queue")


@dataclass(frozen=True)
class _StepMetrics:
    """One step's children of the per-step metrics."""

    started: Counter
    completed: Counter
    failed: Counter
    seconds: Histogram


# labels() validates and joins its values and takes a lock on every call (12 % of a busy
# worker's loop when it ran three times per task); a child lives as long as its metric
_STEPS: dict[tuple[str, str], _StepMetrics] = {}


def _step(task: ClaimedTask) -> _StepMetrics:
    key = (task.flow_slug, task.step_slug)
    step = _STEPS.get(key)
    if step is None:
        step = _STEPS[key] = _StepMetrics(
            TASKS_STARTED.labels(*key), TASKS_COMPLETED.labels(*key), TASKS_FAILED.labels(*key),
            HANDLER_SECONDS.labels(*key),
        )
    return step


def task_started(task: ClaimedTask) -> None:
    _step(task).started.inc()


def task_finished(task: ClaimedTask, result: TaskResult) -> None:
    step = _step(task)
    (step.completed if result.ok else step.failed).inc()
    step.seconds.observe(result.seconds)


def stalls_recovered(count: int) -> None:
    STALLS_RECOVERED.inc(count)
