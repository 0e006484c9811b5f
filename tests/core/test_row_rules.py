"""The row rules of runs, step states and tasks: one CHECK per table, each broken rule named."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

TABLES = ("runs", "step_states", "step_tasks")

# (table, assignment that breaks exactly one rule of a started run, step state or task, the rule)
BREAKS = [
    ("runs", "status = 'bogus'", "runs_status_valid"),
    ("runs", "status = 'completed'", "runs_completed_at"),
    ("runs", "status = 'failed', failed_at = started_at - interval '1 second'", "runs_failed_after_start"),
    ("runs", "cancel_reason = 'why'", "runs_cancel_reason_only_cancelled"),
    ("runs", "output = '{}'", "runs_output_only_completed"),
    ("runs", "remaining_steps = -1", "runs_remaining_steps_nonnegative"),
    ("runs", "idempotency_key = 'k'", "runs_key_scoped"),
    ("runs", "status = 'waiting'", "runs_waiting_has_reason"),
    ("runs", "hold_seq = 1", "runs_held_has_key"),
    ("runs", "priority = 1001", "runs_priority_range"),
    ("runs", "parent_run_id = run_id", "runs_parent_complete"),
    ("step_states", "status = 'bogus'", "step_states_status_valid"),
    ("step_states", "started_at = created_at - interval '1 second'", "step_states_started_after_created"),
    ("step_states", "remaining_deps = -1", "step_states_remaining_deps_nonnegative"),
    ("step_states", "remaining_tasks = null", "step_states_started_sized"),
    ("step_states", "output = '{}'", "step_states_output_only_completed"),
    ("step_states", "skip_reason = 'condition_unmet'", "step_states_skip_reason"),
    ("step_states", "status = 'completed', completed_at = now()", "step_states_completed_no_remaining"),
    ("step_tasks", "status = 'bogus'", "step_tasks_status_valid"),
    ("step_tasks", "started_at = null", "step_tasks_started_at"),
    ("step_tasks", "started_at = queued_at - interval '1 second'", "step_tasks_started_after_queued"),
    ("step_tasks", "output = '{}'", "step_tasks_output_only_done"),
    ("step_tasks", "attempts_count = -1", "step_tasks_attempts_nonnegative"),
    ("step_tasks", "task_index = -1", "step_tasks_task_index_nonnegative"),
]


@pytest.fixture
def started(engine: Engine) -> uuid.UUID:
    """A run whose one task is claimed: a started run, step state and task (a root step with a
    condition, which keeps its state in a step_states row)."""
    engine.define("ruled", [("one", [], {"required_input_pattern": {"go": True}})])
    run_id: uuid.UUID = engine.scalar(
        "select (array_agg(s.run_id order by s.ord))[1] from flowlane.start_flows('ruled', "
        "array['{\"go\": true, \"n\": 1}'::jsonb, '{\"go\": true, \"n\": 2}'::jsonb]) "
        "with ordinality as s (run_id, ord)")
    assert len(engine.claim("ruled")) == 2
    return run_id


def test_each_table_has_one_check(engine: Engine) -> None:
    checks = engine.rows(
        "select conrelid::regclass::text as rel, conname from pg_constraint "
        "where contype = 'c' and conrelid = any (array['flowlane.runs', 'flowlane.step_states', "
        "'flowlane.step_tasks']::regclass[]) order by 1"
    )
    assert [(c["rel"], c["conname"]) for c in checks] == [
        (f"flowlane.{t}", f"{t}_rules") for t in TABLES
    ]


@pytest.mark.parametrize(("table", "assignment", "rule"), BREAKS)
def test_a_broken_rule_is_named(
    engine: Engine, started: uuid.UUID, table: str, assignment: str, rule: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match=f'violates check constraint "{rule}"') as err:
        engine.conn.execute(f"update flowlane.{table} set {assignment} where run_id = %s", (started,))
    assert err.value.diag.constraint_name == f"{table}_rules"
    assert (err.value.diag.schema_name, err.value.diag.table_name) == ("flowlane", table)
    assert engine.run(started)["status"] == "started"  # nothing changed


def test_an_insert_is_held_to_the_rules(engine: Engine) -> None:
    engine.define("ruled", [("one", [], {})])
    with pytest.raises(psycopg.errors.CheckViolation, match='"runs_status_valid"'):
        engine.conn.execute(
            "insert into flowlane.runs (flow_slug, input, status) values ('ruled', '{}', 'bogus')"
        )
    assert engine.scalar("select count(*) from flowlane.runs") == 0


def test_every_rule_is_named_once(engine: Engine) -> None:
    for table in TABLES:
        source = engine.scalar(f"select pg_get_functiondef('flowlane._{table}_rules'::regproc)")
        names = re.findall(r"then '(\w+)'", source)
        assert names and len(names) == len(set(names)), table
        assert all(name.startswith(f"{table}_") for name in names), table
