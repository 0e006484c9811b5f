"""``Client`` and ``AsyncClient`` are one API: the same public methods with the same signatures
and docstrings, and, run against a real database both ways, the same results and the same
errors (type, message, hint), a bad connection string included."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from flowlane import errors
from flowlane.runtime.client import AsyncClient, Client, Operations, RunChange, RunTimeout
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

OPERATIONS = sorted(name for name in vars(Operations) if not name.startswith("_"))
# what each client does its own way: entering and leaving a `with` block
OWN = {Client: {"__enter__", "__exit__"}, AsyncClient: {"__aenter__", "__aexit__"}}
MISSING = str(uuid.UUID(int=1))


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_both_clients_offer_every_operation_and_nothing_else() -> None:
    assert len(OPERATIONS) >= 10
    assert _public(Client) == _public(AsyncClient) == {*OPERATIONS, "close"}
    for cls in (Client, AsyncClient):
        assert OWN[cls] <= set(vars(cls))


@pytest.mark.parametrize("name", [*OPERATIONS, "close", "__init__"])
def test_each_method_has_one_signature_and_docstring(name: str) -> None:
    sync, async_ = getattr(Client, name), getattr(AsyncClient, name)
    assert inspect.signature(sync) == inspect.signature(async_)
    assert sync.__doc__ == async_.__doc__
    assert name == "__init__" or sync.__doc__
    assert not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(async_) == (name != "__init__")
    if name in OPERATIONS:  # the plan's parameters, written out: names, kinds, defaults, types
        plan, method = inspect.signature(getattr(Operations, name)), inspect.signature(sync)
        assert list(method.parameters.values())[1:] == list(plan.parameters.values())
        assert plan.return_annotation == f"Plan[{method.return_annotation}]"


# -- the same calls, both ways, on a real database ----------------------------------------


Outcome = tuple[str, Any]


def _outcome(call: Callable[[], Any]) -> Outcome:
    try:
        return "ok", call()
    except errors.FlowlaneError as exc:
        return type(exc).__name__, (str(exc), exc.hint, getattr(exc, "sqlstate", None))
    except TypeError as exc:  # wrong arguments: Python's own message, which names the class
        return "TypeError", str(exc).replace("AsyncClient.", "Client.")


class Both:
    """One ``Client`` and one ``AsyncClient`` on the same database, called alike."""

    def __init__(self, dsn: str) -> None:
        self.sync, self.async_ = Client(dsn), AsyncClient(dsn)
        self.loop = asyncio.new_event_loop()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Outcome, Outcome]:
        sync = _outcome(lambda: getattr(self.sync, name)(*args, **kwargs))
        async_ = _outcome(
            lambda: self.loop.run_until_complete(getattr(self.async_, name)(*args, **kwargs)))
        return sync, async_

    def same(self, name: str, *args: Any, **kwargs: Any) -> Outcome:
        sync, async_ = self.call(name, *args, **kwargs)
        assert sync == async_, name
        return sync

    def close(self) -> None:
        self.sync.close()
        self.loop.run_until_complete(self.async_.close())
        self.loop.close()


@pytest.fixture
def both(flows_dsn: str) -> Iterator[Both]:
    pair = Both(flows_dsn)
    yield pair
    pair.close()


def _failed_runs(dsn: str, count: int) -> list[str]:
    """Runs of rt_exhaust_fail (two attempts) failed through the SQL Core, no worker needed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        runs = [engine.start("rt_exhaust_fail", {}) for _ in range(count)]
        for _attempt in range(2):
            engine.make_visible("rt_exhaust_fail")
            for task in engine.claim("rt_exhaust_fail"):
                engine.fail(task)
        assert {engine.run(r)["status"] for r in runs} == {"failed"}
    return [str(r) for r in runs]


def _without_ids(change: RunChange) -> RunChange:
    return dataclasses.replace(change, run_id="")


def test_every_operation_answers_alike_both_ways(both: Both, flows_dsn: str) -> None:
    started = both.sync.start("rt_noop", {"n": 1}).run_id
    cancelled = both.sync.start("rt_noop", {"n": 2}).run_id
    both.sync.cancel(cancelled, reason="parity")

    # reads of the same state: equal results
    assert both.same("get_run", started)[1].run.status == "started"
    assert both.same("wait", cancelled, timeout=5)[1].run.status == "cancelled"
    assert both.same("cancel", cancelled, reason="again")[1].status == "cancelled"
    assert both.same("flows_named", "rt_versioned")[1] == ["rt_versioned_v1", "rt_versioned_v2"]
    listed = both.same("list_runs", flow="rt_noop", limit=5)[1]
    assert [r.run_id for r in listed] == [cancelled, started]
    assert both.same("list_runs", before=cancelled, status="started")[1][0].run_id == started
    assert both.same("stuck_runs") == ("ok", [])

    # refusals: the same error, message and hint
    for name, args, kwargs, expected in [
        ("start", ("no_such_flow", {}), {}, "DatabaseError"),
        ("start", ("rt_noop", {"x": float("nan")}), {}, "UsageError"),
        ("start", ("rt_noop", {}), {"run_id": started}, "InputRefused"),  # the id names a run
        ("start_run", ("rt_noop",), {"run_id": "nonsense"}, "UsageError"),
        ("start_runs", ("rt_noop", [{}, {}, {"x": float("inf")}]), {"chunk_size": 2}, "UsageError"),
        ("start_runs", ("rt_noop", [{}]), {"chunk_size": 0}, "UsageError"),
        ("start_runs", ("no_such_flow", [{}, {}, {}]), {"chunk_size": 2}, "DatabaseError"),
        ("cancel", (MISSING,), {}, "NotFound"),
        ("retry", (started,), {}, "FlowlaneError"),  # not failed
        ("retry", (MISSING,), {}, "NotFound"),
        ("get_run", (MISSING,), {}, "NotFound"),
        ("flows_named", ("rt_noo",), {}, "NotFound"),
        ("list_runs", (), {"status": "sleeping"}, "UsageError"),
        ("list_runs", (), {"before": MISSING}, "NotFound"),
        ("list_runs", (), {"limit": -1}, "UsageError"),
        ("wait", (started,), {"timeout": 0}, "RunTimeout"),
        ("get_run", (), {}, "TypeError"),
        ("cancel", (started, "positional reason"), {}, "TypeError"),
    ]:
        kind, _detail = both.same(name, *args, **kwargs)
        assert kind == expected, (name, args, kwargs, _detail)
    with pytest.raises(RunTimeout) as late:  # what the run was doing, as data
        both.sync.wait(started, timeout=0)
    assert (late.value.run_id, late.value.status, late.value.timeout) == (started, "started", 0)

    # writes: each way changes its own run, and the answers differ only in ids and times
    first, second = _failed_runs(flows_dsn, 2)
    sync, async_ = both.sync.retry(first), both.loop.run_until_complete(both.async_.retry(second))
    assert _without_ids(sync) == _without_ids(async_) and sync.status == "started"
    (kind, started), (kind_async, started_async) = both.call("start", "rt_versioned", {})
    assert (kind, started.flow_slug) == (kind_async, started_async.flow_slug) == ("ok", "rt_versioned_v2")
    assert started.run_id != started_async.run_id and not started.existed and not started_async.existed
    sync_ids, async_ids = (outcome[1] for outcome in both.call("start_runs", "rt_noop", [{}] * 3))
    assert len(sync_ids) == len(async_ids) == 3 and not set(sync_ids) & set(async_ids)
    kinds = [kind for kind, _ in both.call("start_run", "rt_noop", None)]
    assert kinds == ["ok", "ok"]


@pytest.mark.parametrize("dsn", [
    "this is not a dsn",
    "postgresql://flowlane:secret@127.0.0.1:1/nothing?connect_timeout=2",  # nothing listens
])
def test_a_bad_dsn_is_the_same_error_both_ways(dsn: str) -> None:
    pair = Both(dsn)
    try:
        for name, args in [("list_runs", ()), ("get_run", (MISSING,)), ("wait", (MISSING,)),
                           ("start_runs", ("rt_noop", [{}]))]:
            kind, (message, hint, _sqlstate) = pair.same(name, *args)
            assert kind in {"UsageError", "DatabaseUnavailable"}, message
            assert "secret" not in message and hint
    finally:
        pair.close()

