"""The references between runs, step states and tasks: each row points at what owns it.

A task references its step state and a step state its run and its step; no direct key from a
task to its run or from a step state to its flow, which these already imply, so that a written
row is checked once per owner.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def test_the_keys_of_step_states_and_tasks(engine: Engine) -> None:
    keys = engine.rows(
        "select conrelid::regclass::text as rel, confrelid::regclass::text as ref, "
        "array(select a.attname::text from unnest(conkey) k join pg_attribute a "
        "      on a.attrelid = conrelid and a.attnum = k order by a.attnum) as cols "
        "from pg_constraint where contype = 'f' "
        "and conrelid = any (array['flowlane.step_states', 'flowlane.step_tasks', "
        "                          'flowlane.steps']::regclass[]) "
        "order by 1, 2"
    )
    assert [(k["rel"], k["ref"], k["cols"]) for k in keys] == [
        ("flowlane.step_states", "flowlane.runs", ["run_id"]),
        ("flowlane.step_states", "flowlane.steps", ["flow_slug", "step_slug"]),
        ("flowlane.step_tasks", "flowlane.runs", ["run_id"]),
        ("flowlane.steps", "flowlane.flows", ["flow_slug"]),
        ("flowlane.steps", "flowlane.queues", ["queue_name"]),
    ]


def test_a_task_without_its_run_is_refused(engine: Engine) -> None:
    engine.define("owned", [("one", [], {})])
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="step_tasks_run_id_fkey"):
        engine.conn.execute(
            "insert into flowlane.step_tasks (flow_slug, run_id, step_slug, queue_name, message_id) "
            "values ('owned', %s, 'one', 'owned', 1)",
            (uuid.uuid4(),),
        )
    assert engine.scalar("select count(*) from flowlane.step_tasks") == 0


def test_a_step_state_without_its_flow_is_refused(engine: Engine) -> None:
    engine.define("owned", [("one", [], {}), ("two", ["one"], {})])
    run_id = engine.start("owned", {})
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="step_states_flow_slug_step_slug_fkey"):
        engine.conn.execute(
            "insert into flowlane.step_states (flow_slug, run_id, step_slug) values ('nowhere', %s, 'other')",
            (run_id,),
        )
    # (the root step's task holds its state: the dependent's is the one row)
    assert engine.scalar("select count(*) from flowlane.step_states") == 1


def test_a_run_with_tasks_is_not_deleted_alone(engine: Engine) -> None:
    engine.define("alone", [("one", [], {})])
    alone = engine.start("alone", {})  # (its one state is held by its task)
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="step_tasks_run_id_fkey"):
        engine.conn.execute("delete from flowlane.runs where run_id = %s", (alone,))
    engine.define("owned", [("one", [], {}), ("two", ["one"], {})])
    run_id = engine.start("owned", {})
    with engine.conn.transaction(force_rollback=True):  # (the run stays whole)
        engine.conn.execute("delete from flowlane.step_tasks where run_id = %s", (run_id,))
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="step_states_run_id_fkey"), \
                engine.conn.transaction():
            engine.conn.execute("delete from flowlane.runs where run_id = %s", (run_id,))
    assert engine.scalar("select count(*) from flowlane.step_states where run_id = %s", (run_id,)) == 1
    assert engine.scalar("select count(*) from flowlane.step_tasks where run_id = %s", (run_id,)) == 1
