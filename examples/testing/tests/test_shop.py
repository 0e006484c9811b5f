"""The shop's flows on the real engine and worker (flowlane's pytest plugin): retries, a signal,
a deadline and a nightly schedule, with the test's clock instead of waiting."""

from __future__ import annotations

from flowlane.testing import FlowTest

ORDER = {"order": "A-1", "price": 5}


def test_an_order_is_priced_line_by_line_and_shipped(flowlane_test: FlowTest) -> None:
    run = flowlane_test.run("orders", ORDER)
    assert run.status == "completed"
    assert run.step("price").output == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert run.output == {"ship": {"shipped": 550}}


def test_shipping_is_retried_until_it_succeeds(flowlane_test: FlowTest) -> None:
    shipping = flowlane_test.fail("orders", "ship", times=2)  # then the real handler
    run = flowlane_test.run("orders", ORDER)
    assert run.status == "started"  # the first retry waits 10 s
    flowlane_test.advance(seconds=10)
    flowlane_test.advance(seconds=20)  # the second retry's delay, counted from the first
    done = flowlane_test.result(run.run_id)
    assert (done.status, done.step("ship").attempts, shipping.calls) == ("completed", 3, 3)


def test_a_refused_order_fails_after_its_attempts(flowlane_test: FlowTest) -> None:
    charge = flowlane_test.fake("orders", "ship")
    run = flowlane_test.run("orders", {"order": "A-2", "price": -1})
    flowlane_test.advance(minutes=1)
    flowlane_test.advance(minutes=1)
    failed = flowlane_test.result(run.run_id)
    assert failed.status == "failed" and "never negative" in (failed.error or "")
    assert charge.calls == []  # nothing shipped


def test_an_approval_signal_lets_the_request_go_on(flowlane_test: FlowTest) -> None:
    run = flowlane_test.run("approval", {"who": "ann"})
    assert run.step("approve").status == "started"  # waiting for the signal
    approved = flowlane_test.signal(run.run_id, "approve", {"by": "bob"})
    assert approved.status == "completed"
    assert approved.step("notify").output == {"approved_by": "bob"}


def test_an_unanswered_approval_times_out_after_a_day(flowlane_test: FlowTest) -> None:
    run = flowlane_test.run("approval", {"who": "ann"})
    flowlane_test.advance(days=1)
    assert flowlane_test.result(run.run_id).status == "failed"


def test_a_quote_not_accepted_within_the_hour_fails(flowlane_test: FlowTest) -> None:
    run = flowlane_test.run("quote")
    flowlane_test.advance(minutes=59)
    assert flowlane_test.result(run.run_id).status == "started"
    flowlane_test.advance(minutes=1)  # the hour is over
    failed = flowlane_test.result(run.run_id)
    assert failed.status == "failed" and "deadline exceeded" in (failed.error or "")


def test_the_nightly_report_runs_once_a_day(flowlane_test: FlowTest) -> None:
    assert flowlane_test.runs("report") == []
    flowlane_test.advance(days=1)  # past the next 03:00 UTC
    [report] = flowlane_test.runs("report")
    assert report.status == "completed" and report.output == {"build": {"built": True}}
    flowlane_test.advance(days=1)
    assert len(flowlane_test.runs("report")) == 2
