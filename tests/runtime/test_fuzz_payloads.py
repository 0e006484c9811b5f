"""Fuzzing what reaches the engine at run time: run inputs given to `start_flow` and handler
outputs returned to a real worker. The outcome is always a run, a flowlane error or a failed
task; never another exception, a hang or a crashed worker."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowlane import errors
from flowlane.runtime.client import Client
from tests.runtime.rt_support import WorkerProcess, start_run, wait_run

pytestmark = pytest.mark.slow

Spawn = Callable[..., WorkerProcess]
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=30),
    st.binary(max_size=4), st.just("\x00"), st.just("\ud800"),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4),
    st.sets(st.integers(), max_size=2)), max_leaves=12)


def nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def json_depth(value: Any) -> int:
    """Nesting of arrays/objects (a scalar is 0), without recursion (values nest 5,000 deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (
                item.values() if isinstance(item, dict) else item))
    return deepest


@SETTINGS
@given(value=VALUES, depth=st.sampled_from([0, 1, 99, 150, 5000]),
       blob=st.sampled_from([0, 1_000_000]))
def test_any_run_input_starts_a_run_or_is_refused_with_a_flowlane_error(
    flows_dsn: str, value: Any, depth: int, blob: int
) -> None:
    payload = nest({"v": value, "blob": "x" * blob}, depth)
    with Client(flows_dsn) as client:
        try:
            run_id = client.start("rt_fuzz_output", payload).run_id
        except errors.FlowlaneError as exc:
            assert str(exc)
            return
    with psycopg.connect(flows_dsn, autocommit=True) as conn:  # jsonb equality: 1e16 == 10^16
        same = conn.execute("select input = %s::jsonb from flowlane.runs where run_id = %s",
                            (json.dumps(payload), run_id)).fetchone()
    assert same == (True,)
    assert json_depth(payload) <= 100


RECIPES = st.fixed_dictionaries({
    "text": st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                    max_size=20),
    "repeat": st.sampled_from([0, 1, 1000, 200_000]),
    "special": st.sampled_from(["none", "nan", "inf", "nul", "surrogate", "bytes"]),
    "depth": st.sampled_from([0, 5, 98, 99, 100, 400, 5000]),
})


def test_any_handler_output_completes_or_fails_its_task_and_the_worker_survives(
    flows_dsn: str, spawn: Spawn
) -> None:
    worker = spawn("--flow", "rt_fuzz_output", "--log-level", "INFO")

    @SETTINGS
    @given(recipe=RECIPES)
    def check(recipe: dict[str, Any]) -> None:
        run_id = start_run(flows_dsn, "rt_fuzz_output", recipe)
        state = wait_run(flows_dsn, run_id, timeout=60, workers=[worker])
        expected: Any = [recipe["text"] * recipe["repeat"], None]  # rt_handlers.fuzz_value
        for _ in range(recipe["depth"]):
            expected = {"d": expected}
        representable = recipe["special"] == "none" and json_depth(expected) <= 100
        if representable:
            assert state["run"]["status"] == "completed", state["run"]
            assert state["run"]["output"] == {"echo": expected}
        else:
            assert state["run"]["status"] == "failed"
            assert state["run"]["error_message"].strip()

    check()
    assert worker.proc.poll() is None
    assert "Traceback" not in worker.text()


def test_nan_is_refused_before_it_reaches_the_database(flows_dsn: str) -> None:
    with Client(flows_dsn) as client, pytest.raises(errors.UsageError, match="not JSON"):
        client.start("rt_fuzz_output", {"x": math.nan})
