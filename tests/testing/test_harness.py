"""The plugin's FlowTest on the real engine and worker: runs, handlers replaced, the clock."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from flowlane.errors import FlowlaneError
from flowlane.testing.harness import FlowTest

pytestmark = pytest.mark.slow

ORDER = {"order": "A-1", "price": 5}


def test_a_five_step_flow_with_a_map_of_ten_completes(flows: FlowTest) -> None:
    began = time.perf_counter()
    run = flows.run("orders", ORDER)
    print(f"orders (5 steps, a map of 10): {1000 * (time.perf_counter() - began):.0f} ms")
    assert run.status == "completed"
    assert run.step("price").output == [10 * n for n in range(1, 11)]
    assert run.output == {"ship": {"shipped": 550}}


def test_a_replaced_handler_records_its_calls(flows: FlowTest) -> None:
    shipping = flows.fake("orders", "ship", returns={"shipped": "by the fake"})
    run = flows.run("orders", ORDER)
    assert run.output == {"ship": {"shipped": "by the fake"}}
    assert shipping.calls == [{"total": 550}]


def test_a_handler_that_raises_fails_its_step(flows: FlowTest) -> None:
    run = flows.run("orders", {"order": "A-2", "price": -1})
    assert run.status == "started"  # its retry waits for its delay
    flows.advance(minutes=10)  # a jump: the second retry's delay counts from the new time
    assert flows.result(run.run_id).status == "started"
    flows.advance(minutes=10)
    failed = flows.result(run.run_id)
    assert failed.status == "failed" and failed.step("validate").attempts == 3
    assert "never negative" in (failed.error or "")


def test_a_retry_waits_for_its_delay_on_the_test_clock(flows: FlowTest) -> None:
    failing = flows.fail("orders", "ship", times=2)
    run = flows.run("orders", ORDER)
    assert (run.status, failing.calls) == ("started", 1)  # the retry is 10 s away
    flows.advance(seconds=9)
    assert failing.calls == 1
    flows.advance(seconds=1)
    assert failing.calls == 2
    flows.advance(seconds=20)  # the second retry's delay
    done = flows.result(run.run_id)
    assert (done.status, failing.calls, done.step("ship").attempts) == ("completed", 3, 3)


def test_the_clock_moves_forward_only(flows: FlowTest) -> None:
    before = flows.now()
    flows.advance(hours=2)
    assert (flows.now() - before).total_seconds() >= 7200
    with pytest.raises(FlowlaneError, match="moves forward only"):
        flows.advance(seconds=-1)


def test_a_delayed_start_begins_when_the_clock_reaches_it(flows: FlowTest) -> None:
    run_id = flows.start("orders", ORDER, start_at=timedelta(hours=2))
    flows.run_until_idle()
    assert flows.result(run_id).status == "waiting"
    flows.advance(hours=2)
    assert flows.result(run_id).status == "completed"
