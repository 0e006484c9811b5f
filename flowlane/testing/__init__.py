"""Test a project's flows with pytest: the real engine and worker, a clock the test moves.

Installing flowlane loads the pytest plugin (:mod:`flowlane.testing.plugin`), whose fixture
``flowlane_test`` is a :class:`FlowTest`; docs/testing.md shows how to use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowlane import _lazy

if TYPE_CHECKING:
    from flowlane.testing.harness import Failing, FlowTest, Recorder, RunResult, StepResult, TestServer

__all__ = ["Failing", "FlowTest", "Recorder", "RunResult", "StepResult", "TestServer"]

# pytest loads the plugin in every session of an environment with flowlane installed: the
# harness (psycopg, the worker) loads only when a test asks for it
__getattr__ = _lazy.exports(__name__, {
    "flowlane.testing.harness": ("Failing", "FlowTest", "Recorder", "RunResult", "StepResult", "TestServer"),
})
