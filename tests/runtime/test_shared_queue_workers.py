"""Shared queues in production, with real worker processes.

Older checkouts are simulated with a copy of the test project that lacks the
newer flows: its workers serve fewer (flow, step) pairs than the database
routes to their queue.
"""

from __future__ import annotations

import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowlane.compiler import load_project
from flowlane.core.definitions import create_flows
from flowlane.errors import NOT_RESTARTED, WorkerExit
from tests.core.engine import Engine
from tests.runtime import rt_support
from tests.runtime.rt_support import PROJECT, WorkerProcess, flowlane, start_run, tasks, wait_run, wait_until

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]

SHARED_B_ONLY = """\
kind: flow
slug: rt_shared_b
queues:
  only: rt_jobs
defaults:
  base_delay: 0
  timeout: 5
steps:
  only:
    handler: rt_handlers:first
---
kind: worker
name: rt_jobs_worker
queue: rt_jobs
flows: [rt_shared_b]
"""


def _checkout(root: Path, **files: str) -> Path:
    """A project directory with the test handlers and the given flow files."""
    (root / "flows").mkdir(parents=True)
    shutil.copy(PROJECT / "rt_handlers.py", root / "rt_handlers.py")
    for name, text in files.items():
        (root / "flows" / f"{name}.yaml").write_text(text)
    return root


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``workers(dsn, *args, cwd=...)``: worker processes on any database, stopped afterwards."""
    started: list[WorkerProcess] = []

    def make(dsn: str, *args: str, cwd: Path = PROJECT, ready: bool = True) -> WorkerProcess:
        worker = WorkerProcess(dsn, tmp_path, *args, cwd=cwd)
        started.append(worker)
        return worker.wait_ready() if ready else worker

    yield make
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.send_signal(signal.SIGCONT)
        worker.stop()


def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def _messages(dsn: str, queue: str) -> list[tuple[Any, ...]]:
    """(msg_id, visible now) of the messages on a queue."""
    return _rows(dsn, f"select msg_id, vt <= clock_timestamp() from pgmq.q_{queue} order by msg_id")


def _deployment(dsn: str, name: str) -> tuple[Any, ...]:
    [row] = _rows(dsn, "select enabled, reason from flowlane.worker_deployments "
                       "where deployment_name = %s", name)
    return row


def definitions(dsn: str) -> dict[str, list[Any]]:
    """Every definition row, without timestamps: flows, steps, deps, queues, aliases."""
    tables = {
        "flows": "select to_jsonb(f) - 'created_at' - 'shape_sealed_at' from flowlane.flows f",
        "steps": "select to_jsonb(s) - 'created_at' from flowlane.steps s",
        "deps": "select to_jsonb(d) - 'created_at' from flowlane.deps d",
        "queues": "select to_jsonb(q) - 'created_at' from flowlane.queues q",
        "aliases": "select to_jsonb(a) - 'updated_at' from flowlane.aliases a",
        "alias_history": "select to_jsonb(h) - 'changed_at' from flowlane.alias_history h",
    }
    return {name: sorted(str(r[0]) for r in _rows(dsn, sql)) for name, sql in tables.items()}


# -- unsupported work -------------------------------------------------------------


def test_a_new_route_to_its_queue_stops_the_worker_for_a_restart_and_disables_nothing(
    dsn: str, tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    old = _checkout(tmp_path / "old", shared=SHARED_B_ONLY)
    rt_support.apply_flows(dsn, old)
    stale = workers(dsn, "--name", "rt_jobs_worker", "--batch-size", "10", cwd=old)
    stale.signal(signal.SIGSTOP)  # both messages wait while the definitions change
    try:
        rt_support.apply_flows(dsn)  # a newer checkout routes rt_shared_a.one to rt_jobs too
        supported = start_run(dsn, "rt_shared_b", {"value": 1})
        newcomer = start_run(dsn, "rt_shared_a", {"value": 2})
    finally:
        stale.signal(signal.SIGCONT)
    # notified (or meeting the new pair in a claim), the worker stops: exit status 4,
    # "restart me with the current registry", not 3
    assert stale.wait(60) == 4
    log = stale.text()
    assert "definitions_changed" in log and "rt_shared_a.one" in log
    assert "unsupported_work" not in log and '"value"' not in log
    # nothing claimed, no attempt consumed, every message visible
    assert _rows(dsn, "select step_slug, status, attempts_count from flowlane.step_tasks "
                      "where run_id in (%s, %s) order by step_slug", supported, newcomer) == [
        ("one", "queued", 0), ("only", "queued", 0)]
    assert [visible for _, visible in _messages(dsn, "rt_jobs")] == [True, True]
    assert _deployment(dsn, "rt_jobs_worker") == (True, None)

    # restarted with the old registry, it refuses to start (and says why); with the
    # current one it serves both
    again = workers(dsn, "--name", "rt_jobs_worker", cwd=old, ready=False)
    assert again.wait(60) == 1
    assert "does not serve every (flow, step) routed to queue rt_jobs" in again.text()
    fixed = [workers(dsn, "--name", "rt_jobs_worker"), workers(dsn, "--name", "rt_side_worker")]
    for run_id in (supported, newcomer):
        assert wait_run(dsn, run_id, workers=fixed)["run"]["status"] == "completed"


def test_a_foreign_message_hands_the_batch_back_and_disables_the_deployment(
    dsn: str, tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    rt_support.apply_flows(dsn)
    worker = workers(dsn, "--name", "rt_jobs_worker", "--batch-size", "10")
    worker.signal(signal.SIGSTOP)  # both messages must be waiting when it reads next
    try:
        supported = start_run(dsn, "rt_shared_b", {"value": 1})
        [(foreign,)] = _rows(dsn, """select pgmq.send('rt_jobs', '{"value": 3}')""")
    finally:
        worker.signal(signal.SIGCONT)
    assert worker.wait(60) == 3
    log = worker.text()
    assert "unsupported_work" in log and 'pairs="(no flowlane task)"' in log
    assert 'action="disable deployment and stop"' in log and f"unsupported={foreign}" in log
    assert '"value"' not in log  # identities only, never message bodies
    assert _rows(dsn, "select status, attempts_count from flowlane.step_tasks "
                      "where run_id = %s", supported) == [("queued", 0)]
    assert [visible for _, visible in _messages(dsn, "rt_jobs")] == [True, True]
    enabled, reason = _deployment(dsn, "rt_jobs_worker")
    assert not enabled and "(no flowlane task)" in reason

    # a supervisor's restart is refused until an operator enables the deployment
    again = workers(dsn, "--name", "rt_jobs_worker", ready=False)
    assert again.wait(60) == 3
    assert "worker deployment rt_jobs_worker is disabled" in again.text()
    assert "flowlane worker enable rt_jobs_worker" in again.text()
    listed = flowlane("worker", "list", "--dsn", dsn)
    assert "rt_jobs_worker  queue rt_jobs  DISABLED: unsupported work" in listed.stdout

    _rows(dsn, "select pgmq.archive('rt_jobs', %s::bigint)", foreign)  # the operator's fix
    enable = flowlane("worker", "enable", "rt_jobs_worker", "--dsn", dsn)
    assert enable.returncode == 0 and "enabled" in enable.stdout
    fixed = [workers(dsn, "--name", "rt_jobs_worker"), workers(dsn, "--name", "rt_side_worker")]
    assert wait_run(dsn, supported, workers=fixed)["run"]["status"] == "completed"


def test_visible_started_task_costs_no_attempt_and_the_worker_keeps_serving(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    worker = spawn("--flow", "rt_slow", "--poll-interval", "0.2")
    run_id = start_run(flows_dsn, "rt_slow", {"dir": str(tmp_path)})
    wait_until(lambda: (tmp_path / f"started-{run_id}-1").exists(), message="hold to start")
    # the handler runs past its timeout (backdated: its lease is no longer extended) and
    # its message becomes visible again while it still runs
    rt_support.backdate_started(flows_dsn, run_id, "hold", seconds=10)
    with psycopg.connect(flows_dsn, autocommit=True) as conn:
        conn.execute("update flowlane.step_tasks set lease_renewed_at = null where run_id = %s",
                     (run_id,))
    _rows(flows_dsn, "select pgmq.set_vt('rt_slow', msg_id, 0) from pgmq.q_rt_slow")

    def hidden_again() -> float | None:
        [(reads, off_by)] = _rows(
            flows_dsn, "select m.read_ct, extract(epoch from m.vt - (t.started_at + interval '35 s')) "
                       "from pgmq.q_rt_slow m join flowlane.step_tasks t "
                       "on t.queue_name = 'rt_slow' and t.message_id = m.msg_id")
        return float(abs(off_by)) + 0.001 if reads >= 2 and abs(off_by) < 2 else None

    # read again by the worker and hidden until the stall deadline (claim + 5 s + 30 s),
    # not re-read in a loop
    wait_until(hidden_again, message="the worker to read the message and hide it again")
    assert _rows(flows_dsn, "select attempts_count from flowlane.step_tasks "
                            "where run_id = %s", run_id) == [(1,)]
    (tmp_path / "release").touch()
    state = wait_run(flows_dsn, run_id, workers=[worker])
    assert state["run"]["status"] == "completed"
    assert [t["attempts_count"] for t in tasks(state, "hold")] == [1]
    assert worker.proc.poll() is None and "unsupported_work" not in worker.text()


# -- coverage at startup -----------------------------------------------------------

COVERAGE = """\
kind: flow
slug: cov_v1
queues: {pre: cov_pre, work: cov_jobs}
steps:
  pre: {handler: rt_handlers:first}
  work: {needs: [pre], handler: rt_handlers:second}
---
kind: flow
slug: cov_v2
queues: {pre: cov_pre, work: cov_jobs}
steps:
  pre: {handler: rt_handlers:first}
  work: {needs: [pre], handler: rt_handlers:second}
---
kind: alias
slug: cov
active: cov_v2
draining: [cov_v1]
"""

OTHER = """\
kind: flow
slug: cov_other
queues: {only: cov_jobs}
steps:
  only: {handler: rt_handlers:first}
"""


def _active_elsewhere(dsn: str, root: Path) -> None:
    rt_support.apply_flows(dsn, _checkout(root / "newer", other=OTHER))


def _started_run(dsn: str, root: Path) -> None:
    start_run(dsn, "cov_v1", {"value": 1})


def _task_on_the_queue(dsn: str, root: Path) -> None:
    start_run(dsn, "cov_v1", {"value": 1})
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        [pre] = engine.claim("cov_pre")
        engine.complete(pre, {"value": 1})


@pytest.mark.parametrize(
    ("make_state", "refused"),
    [
        (_active_elsewhere, "cov_other.only (needed by: active version)"),
        (_started_run, "cov_v1.work (needed by: started run)"),
        (_task_on_the_queue, "cov_v1.work (needed by: started run, task on the queue)"),
    ],
    ids=["active-target", "started-run-of-draining-version", "recoverable-task"],
)
def test_startup_refuses_incomplete_coverage(
    dsn: str, tmp_path: Path, make_state: Callable[[str, Path], None], refused: str
) -> None:
    root = _checkout(tmp_path / "project", cov=COVERAGE)
    rt_support.apply_flows(dsn, root)
    make_state(dsn, tmp_path)
    result = flowlane("worker", "--queue", "cov_jobs", "--flows", "cov_v2", "--dsn", dsn, cwd=root)
    assert result.returncode == 1, result.stderr
    assert "does not serve every (flow, step) routed to queue cov_jobs" in result.stderr
    assert refused in result.stderr and "Traceback" not in result.stderr
    assert _rows(dsn, "select count(*) from flowlane.workers") == [(0,)]


def test_two_versions_share_a_queue_through_a_drain(flows_dsn: str, spawn: Spawn) -> None:
    old_run = start_run(flows_dsn, "rt_versioned_v1", {"name": "Ada"})  # started before the move
    listed = flowlane("worker", "list", "--dsn", flows_dsn)
    assert "alias rt_versioned: version rt_versioned_v1 draining: 1 started run(s), 1 task(s)" \
        in listed.stdout
    worker = spawn("--name", "rt_versioned_worker")
    new_run = start_run(flows_dsn, "rt_versioned", {"name": "Bob"})
    old = wait_run(flows_dsn, old_run, workers=[worker])
    new = wait_run(flows_dsn, new_run, workers=[worker])
    assert (old["run"]["flow_slug"], old["run"]["output"]) == (
        "rt_versioned_v1", {"greet": "hello Ada"})
    assert new["run"]["flow_slug"] == "rt_versioned_v2" and new["run"]["status"] == "completed"
    listed = flowlane("worker", "list", "--dsn", flows_dsn)
    assert "alias rt_versioned: version rt_versioned_v1 drained" in listed.stdout
    assert "rt_versioned_worker  queue rt_versioned  enabled  1 live worker(s)" in listed.stdout
    assert "rt_versioned_v1.greet" in listed.stdout and "rt_versioned_v2.shout" in listed.stdout


# -- workers never write definitions -------------------------------------------------

OLD_VERSIONS = """\
kind: flow
slug: rt_versioned_v1
queues:
  greet: rt_versioned
steps:
  greet:
    handler: rt_handlers:greet_v1
---
kind: alias
slug: rt_versioned
active: rt_versioned_v1
"""


def test_worker_from_an_older_checkout_leaves_aliases_and_definitions_alone(
    flows_dsn: str, tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    old = _checkout(tmp_path / "old", versions=OLD_VERSIONS,
                    diamond=(PROJECT / "flows" / "diamond.yaml").read_text())
    before = definitions(flows_dsn)
    worker = workers(flows_dsn, "--flow", "rt_diamond", cwd=old)
    run_id = start_run(flows_dsn, "rt_diamond", {"numbers": [1, 2]})
    assert wait_run(flows_dsn, run_id, workers=[worker])["run"]["status"] == "completed"
    assert definitions(flows_dsn) == before
    started = flowlane("start", "rt_versioned", "--input", '{"name": "Ada"}', "--format", "json",
                       "--dsn", flows_dsn)
    assert '"flow_slug": "rt_versioned_v2"' in started.stdout


ADHOC = """\
kind: flow
slug: adhoc
defaults:
  max_attempts: 7
  timeout: 300
steps:
  only:
    timeout: 120
    handler: rt_handlers:first
"""


def test_missing_flow_refuses_the_start_and_compile_equals_apply(
    db_factory: Callable[..., str], tmp_path: Path, workers: Callable[..., WorkerProcess]
) -> None:
    root = _checkout(tmp_path / "project", adhoc=ADHOC)
    by_worker, by_apply = db_factory(), db_factory()
    refused = flowlane("worker", "--flow", "adhoc", "--dsn", by_worker, cwd=root)
    assert refused.returncode == 1
    assert "flows missing from the database: adhoc" in refused.stderr
    assert "`flowlane apply`" in refused.stderr
    assert definitions(by_worker)["flows"] == []

    workers(by_worker, "--flow", "adhoc", "--compile", cwd=root).stop()
    assert flowlane("compile", cwd=root).returncode == 0
    applied = flowlane("apply", "--dsn", by_apply, cwd=root)
    assert applied.returncode == 0, applied.stderr
    assert definitions(by_worker) == definitions(by_apply)
    [(attempts, timeout, step_timeout)] = _rows(
        by_worker, "select f.opt_max_attempts, f.opt_timeout, s.opt_timeout "
                   "from flowlane.flows f join flowlane.steps s using (flow_slug)")
    assert (attempts, timeout, step_timeout) == (7, 300, 120)
    plan = flowlane("plan", "--dsn", by_worker, cwd=root)
    assert "NO_CHANGE" in plan.stdout and "SAFE_OPTION_CHANGE" not in plan.stdout


# -- fenced rollout ---------------------------------------------------------------------


def test_compile_leaves_a_flow_created_meanwhile_by_another_writer_alone(
    db_factory: Callable[..., str], tmp_path: Path
) -> None:
    project = load_project([_checkout(tmp_path / "project", adhoc=ADHOC) / "flows"])
    dsn = db_factory()
    assert create_flows(project, ["adhoc"], dsn) == ("adhoc",)
    with psycopg.connect(dsn, autocommit=True) as conn:  # another writer's options
        conn.execute("update flowlane.flows set opt_max_attempts = 2 where flow_slug = 'adhoc'")
    # a worker that found the flow missing before that writer committed
    assert create_flows(project, ["adhoc"], dsn) == ()
    assert _rows(dsn, "select opt_max_attempts from flowlane.flows") == [(2,)]


def _compiled(tmp_path: Path) -> Path:
    out = tmp_path / "sql"
    assert flowlane("compile", "--out", str(out)).returncode == 0
    return out


def test_rollout_fences_the_deployments_and_reenables_only_the_enabled_ones(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    out = _compiled(tmp_path)
    off = spawn("--name", "rt_versioned_worker")
    assert off.stop() == 0
    assert flowlane("worker", "disable", "rt_versioned_worker", "--reason", "on hold",
                    "--dsn", flows_dsn).returncode == 0
    live = [spawn("--name", name, "--heartbeat-interval", "0.2")
            for name in ("rt_jobs_worker", "rt_side_worker")]
    result = flowlane("rollout", "--out", str(out), "--dsn", flows_dsn, "--deployments",
                      "rt_jobs_worker,rt_side_worker,rt_versioned_worker")
    assert result.returncode == 0, result.stderr
    lines = result.stdout
    assert "disabled rt_jobs_worker, rt_side_worker, rt_versioned_worker; " \
           "will re-enable rt_jobs_worker, rt_side_worker" in lines
    assert re.search(r"waiting for [12] worker\(s\) to stop", lines)
    assert lines.index("every worker of these deployments has stopped") < lines.index("applied")
    # deprecated workers stop gracefully and exit for a restart with the new definitions
    assert [w.wait(30) for w in live] == [WorkerExit.RESTART] * 2
    assert WorkerExit.RESTART not in NOT_RESTARTED
    assert _deployment(flows_dsn, "rt_jobs_worker") == (True, None)
    assert _deployment(flows_dsn, "rt_versioned_worker") == (False, "on hold")


def test_a_worker_started_while_its_deployment_is_disabled_waits_then_exits_for_a_restart(
    flows_dsn: str, spawn: Spawn
) -> None:
    """What a supervisor that restarts every exit (Kubernetes; systemd after a rollout's
    exit 4) meets while the deployment is disabled: a worker that waits, not a crash loop."""
    spawn("--name", "rt_jobs_worker").stop()
    assert flowlane("worker", "disable", "rt_jobs_worker", "--reason", "rollout 7 in progress",
                    "--dsn", flows_dsn).returncode == 0
    waiting = spawn("--name", "rt_jobs_worker", "--when-disabled", "wait", ready=False)
    waiting.wait_logged("deployment_disabled", "the worker to wait")
    assert waiting.proc.poll() is None, waiting.text()
    assert "rollout 7 in progress" in waiting.text()
    refused = flowlane("worker", "--name", "rt_jobs_worker", "--dsn", flows_dsn)  # the default
    assert refused.returncode == WorkerExit.DISABLED, refused.stderr
    assert WorkerExit.DISABLED in NOT_RESTARTED

    assert flowlane("worker", "enable", "rt_jobs_worker", "--dsn", flows_dsn).returncode == 0
    assert waiting.wait(30) == WorkerExit.RESTART, waiting.text()
    assert "deployment rt_jobs_worker is enabled again" in waiting.text()
    assert "worker_started" not in waiting.text()  # it never claimed while disabled

    assert flowlane("worker", "disable", "rt_jobs_worker", "--dsn", flows_dsn).returncode == 0
    stopped = spawn("--name", "rt_jobs_worker", "--when-disabled", "wait", ready=False)
    stopped.wait_logged("deployment_disabled", "the worker to wait")
    assert stopped.stop() == WorkerExit.STOPPED  # a stop while it waits is a plain stop


def test_interrupted_rollout_run_again_finishes_without_enabling_more(
    flows_dsn: str, spawn: Spawn, tmp_path: Path
) -> None:
    out = _compiled(tmp_path)
    spawn("--name", "rt_side_worker").stop()
    flowlane("worker", "disable", "rt_side_worker", "--dsn", flows_dsn)
    stuck = spawn("--name", "rt_jobs_worker", "--heartbeat-interval", "0.2")
    stuck.signal(signal.SIGSTOP)  # cannot stop in time: the rollout gives up, still fenced
    first = flowlane("rollout", "--out", str(out), "--timeout", "1", "--dsn", flows_dsn)
    assert first.returncode == 1
    assert "1 worker(s) still running after 1 s" in first.stderr
    assert "run the same `flowlane rollout` again" in first.stderr
    assert _deployment(flows_dsn, "rt_jobs_worker")[0] is False
    stuck.signal(signal.SIGCONT)
    assert stuck.wait(30) == WorkerExit.RESTART  # deprecated: exits for a restart
    second = flowlane("rollout", "--out", str(out), "--dsn", flows_dsn)
    assert second.returncode == 0, second.stderr
    assert "re-enabled rt_jobs_worker" in second.stdout
    assert _deployment(flows_dsn, "rt_jobs_worker") == (True, None)
    assert _deployment(flows_dsn, "rt_side_worker")[0] is False


# -- queues -----------------------------------------------------------------------------


def test_queue_list_and_adopt_commands(flows_dsn: str) -> None:
    start_run(flows_dsn, "rt_shared_b", {"value": 1})
    listed = flowlane("queue", "list", "--dsn", flows_dsn)
    assert listed.returncode == 0
    line = next(x for x in listed.stdout.splitlines() if x.startswith("rt_jobs "))
    assert line.split()[1:3] == ["shared", "1"]
    assert any(x.split()[:4] == ["rt_slow", "owned", "by", "rt_slow"]
               for x in listed.stdout.splitlines())
    _rows(flows_dsn, "select pgmq.create('Legacy')")
    adopted = flowlane("queue", "adopt", "legacy", "--dsn", flows_dsn)
    assert adopted.returncode == 0, adopted.stderr
    assert "queue legacy is registered as shared (PGMQ spelling: Legacy)" in adopted.stdout
    _rows(flows_dsn, "select pgmq.create('foreign_jobs')")
    _rows(flows_dsn, """select pgmq.send('foreign_jobs', '{"x": 1}')""")
    refused = flowlane("queue", "adopt", "foreign_jobs", "--dsn", flows_dsn)
    assert refused.returncode == 1 and "no flowlane task tracks" in refused.stderr
