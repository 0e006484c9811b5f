"""The hello flow on the real engine: flowlane's pytest plugin (installed with flowlane) gives
each test a fresh database with the project's compiled SQL and runs the handlers in-process.
See docs/testing.md of flowlane: replace handlers, make them fail, signal, move the clock."""

from __future__ import annotations

from flowlane.testing import FlowTest


def test_hello_greets_by_name(flowlane_test: FlowTest) -> None:
    run = flowlane_test.run("hello", {"name": "Ada"})
    assert run.status == "completed"
    assert run.output == {"greet": {"greeting": "Hello, Ada!"}}


def test_a_failing_greeting_is_retried(flowlane_test: FlowTest) -> None:
    failing = flowlane_test.fail("hello", "greet", times=1)
    run = flowlane_test.run("hello", {"name": "Ada"})
    assert run.status == "started"  # the retry waits for its delay
    flowlane_test.advance(minutes=1)  # the test's clock: no sleeping
    assert flowlane_test.result(run.run_id).status == "completed"
    assert failing.calls == 2
