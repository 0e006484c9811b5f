"""Every example in flows/ compiles, and the committed sql/ is what the compiler produces."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from flowlane import compiler, load_project
from flowlane.compiler import check
from flowlane.compiler.model import StepCache

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
    assert project.flow("slack_alerts").steps[0].cache == StepCache(3600, ("/customer_id",))
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


def test_the_failure_handler_example_compiles_and_its_handlers_import() -> None:
    project = load_project(ROOT / "examples" / "failure_handler")
    orders = project.flow("orders")
    assert (orders.on_failure, orders.on_failure_on_cancel) == ("order_failed", True)
    assert [(s.slug, s.compensate) for s in orders.steps] == [
        ("reserve", "release_stock"), ("charge", "refund_payment"), ("ship", None)]
    assert "compensate => 'refund_payment'" in compiler.compile_project(project)["flows/orders.sql"]
    for ref in project.handlers():
        module = importlib.import_module(ref.handler.partition(":")[0])
        assert callable(getattr(module, ref.handler.partition(":")[2])), ref
    from examples.handlers import failing_orders as handlers

    ctx = SimpleNamespace(log=logging.getLogger("example"))
    told = handlers.notify({"run_id": "r", "flow": "orders", "status": "failed", "error": "no courier",
                            "failed_step": "ship", "step_error": "no courier", "input": {"order_id": 7},
                            "outputs": {"reserve": {}, "charge": {}}}, ctx)
    assert told == {"told": 7, "completed": ["charge", "reserve"]}
    undo = {"run_id": "r", "flow": "orders", "step": "charge", "input": {"reserve": {}},
            "output": {"payment": "P-7", "amount": 20}}
    assert handlers.refund(undo, ctx) == {"refunded": "P-7", "amount": 20}
