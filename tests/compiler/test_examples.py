"""Every example in flows/ compiles, and the committed sql/ is what the compiler produces."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from flowlane import compiler, load_project
from flowlane.compiler import check

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "flows").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_file_compiles(example: Path) -> None:
    project = compiler.load_project([example])
    files = compiler.compile_project(project)
    assert {f"flows/{f.slug}.sql" for f in project.flows} <= set(files)


def test_committed_example_sql_is_up_to_date(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    files = compiler.compile_project(compiler.load_project(["flows"]))
    assert check.stale_files(files, Path("sql")) == []


def test_every_example_handler_is_importable() -> None:
    project = load_project(ROOT / "flows")
    for ref in project.handlers():
        module = importlib.import_module(ref.handler.partition(":")[0])
        assert callable(getattr(module, ref.handler.partition(":")[2])), ref


def test_the_flow_control_example_compiles_and_its_handlers_import() -> None:
    project = load_project(ROOT / "examples" / "flow_control")
    assert [q.name for q in project.queue_limits] == ["deliver_slack_alerts"]
    assert "queues.sql" in compiler.compile_project(project)
    for ref in project.handlers():
        module = importlib.import_module(ref.handler.partition(":")[0])
        assert callable(getattr(module, ref.handler.partition(":")[2])), ref


def test_the_events_example_compiles_and_its_handlers_import() -> None:
    project = load_project(ROOT / "examples" / "events")
    assert [t.name for t in project.triggers] == ["order_paid"]
    assert [w.name for w in project.webhooks] == ["order_placed", "payment_received"]
    assert "triggers.sql" in compiler.compile_project(project)
    for ref in project.handlers():
        module = importlib.import_module(ref.handler.partition(":")[0])
        assert callable(getattr(module, ref.handler.partition(":")[2])), ref
