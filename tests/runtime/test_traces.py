"""Traces: a real worker process with an OpenTelemetry SDK (the in-memory exporter) makes a
span per task attempt, child of the span that started the run (from the Client, the CLI's
TRACEPARENT or SQL), map tasks linked to it, failures recorded; the same worker serves
/metrics and /readyz on --metrics-port. Without the SDK nothing of OpenTelemetry is
imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider

from flowlane.runtime.client import Client
from flowlane.runtime.tracing import run_trace_parent
from tests.runtime.rt_support import WorkerProcess, applied_project, flowlane, wait_run, wait_until
from tests.runtime.test_metrics import free_port, get, wait_for

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: tr_flow
defaults: {max_attempts: 2, base_delay: 0, timeout: 5}
steps:
  split:
    handler: tr_handlers:split
  each:
    needs: [split]
    type: map
    handler: tr_handlers:each
"""

HANDLERS = """\
import atexit
import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)


@atexit.register
def _dump():
    with open(os.environ["FLOWLANE_TEST_SPANS"], "w") as out:
        json.dump([json.loads(s.to_json()) for s in EXPORTER.get_finished_spans()], out)


def split(input, ctx):
    return [1, 2]


def each(input, ctx):
    if input == 2 and ctx.attempt == 1:
        raise ValueError("two fails once")
    return input * 10
"""

SQL_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def project(tmp_path: Path, dsn: str) -> Path:
    return applied_project(tmp_path / "proj", dsn, FLOWS, {"tr_handlers": HANDLERS})


def _parent(span_context: Any) -> str:
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-01"


def _ids(traceparent: str) -> tuple[str, str]:
    _, trace_id, span_id, _ = traceparent.split("-")
    return f"0x{trace_id}", f"0x{span_id}"


def test_a_span_per_attempt_joins_the_trace_the_run_was_started_in(
        project: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tracer = TracerProvider().get_tracer("test")  # the test's own, not the global provider
    with tracer.start_as_current_span("request") as span, Client(dsn) as client:
        from_client = _parent(span.get_span_context())
        by_client = client.start("tr_flow", {}).run_id
    with tracer.start_as_current_span("shell") as span:
        from_cli = _parent(span.get_span_context())
    started = flowlane("start", "tr_flow", "--dsn", dsn, cwd=project,
                       extra_env={"TRACEPARENT": from_cli})
    assert started.returncode == 0, started.stderr
    by_cli = started.stdout.strip()
    with psycopg.connect(dsn) as conn:
        conn.execute("select set_config('flowlane.traceparent', %s, true)", (SQL_PARENT,))
        by_sql = str(conn.execute("select run_id from flowlane.start_flow('tr_flow', '{}')").fetchone()[0])
    with Client(dsn) as client:
        untraced = client.start("tr_flow", {}).run_id

    spans_file = tmp_path / "spans.json"
    monkeypatch.setenv("FLOWLANE_TEST_SPANS", str(spans_file))
    port = free_port()
    worker = WorkerProcess(dsn, tmp_path, "--flow", "tr_flow", "--metrics-port", str(port),
                           cwd=project)
    try:
        worker.wait_ready()
        for run in (by_client, by_cli, by_sql, untraced):
            assert wait_run(dsn, run, workers=[worker])["run"]["status"] == "completed"
        wait_for(f"http://127.0.0.1:{port}/readyz", lambda got: got == (200, "ready\n"), "ready")
        _, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert 'flowlane_tasks_failed_total{flow="tr_flow",step="each"} 4.0' in metrics
        assert 'flowlane_queue_depth{queue="tr_flow"} 0.0' in metrics
    finally:
        assert worker.stop() == 0, worker.text()
    spans = json.loads(wait_until(lambda: spans_file.exists() and spans_file.read_text(),
                                  message="the worker's spans"))

    def of(run: str) -> list[dict[str, Any]]:
        return sorted((s for s in spans if s["attributes"]["flowlane.run_id"] == run),
                      key=lambda s: (s["attributes"]["flowlane.step"], s["attributes"]["flowlane.task_index"],
                                     s["attributes"]["flowlane.attempt"]))

    for run, parent in ((by_client, from_client), (by_cli, from_cli), (by_sql, SQL_PARENT)):
        trace_id, span_id = _ids(parent)
        found = of(run)
        assert [(s["name"], s["attributes"]["flowlane.task_index"], s["attributes"]["flowlane.attempt"],
                 s["attributes"]["flowlane.outcome"]) for s in found] == [
            ("tr_flow.each", 0, 1, "completed"), ("tr_flow.each", 1, 1, "failed"),
            ("tr_flow.each", 1, 2, "completed"), ("tr_flow.split", 0, 1, "completed")]
        assert {(s["context"]["trace_id"], s["parent_id"]) for s in found} == {(trace_id, span_id)}
        assert all(s["kind"] == "SpanKind.CONSUMER" for s in found)
        assert all(s["attributes"]["messaging.destination.name"] == "tr_flow" for s in found)
        assert [[(link["context"]["span_id"], link["attributes"]["flowlane.map_index"])
                 for link in s["links"]] for s in found] == [
            [(span_id, 0)], [(span_id, 1)], [(span_id, 1)], []]
        failed = found[1]
        assert failed["status"]["status_code"] == "ERROR"
        [event] = failed["events"]
        assert event["name"] == "exception" and event["attributes"]["exception.type"] == "ValueError"
        assert "two fails once" in event["attributes"]["exception.message"]
    # started outside any trace: one trace of its own, whose id is the run id
    own_trace, own_parent = _ids(run_trace_parent(untraced))
    assert own_trace == f"0x{untraced.replace('-', '')}"
    assert {(s["context"]["trace_id"], s["parent_id"]) for s in of(untraced)} == {(own_trace, own_parent)}
    assert len(of(untraced)) == 4 and all(s["links"] == [] for s in of(untraced))


STEPS = """\
kind: flow
slug: tr_steps
queues: per-step
defaults: {base_delay: 0, timeout: 5}
steps:
  one:
    handler: tr_handlers:split
  two:
    needs: [one]
    handler: tr_handlers:split
"""


def _spans_written(path: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(
        wait_until(lambda: path.exists() and path.read_text(), message=f"spans in {path.name}"))
    return found


def test_a_run_started_outside_any_trace_is_one_trace_across_workers(
        tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    project = applied_project(tmp_path / "steps", dsn, STEPS, {"tr_handlers": HANDLERS})
    monkeypatch.delenv("TRACEPARENT", raising=False)
    with Client(dsn) as client:
        runs = [client.start("tr_steps", {}).run_id for _ in range(2)]
    files = {step: tmp_path / f"spans-{step}.json" for step in ("one", "two")}
    workers = []
    for step, spans_file in files.items():  # a worker process per step, each its own exporter
        monkeypatch.setenv("FLOWLANE_TEST_SPANS", str(spans_file))
        workers.append(WorkerProcess(dsn, tmp_path, "--flow", "tr_steps", "--step", step,
                                     cwd=project).wait_ready())
    try:
        for run in runs:
            assert wait_run(dsn, run, workers=workers)["run"]["status"] == "completed"
    finally:
        assert [w.stop() for w in workers] == [0, 0]
    spans = {step: _spans_written(f) for step, f in files.items()}
    for run in runs:
        by_step = {step: [s for s in found if s["attributes"]["flowlane.run_id"] == run]
                   for step, found in spans.items()}
        assert [len(by_step["one"]), len(by_step["two"])] == [1, 1]
        [one], [two] = by_step["one"], by_step["two"]
        assert one["context"]["trace_id"] == two["context"]["trace_id"]
        assert one["context"]["trace_id"] == f"0x{run.replace('-', '')}"
        assert one["parent_id"] == two["parent_id"] == _ids(run_trace_parent(run))[1]
    assert len({s["context"]["trace_id"] for found in spans.values() for s in found}) == 2  # a run, a trace


def test_without_the_extra_nothing_of_opentelemetry_is_imported() -> None:
    code = ("import sys; sys.modules['opentelemetry'] = None  # as if not installed\n"
            "import flowlane.runtime.worker, flowlane.runtime.client, flowlane.runtime.tracing as t\n"
            "assert t.Tracing.configured() is None and t.current_traceparent() is None\n"
            "print(sorted(m for m, v in sys.modules.items() if m.startswith('opentelemetry') and v))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                           env={"PATH": "/usr/bin:/bin"})
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"


def test_a_malformed_trace_context_is_refused(conn: psycopg.Connection[Any]) -> None:
    conn.execute("select flowlane.create_flow('traced')")
    conn.execute("select flowlane.add_step('traced', 'one')")
    with conn.transaction():
        conn.execute("select set_config('flowlane.traceparent', 'not-a-context', true)")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="must be a W3C traceparent"):
            conn.execute("select flowlane.start_flow('traced', '{}')")
