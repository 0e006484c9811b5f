"""A project that started with the bare concrete slug ``hello`` gets a new version
without renaming its callers: an alias ``hello`` over ``hello_v2`` that lists ``hello`` as
draining adopts the name. The CLI, real worker processes and a real database."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.runtime.rt_support import WorkerProcess, flowlane, wait_run
from tests.ui import ui_support

pytestmark = pytest.mark.slow

HANDLERS = """\
def greet_v1(input, ctx):
    return {"hello": input["name"], "version": 1}


def greet_v2(input, ctx):
    return {"hello": input["name"], "version": 2}


def shout(input, ctx):
    return {"shout": input["greet"]["hello"].upper()}
"""

V1 = """\
kind: flow
slug: hello
steps:
  greet:
    handler: handlers:greet_v1
"""

V2 = V1 + """\
---
kind: flow
slug: hello_v2
steps:
  greet:
    handler: handlers:greet_v2
  shout:
    needs: [greet]
    handler: handlers:shout
---
kind: alias
slug: hello
active: hello_v2
draining: [hello]
"""


def run_ok(project: Path, *args: str) -> str:
    done = flowlane(*args, cwd=project)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "hello.yaml").write_text(V1)
    (root / "handlers.py").write_text(HANDLERS)
    return root


def test_an_alias_takes_over_a_bare_slug_and_callers_keep_their_name(
        dsn: str, project: Path, tmp_path: Path) -> None:
    run_ok(project, "compile")
    run_ok(project, "apply", "--dsn", dsn)
    worker = WorkerProcess(dsn, tmp_path, "--flow", "hello", cwd=project).wait_ready()
    first = json.loads(run_ok(project, "start", "hello", "--input", '{"name": "Ada"}',
                              "--wait", "--dsn", dsn))
    assert first == {"greet": {"hello": "Ada", "version": 1}}
    assert worker.stop() == 0
    queued = run_ok(project, "start", "hello", "--input", '{"name": "Bob"}', "--dsn", dsn).strip()

    (project / "flows" / "hello.yaml").write_text(V2)
    run_ok(project, "compile")
    plan = run_ok(project, "plan", "--dsn", dsn)
    assert "NO_CHANGE             flow hello\n" in plan
    assert ("ALIAS_MOVE            alias hello\n  new alias -> hello_v2 (draining: hello)\n"
            "  takes over the name of flow hello: `flowlane start hello` and every caller of "
            "hello now start hello_v2; flow hello keeps its runs and drains") in plan
    run_ok(project, "apply", "--dsn", dsn)
    run_ok(project, "apply", "--dsn", dsn)  # applying hello's SQL again is allowed
    started = json.loads(run_ok(project, "start", "hello", "--input", '{"name": "Cy"}',
                                "--format", "json", "--dsn", dsn))
    assert started["flow_slug"] == "hello_v2"

    # each version keeps its queue; a worker named by the alias serves every version there
    workers = [WorkerProcess(dsn, tmp_path, "--queue", queue, "--flows", "hello",
                             cwd=project).wait_ready() for queue in ("hello", "hello_v2")]
    drained = wait_run(dsn, queued, workers=workers)["run"]
    assert (drained["flow_slug"], drained["output"]) == ("hello", {"greet": {"hello": "Bob", "version": 1}})
    moved = wait_run(dsn, started["run_id"], workers=workers)["run"]
    assert moved["flow_slug"] == "hello_v2" and moved["output"]["shout"] == {"shout": "CY"}
    for worker in workers:
        assert worker.stop() == 0

    listed = json.loads(run_ok(project, "runs", "--flow", "hello", "--format", "json", "--dsn", dsn))
    assert sorted((r["flow_slug"], r["status"]) for r in listed) == [
        ("hello", "completed"), ("hello", "completed"), ("hello_v2", "completed")]
    with ui_support.ui_server(dsn) as console:  # the console's filter means the alias too
        page = ui_support.fetch(f"{console.url}/runs?flow=hello").body
    assert sorted(re.findall(r'<tr data-run="([0-9a-f-]{36})"', page)) == sorted(
        r["run_id"] for r in listed)
    refused = flowlane("worker", "--flow", "hello", "--dsn", dsn, cwd=project)
    assert refused.returncode == 2
    assert "`flowlane worker --queue hello --flows hello`" in refused.stderr
