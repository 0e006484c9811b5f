"""Metrics and probes: a real Prometheus (Debian's package) scrapes a running
``flowlane serve --metrics-port`` and the values are read back through its HTTP API; the
readiness probe names a disabled deployment until it is enabled."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.runtime.rt_support import applied_project, env, flowlane, start_run, wait_run, wait_until

pytestmark = pytest.mark.slow

FLOWS = """\
kind: flow
slug: mx_work
defaults: {max_attempts: 1, timeout: 5}
steps:
  a:
    handler: mx_handlers:work
---
kind: flow
slug: mx_later
defaults: {timeout: 5}
steps:
  a:
    handler: mx_handlers:work
    start_delay: 3600
"""

HANDLERS = """\
def work(input, ctx):
    if input.get("fail"):
        raise ValueError("asked to fail")
    return {"ok": True}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def wait_for(url: str, wanted: Callable[[tuple[int, str]], bool], what: str) -> tuple[int, str]:
    """GET ``url`` until the (status, text) is ``wanted``; that answer."""
    def answer() -> tuple[int, str] | None:
        got = get(url)
        return got if wanted(got) else None

    return wait_until(answer, timeout=60, interval=0.1, message=what)


@pytest.fixture
def project(tmp_path: Path, dsn: str) -> Path:
    return applied_project(tmp_path / "proj", dsn, FLOWS, {"mx_handlers": HANDLERS})


@pytest.fixture
def served(project: Path, dsn: str, tmp_path: Path) -> Iterator[str]:
    """``flowlane serve --metrics-port``; yields the endpoint's base URL."""
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowlane", "serve", "--dsn", dsn, "--shutdown-timeout", "5",
             "--metrics-port", str(port)],
            cwd=project, env=env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture
def prometheus(served: str, tmp_path: Path) -> Iterator[str]:
    """A Prometheus server scraping ``served`` every second; yields its base URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: run `sh tools/install-prometheus.sh`"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "flowlane",
                            "static_configs": [{"targets": [served.removeprefix("http://")]}]}],
    }))
    with (tmp_path / "prometheus.log").open("wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get(f"{url}/-/ready")[0] == 200, timeout=60, interval=0.2,
                   message="prometheus to be ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def scraped(prometheus: str, expression: str) -> dict[str, float]:
    """The instant vector of ``expression`` from Prometheus: {label values: value}."""
    status, body = get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expression}))
    assert status == 200, body
    return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())
                     if k not in ("__name__", "instance", "job")): float(r["value"][1])
            for r in json.loads(body)["data"]["result"]}


def test_prometheus_scrapes_serve_and_readiness_follows_the_deployments(
        project: Path, dsn: str, served: str, prometheus: str) -> None:
    wait_for(f"{served}/healthz", lambda got: got == (200, "ok\n"), "the metrics endpoint")
    wait_for(f"{served}/readyz", lambda got: got == (200, "ready\n"), "both workers to register")
    wait_for(f"{served}/metrics", lambda got: "flowlane_run_durations_listening 1.0" in got[1],
             "serve to listen for runs that end")
    runs = [start_run(dsn, "mx_work", payload) for payload in ({}, {}, {"fail": True})]
    start_run(dsn, "mx_later", {})  # its task waits an hour on the queue
    assert [wait_run(dsn, r)["run"]["status"] for r in runs] == ["completed", "completed", "failed"]
    disabled = flowlane("worker", "disable", "mx_later", "--reason", "held back", "--dsn", dsn,
                        cwd=project)
    assert disabled.returncode == 0, disabled.stderr
    _, text = wait_for(f"{served}/readyz", lambda got: got[0] == 503, "serve to be unready")
    assert text == "queue mx_later: a deployment is disabled (`flowlane worker list`)\n"

    expected = {
        'sum by (flow, step) (flowlane_tasks_started_total{flow="mx_work"})': {"flow=mx_work,step=a": 3},
        'sum by (flow, step) (flowlane_tasks_completed_total{flow="mx_work"})': {"flow=mx_work,step=a": 2},
        'sum by (flow, step) (flowlane_tasks_failed_total{flow="mx_work"})': {"flow=mx_work,step=a": 1},
        'sum by (flow) (flowlane_handler_duration_seconds_count{flow="mx_work"})': {"flow=mx_work": 3},
        'sum by (flow, status) (flowlane_run_duration_seconds_count{flow="mx_work"})': {
            "flow=mx_work,status=completed": 2, "flow=mx_work,status=failed": 1},
        "flowlane_queue_depth": {"queue=mx_later": 1, "queue=mx_work": 0},
        "flowlane_disabled_deployments": {"queue=mx_later": 1, "queue=mx_work": 0},
        "flowlane_live_workers": {"queue=mx_later": 1, "queue=mx_work": 1},
        "flowlane_database_up": {"": 1},
    }

    def all_scraped() -> dict[str, dict[str, float]] | None:
        found = {expression: scraped(prometheus, expression) for expression in expected}
        return found if found == expected else None

    wait_until(all_scraped, timeout=60, interval=0.5, message="the values in Prometheus")
    assert scraped(prometheus, "flowlane_metrics_query_seconds")[""] > 0
    assert scraped(prometheus, "flowlane_queue_oldest_message_age_seconds")["queue=mx_later"] >= 0

    assert flowlane("worker", "enable", "mx_later", "--dsn", dsn, cwd=project).returncode == 0
    wait_for(f"{served}/readyz", lambda got: got == (200, "ready\n"), "serve to be ready again")
    assert get(f"{served}/nothing")[0] == 404
