"""``flowlane serve``: one real worker process per queue, restarts, graceful stop."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flowlane import defaults
from flowlane.compiler import api
from flowlane.errors import NOT_RESTARTED, WorkerExit
from flowlane.runtime.client import Client
from flowlane.runtime.serve import Supervisor, WorkerSpec, plan_workers
from tests.runtime.rt_support import env, flowlane, wait_until

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: sv_plain
defaults: {base_delay: 0, timeout: 5}
steps:
  hello:
    handler: sv_handlers:hello
---
kind: flow
slug: sv_split
queues: per-step
defaults: {base_delay: 0, timeout: 5}
steps:
  one:
    handler: sv_handlers:hello
  two:
    needs: [one]
    handler: sv_handlers:hello
---
kind: flow
slug: sv_shared
queues: {work: sv_shared_q}
defaults: {base_delay: 0, timeout: 5}
steps:
  work:
    handler: sv_handlers:hello
---
kind: worker
name: sv_shared_worker
queue: sv_shared_q
flows: [sv_shared]
"""

HANDLERS = """\
import os


def hello(input, ctx):
    return {"pid": os.getpid(), "step": ctx.step_slug}
"""


@pytest.fixture
def project(tmp_path: Path, dsn: str) -> Path:
    root = tmp_path / "proj"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "sv.yaml").write_text(FLOWS)
    (root / "sv_handlers.py").write_text(HANDLERS)
    for command in (("compile",), ("apply", "--dsn", dsn)):
        result = flowlane(*command, cwd=root)
        assert result.returncode == 0, result.stdout + result.stderr
    return root


def test_plan_one_worker_per_queue(project: Path) -> None:
    specs = plan_workers(api.load_project([project / "flows"]))
    assert [(s.name, s.config.changed()) for s in specs] == [
        ("sv_shared_worker", {"name": "sv_shared_worker"}),
        ("sv_plain", {"queue": "sv_plain"}),
        ("sv_split__one", {"queue": "sv_split__one"}),
        ("sv_split__two", {"queue": "sv_split__two"}),
    ]


def _pids(text: str) -> dict[str, int]:
    """The pid of every running worker in the last status block printed."""
    found: dict[str, int] = {}
    for match in re.finditer(r"^(\S+)\s+running\s+pid (\d+)", text, re.MULTILINE):
        found[match[1]] = int(match[2])
    return found


_DISABLED = re.compile(r"^sv_plain\s+disabled\s", re.MULTILINE)


def _last_block(text: str) -> str:
    blocks = [b for b in text.split("\n\n") if b.strip()]
    return blocks[-1] if blocks else ""


def _serve(project: Path, dsn: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    with out.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "flowlane", "serve", "--dsn", dsn, "--shutdown-timeout", "5",
             *extra],
            cwd=project, env=env(), stdout=sink, stderr=subprocess.STDOUT,
        )


def _all_running(proc: subprocess.Popen[bytes], out: Path) -> dict[str, int]:
    def running() -> dict[str, int] | None:
        assert proc.poll() is None, out.read_text()
        pids = _pids(_last_block(out.read_text()))
        return pids if len(pids) == 4 else None

    found: dict[str, int] = wait_until(running, timeout=60, message="four workers running")
    return found


def test_serve_restarts_a_killed_worker_and_stops_cleanly(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    proc = _serve(project, dsn, out)
    try:
        pids = _all_running(proc, out)
        logs = project / ".flowlane" / "logs"
        wait_until(lambda: all("worker_started" in (logs / f"{n}.log").read_text()
                               for n in pids), timeout=60, message="workers started")
        with Client(dsn) as client:
            runs = [client.start(flow, {}).run_id for flow in ("sv_plain", "sv_split", "sv_shared")]
            assert all(client.wait(r, timeout=60).run.status == "completed" for r in runs)

        os.kill(pids["sv_plain"], signal.SIGKILL)

        def restarted() -> int | None:
            block = _last_block(out.read_text())
            new = _pids(block).get("sv_plain")
            return new if new and new != pids["sv_plain"] and "restarts 1" in block else None

        new_pid = wait_until(restarted, timeout=60, message="sv_plain restarted")
        assert "killed by signal 9; restarting in" in out.read_text()
        with Client(dsn) as client:
            run_id = client.start("sv_plain", {}).run_id
            state = client.wait(run_id, timeout=60)
        assert state.run.output["hello"]["pid"] == new_pid

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    final = _last_block(out.read_text())
    assert final.count("stopped") == 4, final
    for pid in [*pids.values(), new_pid]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with psycopg.connect(dsn) as conn:
        live = conn.execute(
            "select worker_name from flowlane.workers where stopped_at is null "
            "and last_heartbeat_at > now() - interval '1 hour'"
        ).fetchall()
    # the SIGKILLed worker never marked itself stopped; every gracefully stopped one did
    assert [name for (name,) in live] == ["sv_plain"]


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def test_a_killed_serve_takes_its_workers_with_it_and_a_second_serve_refuses_to_double(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    first = _serve(project, dsn, tmp_path / "first.out")
    try:
        pids = _all_running(first, tmp_path / "first.out")
        logs = project / ".flowlane" / "logs"
        wait_until(lambda: all("worker_started" in (logs / f"{n}.log").read_text()
                               for n in pids), timeout=60, message="workers registered")
        second = flowlane("serve", "--dsn", dsn, cwd=project, timeout=60)
        assert second.returncode == WorkerExit.FAILED, second.stdout + second.stderr
        assert "live workers already serve this project's queues: sv_plain: 1 of deployment " \
               "sv_plain" in second.stderr
        assert "--beside-live-workers" in second.stderr

        first.kill()  # SIGKILL: serve cannot forward anything
        first.wait(10)
        wait_until(lambda: all(_gone(pid) for pid in pids.values()), timeout=30,
                   message="every worker of the killed serve to end")
    finally:
        if first.poll() is None:
            first.kill()
    with psycopg.connect(dsn) as conn:
        live = conn.execute("select count(*) from flowlane.workers where stopped_at is null").fetchone()
    assert live == (0,)  # each stopped gracefully: marked stopped, nothing left to double

    third = _serve(project, dsn, tmp_path / "third.out")
    try:
        assert len(_all_running(third, tmp_path / "third.out")) == 4
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=60) == 0
    finally:
        if third.poll() is None:
            third.kill()


def _command(code: int) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit({code})"]


def test_exit_statuses_2_and_3_are_never_restarted_other_exits_are() -> None:
    specs = [WorkerSpec("disabled", "q1"), WorkerSpec("crashing", "q2"), WorkerSpec("usage", "q3")]
    codes = {"disabled": WorkerExit.DISABLED, "crashing": WorkerExit.FAILED,
             "usage": WorkerExit.USAGE}
    supervisor = Supervisor(
        specs, lambda s: _command(codes[s.name]), base_delay=0.01, max_delay=0.04,
        out=io.StringIO(),
    )
    supervisor.start()
    by_name = {w.spec.name: w for w in supervisor.workers}

    def crashed_thrice() -> bool:
        supervisor.tick()
        return by_name["crashing"].restarts >= 3

    wait_until(crashed_thrice, timeout=60, message="three restarts")
    disabled = by_name["disabled"]
    assert disabled.state == "disabled" and disabled.restarts == 0
    assert "flowlane worker enable disabled" in disabled.detail
    assert by_name["crashing"].delay in (0.02, 0.04)  # backoff doubled, capped
    usage = by_name["usage"]
    assert usage.state == "refused" and usage.restarts == 0 and "bad arguments" in usage.detail
    assert {WorkerExit.DISABLED, WorkerExit.USAGE} == NOT_RESTARTED
    supervisor.stop(timeout=10)
    assert disabled.state == "disabled"
    assert by_name["crashing"].state == "stopped"


FAILING = """\
import sys
print("error: the database holds flows whose shape differs from the YAML:")
print("  flow sv_plain (flows/sv.yaml:1):")
print("    step extra: added")
print("hint: apply it")
print("worker_exited code=1")
sys.exit(1)
"""


def test_the_status_shows_an_error_whole_prints_a_block_once_and_no_old_error_after_a_stop(
    tmp_path: Path,
) -> None:
    out = io.StringIO()  # not a terminal: a new block on each change
    supervisor = Supervisor(
        [WorkerSpec("w", "q")], lambda s: [sys.executable, "-c", FAILING], cwd=tmp_path,
        log_dir=tmp_path / "logs", base_delay=600, out=out,
    )
    supervisor.start()
    worker = supervisor.workers[0]
    wait_until(lambda: supervisor.tick() and worker.state == "backoff", timeout=60,
               message="the worker in backoff")
    for _ in range(3):
        supervisor.tick()
        supervisor.render()
    blocks = [b for b in out.getvalue().split("\n\n") if b.strip()]
    assert len(blocks) == 2, out.getvalue()  # started, then failed: nothing repeated
    assert blocks[1].splitlines()[1:] == [
        "    error: the database holds flows whose shape differs from the YAML:",
        "      flow sv_plain (flows/sv.yaml:1):",
        "        step extra: added",
        "    hint: apply it",
        "    log: logs/w.log",
    ]
    supervisor.stop(timeout=10)
    final = [b for b in out.getvalue().split("\n\n") if b.strip()][-1]
    assert final == "w  stopped", final  # neither the old error nor the old backoff


def test_a_worker_restarted_for_a_new_selection_says_routing_changed() -> None:
    spec = WorkerSpec("w", "q")
    supervisor = Supervisor(
        [spec], lambda s: [sys.executable, "-c", "import signal; signal.pause()"], out=io.StringIO())
    supervisor.start()
    moved = WorkerSpec("w", "q", dataclasses.replace(spec.config, queue="q2"))
    supervisor.follow([moved], reason="definitions changed")
    worker = supervisor.workers[0]
    assert (worker.state, worker.detail) == ("restarting", "routing changed")
    supervisor.stop(timeout=10)
    assert worker.state == "stopped"


def test_serve_never_restarts_a_disabled_deployment(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    proc = _serve(project, dsn, out)
    try:
        pids = _all_running(proc, out)
        logs = project / ".flowlane" / "logs"
        wait_until(lambda: "worker_started" in (logs / "sv_plain.log").read_text(),
                   timeout=60, message="sv_plain registered its deployment")
        disabled = flowlane("worker", "disable", "sv_plain", "--reason", "bad release",
                            "--dsn", dsn, cwd=project)
        assert disabled.returncode == 0, disabled.stdout + disabled.stderr
        os.kill(pids["sv_plain"], signal.SIGKILL)  # a crash: serve restarts it, it refuses

        def settled() -> str | None:
            assert proc.poll() is None, out.read_text()
            block = _last_block(out.read_text())
            return block if _DISABLED.search(block) else None

        block = wait_until(settled, timeout=60, message="sv_plain disabled")
        assert "exit 3" in block and "flowlane worker enable sv_plain" in block
        assert len(_pids(block)) == 3  # the others keep running
        with Client(dsn) as client:
            run_id = client.start("sv_split", {}).run_id
            assert client.wait(run_id, timeout=60).run.status == "completed"
        assert _last_block(out.read_text()) == block  # not restarted again
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _DISABLED.search(_last_block(out.read_text()))


# -- serve follows the database ----------------------------------------------------

DIGEST_FLOW_V1 = """\
kind: flow
slug: digest_v1
queues: {summarize: digest}
defaults: {base_delay: 0, timeout: 5}
steps:
  summarize:
    handler: sv_handlers:hello
"""

DIGEST_V1 = DIGEST_FLOW_V1 + """\
---
kind: alias
slug: digest
active: digest_v1
"""

DIGEST_V2 = DIGEST_FLOW_V1 + """\
---
kind: flow
slug: digest_v2
queues: {summarize: digest, publish: digest}
defaults: {base_delay: 0, timeout: 5}
steps:
  summarize:
    handler: sv_handlers:hello
  publish:
    needs: [summarize]
    handler: sv_handlers:hello
---
kind: alias
slug: digest
active: digest_v2
draining: [digest_v1]
---
kind: flow
slug: fresh
defaults: {base_delay: 0, timeout: 5}
steps:
  greet:
    handler: sv_handlers:hello
"""


def _compile_and_apply(root: Path, dsn: str) -> None:
    for command in (("compile",), ("apply", "--dsn", dsn)):
        result = flowlane(*command, cwd=root)
        assert result.returncode == 0, result.stdout + result.stderr


def test_serve_follows_apply_of_a_new_flow_and_a_new_version_on_a_shared_queue(
    tmp_path: Path, dsn: str
) -> None:
    root = tmp_path / "digest"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "digest.yaml").write_text(DIGEST_V1)
    (root / "sv_handlers.py").write_text(HANDLERS)
    _compile_and_apply(root, dsn)
    out = tmp_path / "serve.out"
    proc = _serve(root, dsn, out)
    logs = root / ".flowlane" / "logs"
    try:
        def digest_serving() -> int | None:
            assert proc.poll() is None, out.read_text()
            log = logs / "digest.log"
            started = log.exists() and "worker_started" in log.read_text()
            return _pids(_last_block(out.read_text())).get("digest") if started else None

        first_pid = wait_until(digest_serving, timeout=60, message="the digest worker")
        with Client(dsn) as client:
            before = client.start("digest", {}).run_id
            assert client.wait(before, timeout=60).run.status == "completed"

        # a new version on the same queue, the alias moved, and a new flow on a new queue:
        # reviewed SQL applied while serve runs, runs started at once
        (root / "flows" / "digest.yaml").write_text(DIGEST_V2)
        assert flowlane("compile", cwd=root).returncode == 0
        planned = flowlane("plan", "--dsn", dsn, cwd=root)
        assert ("note: queue digest: the live workers of deployment digest do not serve "
                "digest_v2.publish, digest_v2.summarize; under `flowlane serve` they restart"
                in planned.stderr), planned.stdout + planned.stderr
        _compile_and_apply(root, dsn)
        with Client(dsn) as client:
            runs = {flow: client.start(flow, {}).run_id for flow in ("digest", "fresh")}
            states = {flow: client.wait(run, timeout=90) for flow, run in runs.items()}
        assert {f: s.run.status for f, s in states.items()} == {
            "digest": "completed", "fresh": "completed"}
        assert states["digest"].run.flow_slug == "digest_v2"
        assert set(states["digest"].run.output) == {"publish"}

        block = _last_block(out.read_text())
        pids = _pids(block)
        assert set(pids) == {"digest", "fresh"}, block
        # the digest worker was replaced (it asked for a restart with the new registry)
        assert pids["digest"] != first_pid
        assert "definitions_changed" in (logs / "digest.log").read_text()
        assert "unsupported_work" not in (logs / "digest.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    with psycopg.connect(dsn) as conn:
        disabled = conn.execute(
            "select deployment_name from flowlane.worker_deployments where not enabled"
        ).fetchall()
    assert disabled == []


def test_serve_shows_why_a_worker_waits_and_starts_it_when_the_flows_are_applied(
    tmp_path: Path, dsn: str
) -> None:
    root = tmp_path / "early"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "digest.yaml").write_text(DIGEST_V1)
    (root / "sv_handlers.py").write_text(HANDLERS)
    out = tmp_path / "serve.out"
    proc = _serve(root, dsn, out)  # before anything is applied
    try:
        def waiting() -> str | None:
            assert proc.poll() is None, out.read_text()
            block = _last_block(out.read_text())
            return block if re.search(r"^digest\s+backoff\s", block, re.MULTILINE) else None

        block = wait_until(waiting, timeout=60, message="the digest worker in backoff")
        # the reason is in serve's own status, not only in the worker's log
        assert "    error: flows missing from the database: digest_v1" in block
        assert "    hint: apply the reviewed SQL first" in block  # whole, with its log
        assert "    log: .flowlane/logs/digest.log" in block
        _compile_and_apply(root, dsn)  # the definition-change notification restarts it
        with Client(dsn) as client:
            run_id = client.start("digest", {}).run_id
            assert client.wait(run_id, timeout=60).run.status == "completed"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    final = _last_block(out.read_text())
    assert "stopped" in final and "error" not in final, final


def test_serve_reload_restarts_the_workers_when_a_handler_module_changes(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "serve", "--dsn", dsn, "--reload",
             "--shutdown-timeout", "5"],
            cwd=project, env=env(), stdout=sink, stderr=subprocess.STDOUT,
        )
    try:
        before = _all_running(proc, out)
        (project / "sv_handlers.py").write_text(
            HANDLERS.replace('"step": ctx.step_slug', '"step": ctx.step_slug, "edited": True'))

        def restarted() -> dict[str, int] | None:
            assert proc.poll() is None, out.read_text()
            pids = _pids(_last_block(out.read_text()))
            fresh = len(pids) == 4 and all(pids[n] != before[n] for n in before)
            return pids if fresh else None

        wait_until(restarted, timeout=60, message="every worker restarted")
        assert "handler files changed: sv_handlers.py; restarting the workers" in out.read_text()
        with Client(dsn) as client:
            state = client.wait(client.start("sv_plain", {}).run_id, timeout=60)
        assert state.run.output["hello"]["edited"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


# -- serve --reload keeps working workers until the new code can start -----------------

EDITED = HANDLERS.replace('"step": ctx.step_slug', '"step": ctx.step_slug, "edited": True')

# a new step in sv_plain: a shape the database does not hold until it is applied
RESHAPED = FLOWS.replace("""    handler: sv_handlers:hello
---
kind: flow
slug: sv_split""", """    handler: sv_handlers:hello
  extra:
    needs: [hello]
    handler: sv_handlers:hello
---
kind: flow
slug: sv_split""", 1)

MORE = FLOWS + """\
---
kind: flow
slug: sv_more
defaults: {base_delay: 0, timeout: 5}
steps:
  greet:
    handler: sv_handlers:hello
"""


_STATUS = re.compile(r"^\S+\s{2,}(running|backoff|disabled|restarting|stopping|stopped)\b", re.MULTILINE)


def _last_status(text: str) -> str:
    """The last status block printed (serve's own messages come between the blocks)."""
    blocks = [b for b in text.split("\n\n") if _STATUS.search(b)]
    return blocks[-1] if blocks else ""


def _sv_plain(dsn: str) -> dict[str, Any]:
    """The output of a new sv_plain run's step (who ran it, with which code)."""
    with Client(dsn) as client:
        state = client.wait(client.start("sv_plain", {}).run_id, timeout=60)
    assert state.run.status == "completed", state
    output: dict[str, Any] = state.run.output["hello"]
    return output


def _all_restarted(proc: subprocess.Popen[bytes], out: Path, before: dict[str, int],
                   count: int = 4) -> dict[str, int]:
    def restarted() -> dict[str, int] | None:
        assert proc.poll() is None, out.read_text()
        pids = _pids(_last_status(out.read_text()))
        fresh = len(pids) == count and all(pids[n] != before[n] for n in before)
        return pids if fresh else None

    found: dict[str, int] = wait_until(restarted, timeout=90, message="every worker restarted")
    return found


def _all_serving(proc: subprocess.Popen[bytes], out: Path, project: Path) -> dict[str, int]:
    """Every worker running and past its startup checks (its handlers imported)."""
    pids = _all_running(proc, out)
    logs = project / ".flowlane" / "logs"
    wait_until(lambda: all("worker_started" in (logs / f"{n}.log").read_text() for n in pids),
               timeout=60, message="workers started")
    return pids


def _stop(proc: subprocess.Popen[bytes], out: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.read_text()


def test_serve_reload_keeps_the_workers_for_an_unapplied_shape_and_restarts_on_a_revert(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    proc = _serve(project, dsn, out, "--reload")
    flows = project / "flows" / "sv.yaml"
    try:
        before = _all_serving(proc, out, project)
        flows.write_text(RESHAPED)
        wait_until(lambda: "serve: not applied" in out.read_text(), timeout=60,
                   message="the unapplied edit reported")
        (project / "sv_handlers.py").write_text(EDITED)
        check_log = project / ".flowlane" / "logs" / "serve-check.log"
        wait_until(lambda: "handler files changed: sv_handlers.py" in check_log.read_text(),
                   timeout=60, message="the handler save checked")

        # the old workers keep serving what the database holds, with the code they loaded
        output = _sv_plain(dsn)
        assert output["pid"] == before["sv_plain"] and "edited" not in output
        text = out.read_text()
        assert text.count("serve: not applied: run `flowlane plan`, then `flowlane apply` "
                          "(flows sv_plain differ from the database)") == 1, text
        assert "restarting the workers" not in text and _pids(_last_status(text)) == before
        assert "flow sv_plain (" in text  # the differences, in the database's words

        flows.write_text(FLOWS)  # reverted: the saved handler can start now
        after = _all_restarted(proc, out, before)
        output = _sv_plain(dsn)
        assert output["pid"] == after["sv_plain"] and output["edited"] is True
        assert ("flow files changed: flows/sv.yaml; handler files changed: sv_handlers.py; "
                "restarting the workers") in out.read_text()
        _stop(proc, out)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_reload_keeps_the_last_good_worker_while_a_handler_cannot_be_imported(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    proc = _serve(project, dsn, out, "--reload")
    handlers = project / "sv_handlers.py"
    try:
        before = _all_serving(proc, out, project)
        handlers.write_text(HANDLERS + "\ndef broken(:\n")
        text = wait_until(lambda: "cannot start a worker" in out.read_text() and out.read_text(),
                          timeout=60, message="the broken module reported")
        assert "(log: .flowlane/logs/serve-check.log)" in text
        assert "importing sv_handlers raised SyntaxError" in text
        assert "SyntaxError" in (project / ".flowlane" / "logs" / "serve-check.log").read_text()
        assert _sv_plain(dsn)["pid"] == before["sv_plain"]  # the last good worker serves

        handlers.write_text(EDITED)  # fixed: the next change restarts onto the new code
        after = _all_restarted(proc, out, before)
        logs = project / ".flowlane" / "logs"
        wait_until(lambda: all((logs / f"{n}.log").read_text().count("worker_started") == 2
                               for n in after), timeout=60, message="the new workers started")
        output = _sv_plain(dsn)
        assert output["pid"] == after["sv_plain"] and output["edited"] is True

        # a typo'd handler name in the flow file: the same, said whole
        (project / "flows" / "sv.yaml").write_text(FLOWS.replace("sv_handlers:hello", "sv_handlers:helo", 1))
        wait_until(lambda: "has no attribute 'helo'" in out.read_text(), timeout=60,
                   message="the typo reported")
        assert "did you mean `hello`?" in out.read_text()
        assert _sv_plain(dsn)["pid"] == after["sv_plain"]
        assert _pids(_last_status(out.read_text())) == after
        _stop(proc, out)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_reload_restarts_the_workers_once_the_edit_is_applied(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "serve.out"
    proc = _serve(project, dsn, out, "--reload")
    try:
        before = _all_serving(proc, out, project)
        (project / "flows" / "sv.yaml").write_text(MORE)
        wait_until(lambda: "(flows sv_more differ from the database)" in out.read_text(),
                   timeout=60, message="the new flow reported as not applied")
        assert "flow sv_more: missing from the database" in out.read_text()
        assert _pids(_last_status(out.read_text())) == before

        _compile_and_apply(project, dsn)  # the definition change restarts them
        after = _all_restarted(proc, out, before, count=5)
        with Client(dsn) as client:
            state = client.wait(client.start("sv_more", {}).run_id, timeout=60)
        assert state.run.output["greet"]["pid"] == after["sv_more"]
        # whether the apply's notification or a file scan came first, the restart names what
        # changed: the flow file, the applied definitions, or both
        restarts = [line for line in out.read_text().splitlines() if "restarting the workers" in line]
        assert restarts and any(reason in restarts[-1] for reason in (
            "definitions applied", "flow files changed: flows/sv.yaml")), restarts
        _stop(proc, out)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_every_served_worker_gets_the_measured_default_limits(
    project: Path, dsn: str, tmp_path: Path
) -> None:
    """A worker document without limits (sv_shared_worker) and the queues without one get
    the limits of `flowlane worker`, `Worker(...)` and the document's model alike."""
    out = tmp_path / "serve.out"
    proc = _serve(project, dsn, out)
    try:
        pids = _all_running(proc, out)
        logs = project / ".flowlane" / "logs"

        def started() -> dict[str, tuple[int, int]] | None:
            found = {}
            for name in pids:
                line = re.search(r"worker_started .*max_concurrent=(\d+) batch_size=(\d+)",
                                 (logs / f"{name}.log").read_text())
                if line is None:
                    return None
                found[name] = (int(line[1]), int(line[2]))
            return found

        limits = wait_until(started, timeout=60, message="workers started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    measured = (defaults.MAX_CONCURRENT, defaults.BATCH_SIZE)
    assert limits == dict.fromkeys(
        ["sv_shared_worker", "sv_plain", "sv_split__one", "sv_split__two"], measured)


# -- serve fires schedules -----------------------------------------------------------

SCHEDULED = """\
kind: flow
slug: sv_beat
defaults: {base_delay: 0, timeout: 5}
steps:
  hello:
    handler: sv_handlers:hello
---
kind: schedule
name: sv_every_two_seconds
flow: sv_beat
every: 2s
overlap: allow
input: {from: schedule}
"""


def test_serve_fires_a_schedule_end_to_end(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "beat"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "beat.yaml").write_text(SCHEDULED)
    (root / "sv_handlers.py").write_text(HANDLERS)
    _compile_and_apply(root, dsn)
    out = tmp_path / "serve.out"
    proc = _serve(root, dsn, out)
    try:
        def two_completed() -> list[tuple[Any, ...]] | None:
            assert proc.poll() is None, out.read_text()
            with psycopg.connect(dsn) as conn:
                rows = conn.execute(
                    "select schedule_slot, input, output from flowlane.runs "
                    "where schedule_name = 'sv_every_two_seconds' and status = 'completed' "
                    "order by schedule_slot").fetchall()
            return rows if len(rows) >= 2 else None

        done = wait_until(two_completed, timeout=90, message="two scheduled runs to complete")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    slots = [row[0] for row in done]
    assert all(row[1] == {"from": "schedule"} and row[2]["hello"]["step"] == "hello" for row in done)
    assert all(s.timestamp() % 2 == 0 for s in slots)  # slots are multiples of the interval
    assert len(set(slots)) == len(slots)  # one run per slot
