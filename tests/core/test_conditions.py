"""Conditions (if / unless, when_unmet modes, cascades) and empty maps."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("pattern_field", "pattern", "input", "runs"),
    [
        ("required_input_pattern", {"go": True}, {"go": True, "x": 1}, True),
        ("required_input_pattern", {"go": True}, {"go": False}, False),
        ("required_input_pattern", {"go": True}, {}, False),
        ("required_input_pattern", {"tags": ["a"]}, {"tags": ["b", "a"]}, True),
        ("forbidden_input_pattern", {"muted": True}, {"muted": True}, False),
        ("forbidden_input_pattern", {"muted": True}, {"muted": False}, True),
        ("forbidden_input_pattern", {"muted": True}, {}, True),
    ],
)
def test_root_condition_tests_run_input(
    engine: Engine, pattern_field: str, pattern: dict[str, Any], input: dict[str, Any], runs: bool
) -> None:
    engine.define("f", [("a", [], {pattern_field: pattern}), ("b", [], {})])
    run_id = engine.start("f", input)
    assert engine.statuses(run_id)["a"] == ("started" if runs else "skipped")
    assert len(engine.tasks(run_id, "a")) == (1 if runs else 0)


def test_if_and_unless_together(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"required_input_pattern": {"x": 1}, "forbidden_input_pattern": {"y": 1}}),
            ("z", [], {}),
        ],
    )
    assert engine.statuses(engine.start("f", {"x": 1}))["a"] == "started"
    assert engine.statuses(engine.start("f", {"x": 1, "y": 1}))["a"] == "skipped"
    assert engine.statuses(engine.start("f", {"y": 2}))["a"] == "skipped"


def test_dependent_condition_tests_dep_outputs(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("fetch", [], {}),
            (
                "notify",
                ["fetch"],
                {
                    "required_input_pattern": {"fetch": {"urgent": True}},
                    "forbidden_input_pattern": {"fetch": {"muted": True}},
                },
            ),
        ],
    )
    outcomes = {}
    for name, output in {
        "met": {"urgent": True},
        "not_urgent": {"urgent": False},
        "muted": {"urgent": True, "muted": True},
    }.items():
        run_id = engine.start("f", {"urgent": True})  # the run input is not what is tested
        [fetch] = [t for t in engine.claim("f") if t["run_id"] == run_id]
        engine.complete(fetch, output)
        outcomes[name] = engine.statuses(run_id)["notify"]
    assert outcomes == {"met": "started", "not_urgent": "skipped", "muted": "skipped"}


def test_when_unmet_skip_keeps_dependents(engine: Engine) -> None:
    engine.define("f", [("a", [], {"required_input_pattern": {"go": True}}), ("b", ["a"], {})])
    run_id = engine.start("f", {})
    assert engine.statuses(run_id) == {"a": "skipped", "b": "started"}
    [b] = engine.claim("f")
    assert b["input"] == {}
    engine.complete(b, "b")
    assert engine.run(run_id)["output"] == {"b": "b"}


def test_when_unmet_skip_cascade(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"required_input_pattern": {"go": True}, "when_unmet": "skip-cascade"}),
            ("b", ["a"], {}),
            ("c", [], {}),
            ("d", ["b", "c"], {}),
        ],
    )
    run_id = engine.start("f", {})
    states = engine.states(run_id)
    assert {k: v["skip_reason"] for k, v in states.items()} == {
        "a": "condition_unmet",
        "b": "dependency_skipped",
        "c": None,
        "d": "dependency_skipped",
    }
    [c] = engine.claim("f")
    engine.complete(c, "c")
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {})


def test_when_unmet_fail_fails_run(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {}),
            ("b", ["a"], {"required_input_pattern": {"a": "yes"}, "when_unmet": "fail"}),
            ("c", [], {}),
        ],
    )
    run_id = engine.start("f", {})
    tasks = {t["step_slug"]: t for t in engine.claim("f")}
    engine.complete(tasks["a"], "no")
    run = engine.run(run_id)
    assert run["status"] == "failed" and "condition not met" in run["error_message"]
    assert engine.states(run_id)["b"]["status"] == "failed"
    assert engine.task(run_id, "c")["status"] == "cancelled"
    assert engine.queue_messages("f") == []


def test_when_unmet_fail_at_start(engine: Engine) -> None:
    engine.define(
        "f", [("a", [], {"required_input_pattern": {"ok": 1}, "when_unmet": "fail"}), ("b", [], {})]
    )
    run_id = engine.start("f", {"ok": 2})
    assert engine.run(run_id)["status"] == "failed"
    assert engine.tasks(run_id) == []
    assert engine.queue_messages("f") == []


def test_skip_cascade_through_diamond(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("root", [], {}),
            (
                "gate",
                ["root"],
                {"required_input_pattern": {"root": {"go": True}}, "when_unmet": "skip-cascade"},
            ),
            ("left", ["gate"], {}),
            ("right", ["gate"], {}),
            ("join", ["left", "right"], {}),
            ("other", ["root"], {}),
            ("tail", ["join", "other"], {}),
        ],
    )
    run_id = engine.start("f", {})
    [root] = engine.claim("f")
    engine.complete(root, {"go": False})
    statuses = engine.statuses(run_id)
    assert statuses == {
        "root": "completed",
        "gate": "skipped",
        "left": "skipped",
        "right": "skipped",
        "join": "skipped",
        "other": "started",
        "tail": "skipped",
    }
    [other] = engine.claim("f")
    engine.complete(other, "o")
    run = engine.run(run_id)
    assert (run["status"], run["output"], run["remaining_steps"]) == ("completed", {}, 0)


def test_plain_skip_through_diamond_runs_join_with_partial_input(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("root", [], {}),
            ("left", ["root"], {"required_input_pattern": {"root": {"left": True}}}),
            ("right", ["root"], {"required_input_pattern": {"root": {"right": True}}}),
            ("join", ["left", "right"], {}),
        ],
    )
    run_id = engine.start("f", {})
    [root] = engine.claim("f")
    engine.complete(root, {"right": True})
    [right] = engine.claim("f")
    assert right["step_slug"] == "right"
    engine.complete(right, "R")
    [join] = engine.claim("f")
    assert join["input"] == {"right": "R"}
    engine.complete(join, "J")
    assert engine.run(run_id)["output"] == {"join": "J"}


def test_condition_on_step_after_skipped_parent_sees_empty_subject(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"required_input_pattern": {"never": 1}}),
            ("b", ["a"], {"forbidden_input_pattern": {"a": {}}}),
            ("c", ["a"], {"required_input_pattern": {"a": {}}}),
        ],
    )
    run_id = engine.start("f", {})
    assert engine.statuses(run_id) == {"a": "skipped", "b": "started", "c": "skipped"}


def test_empty_root_map_completes_immediately(engine: Engine) -> None:
    engine.define(
        "f",
        [("m", [], {"step_type": "map"}), ("n", ["m"], {"step_type": "map"}), ("after", ["n"], {})],
    )
    run_id = engine.start("f", [])
    states = engine.states(run_id)
    assert (states["m"]["status"], states["m"]["output"]) == ("completed", [])
    assert (states["n"]["status"], states["n"]["output"], states["n"]["initial_tasks"]) == (
        "completed",
        [],
        0,
    )
    [after] = engine.claim("f")
    assert after["input"] == {"n": []}
    engine.complete(after, "x")
    assert engine.run(run_id)["output"] == {"after": "x"}


def test_empty_map_only_flow_completes_in_start_flow(engine: Engine) -> None:
    engine.define("f", [("m", [], {"step_type": "map"})])
    run_id = engine.start("f", [])
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"m": []})
    assert engine.queue_messages("f") == []


def test_dependent_map_of_empty_array_output(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("m", ["a"], {"step_type": "map"})])
    run_id = engine.start("f", {})
    [a] = engine.claim("f")
    engine.complete(a, [])
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"m": []})


def test_skipped_parent_counts_as_empty_array_for_map_child(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"required_input_pattern": {"go": 1}}),
            ("m", ["a"], {"step_type": "map"}),
            ("after", ["m"], {}),
        ],
    )
    run_id = engine.start("f", {})
    states = engine.states(run_id)
    assert states["a"]["status"] == "skipped"
    assert (states["m"]["status"], states["m"]["output"]) == ("completed", [])
    [after] = engine.claim("f")
    assert after["input"] == {"m": []}


def test_handler_skip_parent_gives_empty_map_child(engine: Engine) -> None:
    engine.define(
        "f",
        [
            ("a", [], {"max_attempts": 1, "when_exhausted": "skip"}),
            ("m", ["a"], {"step_type": "map"}),
        ],
    )
    run_id = engine.start("f", {})
    [a] = engine.claim("f")
    engine.fail(a)
    run = engine.run(run_id)
    assert (run["status"], run["output"]) == ("completed", {"m": []})


def test_condition_on_map_step(engine: Engine) -> None:
    engine.define(
        "f",
        [("a", [], {}), ("m", ["a"], {"step_type": "map", "required_input_pattern": {"a": [1]}})],
    )
    first = engine.start("f", {})
    [a] = engine.claim("f")
    engine.complete(a, [2, 3])
    assert engine.run(first)["output"] == {}
    assert engine.statuses(first)["m"] == "skipped"
    second = engine.start("f", {})
    [a2] = engine.claim("f")
    engine.complete(a2, [1, 2])
    assert len(engine.claim("f")) == 2
    assert engine.statuses(second)["m"] == "started"


def test_long_chain_of_skips_converges(engine: Engine) -> None:
    steps: list[tuple[str, list[str], dict[str, Any]]] = [
        ("s0", [], {"required_input_pattern": {"x": 1}})
    ]
    for i in range(1, 30):
        steps.append((f"s{i}", [f"s{i - 1}"], {"required_input_pattern": {"x": 1}}))
    engine.define("f", steps)
    run_id = engine.start("f", {})
    run = engine.run(run_id)
    assert run["status"] == "completed" and run["output"] == {}
    assert set(engine.statuses(run_id).values()) == {"skipped"}
