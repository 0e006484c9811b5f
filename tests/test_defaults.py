"""Each default once: ``flowlane.defaults`` is what the compiler, the JSON Schema, ``WorkerConfig``
and the docs state, and a worker gets the same limits whichever way it is started
(tests/runtime/test_serve.py runs ``flowlane serve`` for real)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from flowlane import defaults
from flowlane.cli import build_parser
from flowlane.cli.worker import worker_config
from flowlane.compiler import api, schema
from flowlane.compiler.model import Flow, WorkerDoc
from flowlane.runtime.config import WorkerConfig
from flowlane.runtime.worker import Worker
from tests.docs_support import prose

ROOT = Path(__file__).resolve().parents[1]
LIMITS = (defaults.MAX_CONCURRENT, defaults.BATCH_SIZE)

PROJECT = """\
kind: flow
slug: plain
steps:
  work: {handler: "json:dumps"}
---
kind: flow
slug: shared
queues: {work: shared_q}
steps:
  work: {handler: "json:dumps"}
---
kind: worker
name: shared_worker
queue: shared_q
flows: [shared]
"""


def _schema_defaults(node: Any, path: str = "") -> dict[str, Any]:
    """``path -> default`` for every ``default`` keyword in the schema."""
    found: dict[str, Any] = {}
    if isinstance(node, dict):
        if "default" in node:
            found[path] = node["default"]
        for key, value in node.items():
            found.update(_schema_defaults(value, f"{path}/{key}"))
    return found


def _descriptions(node: Any) -> list[tuple[str, Any]]:
    """``(description, the default beside it)`` for every description in the schema."""
    if not isinstance(node, dict):
        return []
    text = node.get("description")  # a dict here is the schema of a `description` property
    here = [(text, node.get("default"))] if isinstance(text, str) else []
    return here + [item for value in node.values() for item in _descriptions(value)]


def test_the_schema_states_the_defaults_of_flowlane_defaults() -> None:
    expected = {**defaults.FLOW, **defaults.WORKER_LIMITS}
    stated = {path: value for path, value in _schema_defaults(schema.schema()).items()
              if path.rsplit("/", 1)[-1] in expected}
    assert {path.rsplit("/", 1)[-1] for path in stated} == set(expected)
    assert {path: expected[path.rsplit("/", 1)[-1]] for path in stated} == stated
    quoted = [(text, given) for text, given in _descriptions(schema.schema())
              if re.search(r"\bdefault \d", text)]
    assert len(quoted) == 2  # max_concurrent and batch_size
    for text, given in quoted:
        assert re.search(rf"\bdefault {given}\b", text), text


def test_the_model_and_worker_config_take_their_defaults_from_flowlane_defaults() -> None:
    flow = {f.name: f.default for f in dataclasses.fields(Flow)}
    assert {k: flow[k] for k in defaults.FLOW} == defaults.FLOW
    document = {f.name: f.default for f in dataclasses.fields(WorkerDoc)}
    assert {k: document[k] for k in defaults.WORKER_LIMITS} == defaults.WORKER_LIMITS
    config = WorkerConfig()
    assert (config.poll_interval, config.read_vt, config.shutdown_timeout,
            config.heartbeat_interval, config.requeue_interval) == (
        defaults.POLL_INTERVAL, defaults.READ_VT, defaults.SHUTDOWN_TIMEOUT,
        defaults.HEARTBEAT_INTERVAL, defaults.REQUEUE_INTERVAL)
    assert config.limits(None) == LIMITS


def test_a_flow_without_options_compiles_with_the_flow_defaults() -> None:
    project = api.project_from_text(PROJECT)
    plain = project.flow("plain")
    assert (plain.max_attempts, plain.base_delay, plain.timeout) == tuple(defaults.FLOW.values())
    sql = api.compile_project(project)["flows/plain.sql"]
    for option, value in defaults.FLOW.items():
        assert f"  {option} => {value},\n" in sql


def _project(tmp_path: Path) -> Path:
    (tmp_path / "flows.yaml").write_text(PROJECT)
    return tmp_path / "flows.yaml"


def _cli(*argv: str) -> WorkerConfig:
    return worker_config(build_parser().parse_args(list(argv)))


def _started_ways(path: Path) -> dict[str, Worker]:
    """A worker of each way of starting one, for the queue with a document without limits
    and the queue without a document (`serve` starts `flowlane worker --name D` for the
    one and `--queue Q` for the other: tests/runtime/test_serve.py reads what they serve)."""
    project = api.load_project(path)
    return {
        "document": Worker(project, name="shared_worker"),
        "document via the command": Worker(project, _cli("worker", "--name", "shared_worker")),
        "python": Worker(project, queue="plain"),
        "python config": Worker(project, WorkerConfig(queue="plain")),
        "command": Worker(project, _cli("worker", "--queue", "plain")),
    }


def test_every_way_of_starting_a_worker_gets_the_same_measured_limits(tmp_path: Path) -> None:
    path = _project(tmp_path)
    assert [(w.max_concurrent, w.batch_size) for w in api.load_project(path).workers] == [LIMITS]
    for way, worker in _started_ways(path).items():
        assert (worker.max_concurrent, worker.batch_size) == LIMITS, way
        assert (worker.config.max_concurrent, worker.config.batch_size) == LIMITS, way
        assert worker._min_read == defaults.claim_threshold(*LIMITS) == 25, way


@pytest.mark.parametrize("given", [["--max-concurrent", "7"], ["--batch-size", "7"]])
def test_a_limit_given_on_the_command_line_still_wins(tmp_path: Path, given: list[str]) -> None:
    project = api.load_project(_project(tmp_path))
    worker = Worker(project, _cli("worker", "--name", "shared_worker", *given))
    assert 7 in (worker.max_concurrent, worker.batch_size)
    assert {worker.max_concurrent, worker.batch_size} <= {7, *LIMITS}


def test_the_claim_threshold_is_a_quarter_of_a_batch_of_slots_and_at_least_one() -> None:
    assert defaults.claim_threshold(200, 100) == 25
    assert defaults.claim_threshold(8, 100) == 2
    assert defaults.claim_threshold(2, 100) == 1


def _stated(pattern: str, text: str) -> list[tuple[str, float]]:
    """``(name in flowlane.defaults, number)`` of every match of ``pattern`` (an option name
    or flag and a number) in ``text``."""
    return [(option.strip("-").replace("-", "_").upper(), float(value))
            for option, value in re.findall(pattern, text)]


def test_the_docs_state_the_defaults_of_flowlane_defaults() -> None:
    runtime = prose(ROOT / "docs" / "runtime.md")
    seconds = _stated(r"`(\w+)` \((\d+(?:\.\d+)?) s\)", runtime)  # `poll_interval` (2 s)
    flags = _stated(r"`(--[\w-]+)`, default (\d+)", runtime)  # `--batch-size`, default 100
    limits = _stated(r"`(\w+)` (\d+) and", runtime) + _stated(r"and `(\w+)` (\d+)", runtime)
    assert {name for name, _ in seconds} == {
        "POLL_INTERVAL", "READ_VT", "SHUTDOWN_TIMEOUT", "HEARTBEAT_INTERVAL", "REQUEUE_INTERVAL"}
    assert {name for name, _ in flags} == {name for name, _ in limits} == {
        "MAX_CONCURRENT", "BATCH_SIZE"}
    for name, value in seconds + flags + limits:
        assert value == getattr(defaults, name), name
    # a worker document without limits: "else 200 and 100"
    assert [tuple(map(int, pair)) for pair in re.findall(r"else (\d+) and (\d+)", runtime)] == [LIMITS]
