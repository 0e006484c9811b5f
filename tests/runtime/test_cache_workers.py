"""A cached step with real workers: its handler's side effects (a line per execution in a file)
count one execution for two runs with the same input and two when the flow's version changes;
a map step runs its handler once per new item; `flowlane run` and get_run mark what came from
the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowlane.runtime.client import Client
from tests.runtime.rt_support import WorkerProcess, applied_project, flowlane, start_run, wait_run

pytestmark = pytest.mark.slow

FLOW = """\
kind: flow
slug: {slug}
defaults: {{max_attempts: 1, timeout: 30}}
steps:
  fetch:
    handler: cache_handlers:fetch
    cache: {{ttl: 1h, key: /url}}
  each:
    handler: cache_handlers:each
    type: map
    needs: [fetch]
    cache: {{ttl: 1h}}
"""
FLOWS = FLOW.format(slug="ch_docs_v1") + "---\n" + FLOW.format(slug="ch_docs_v2")

HANDLERS = """\
from pathlib import Path


def _note(folder, line):
    with open(Path(folder) / "executions.log", "a") as out:
        out.write(line + "\\n")


def fetch(input, ctx):
    _note(input["dir"], f"fetch {input['url']}")
    return input["parts"]


def each(input, ctx):
    _note(ctx.flow_input["dir"], f"each {input}")
    return input * 10
"""


def test_a_cached_step_runs_its_handler_once_per_key_and_again_for_a_new_version(
        tmp_path: Path, dsn: str) -> None:
    project = applied_project(tmp_path / "proj", dsn, FLOWS, {"cache_handlers": HANDLERS})
    work = tmp_path / "work"
    work.mkdir()
    log = work / "executions.log"
    workers = [WorkerProcess(dsn, tmp_path, "--queue", queue, cwd=project).wait_ready()
               for queue in ("ch_docs_v1", "ch_docs_v2")]
    try:
        def run(flow: str, url: str, parts: list[int]) -> dict[str, object]:
            run_id = start_run(dsn, flow, {"url": url, "parts": parts, "dir": str(work)})
            state = wait_run(dsn, run_id, workers=workers)
            assert state["run"]["status"] == "completed", state
            return state

        first = run("ch_docs_v1", "a", [1, 2])
        second = run("ch_docs_v1", "a", [1, 2])  # another request id would be the same key: /url
        lines = log.read_text().splitlines()  # a map's items run in any order
        assert lines[0] == "fetch a" and sorted(lines[1:]) == ["each 1", "each 2"]
        assert second["run"]["output"] == first["run"]["output"] == {"each": [10, 20]}
        # a new version of the flow (another shape fingerprint) runs its handlers again
        run("ch_docs_v2", "a", [1, 2])
        assert log.read_text().splitlines().count("fetch a") == 2
        # the map step: one execution per item it has not seen
        third = run("ch_docs_v1", "b", [2, 3])
        lines = log.read_text().splitlines()
        assert lines[-2:] == ["fetch b", "each 3"] and lines.count("each 2") == 2  # (once per version)
        cached = {(t["step_slug"], t["task_index"]): t["cached"] for t in third["tasks"]}
        assert cached == {("fetch", 0): False, ("each", 0): True, ("each", 1): False}
        run_id = str(second["run"]["run_id"])
        with Client(dsn) as client:
            assert all(t.cached for t in client.get_run(run_id).tasks)
        shown = flowlane("run", run_id, "--dsn", dsn, cwd=project)
        assert shown.returncode == 0, shown.stderr
        assert "cached: completed from the cache" in shown.stdout
        shown = flowlane("run", str(third["run"]["run_id"]), "--dsn", dsn, cwd=project)
        assert "cached: 1 of 2 tasks completed from the cache" in shown.stdout, shown.stdout
    finally:
        for worker in workers:
            worker.stop()
