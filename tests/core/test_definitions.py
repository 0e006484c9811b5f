"""create_flow / add_step: validation, idempotency, option convergence."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow


def test_create_flow_defaults_no_queue_ddl_add_step_provisions(engine: Engine) -> None:
    flow = engine.create_flow("orders")
    assert (flow["opt_max_attempts"], flow["opt_base_delay"], flow["opt_timeout"]) == (3, 5, 60)
    assert flow["queue_mode"] == "flow"
    assert engine.rows("select queue_name from pgmq.list_queues()") == []
    assert engine.scalar("select count(*) from flowlane.queues") == 0
    step = engine.add_step("orders", "a")
    assert step["queue_name"] == "orders"
    queues = [r["queue_name"] for r in engine.rows("select queue_name from pgmq.list_queues()")]
    assert queues == ["orders"]
    registry = engine.rows("select queue_name, ownership, owner_flow_slug from flowlane.queues")
    assert registry == [{"queue_name": "orders", "ownership": "owned", "owner_flow_slug": "orders"}]


def test_create_flow_options_converge_on_recall(engine: Engine) -> None:
    engine.create_flow("orders", max_attempts=5, base_delay=1, timeout=10)
    again = engine.create_flow("orders", max_attempts=2, base_delay=0, timeout=30)
    assert (again["opt_max_attempts"], again["opt_base_delay"], again["opt_timeout"]) == (2, 0, 30)
    back = engine.create_flow("orders")
    assert (back["opt_max_attempts"], back["opt_base_delay"], back["opt_timeout"]) == (3, 5, 60)
    assert engine.scalar("select count(*) from flowlane.flows") == 1
    assert engine.scalar("select count(*) from pgmq.list_queues()") == 0


def test_mixed_case_flow_queue_is_lowercase(engine: Engine) -> None:
    engine.create_flow("Orders")
    engine.add_step("Orders", "a")
    assert engine.scalar("select queue_name from pgmq.list_queues()") == "orders"
    assert engine.scalar("select queue_name from flowlane.steps") == "orders"


@pytest.mark.parametrize(
    "slug",
    [
        "",
        "1abc",
        "_abc",
        "abc_",
        "a__b",
        "run",
        "RUN",
        "a-b",
        "a b",
        "ä",
        "a" * 129,
        "a.b",
    ],
)
def test_invalid_flow_slugs_rejected(engine: Engine, slug: str) -> None:
    with pytest.raises(psycopg.Error, match="invalid flow slug"):
        engine.create_flow(slug)
    assert engine.scalar("select count(*) from flowlane.flows") == 0


@pytest.mark.parametrize("slug", ["a", "A1", "a_b", "runner", "a" * 47, "x1_y2_z3"])
def test_valid_flow_slugs_accepted(engine: Engine, slug: str) -> None:
    assert engine.create_flow(slug)["flow_slug"] == slug


def test_flow_slug_unique_case_insensitively(engine: Engine) -> None:
    engine.create_flow("orders")
    with pytest.raises(psycopg.Error, match="conflicts with existing flow"):
        engine.create_flow("ORDERS")


def test_flow_slug_constraint_enforced_at_table_level(engine: Engine) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="flows_slug_valid"):
        engine.conn.execute("insert into flowlane.flows (flow_slug) values ('bad__slug')")
    engine.conn.execute("insert into flowlane.flows (flow_slug) values ('good')")
    with pytest.raises(psycopg.errors.UniqueViolation, match="flows_slug_ci_unique"):
        engine.conn.execute("insert into flowlane.flows (flow_slug) values ('GOOD')")


@pytest.mark.parametrize(
    ("option", "value", "constraint"),
    [
        ("max_attempts", 0, "flows_max_attempts_positive"),
        ("base_delay", -1, "flows_base_delay_nonnegative"),
        ("timeout", 0, "flows_timeout_positive"),
    ],
)
def test_flow_options_checked(engine: Engine, option: str, value: int, constraint: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        engine.create_flow("f", **{option: value})


def test_add_step_indexes_and_deps(engine: Engine) -> None:
    engine.create_flow("f")
    a = engine.add_step("f", "a")
    b = engine.add_step("f", "b", ["a"])
    c = engine.add_step("f", "c", ["b", "a"])
    assert [a["step_index"], b["step_index"], c["step_index"]] == [0, 1, 2]
    assert [a["deps_count"], b["deps_count"], c["deps_count"]] == [0, 1, 2]
    deps = engine.rows("select dep_slug, step_slug from flowlane.deps order by step_slug, dep_slug")
    assert [(d["dep_slug"], d["step_slug"]) for d in deps] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert (c["when_unmet"], c["when_exhausted"], c["step_type"]) == ("skip", "fail", "single")


def test_add_step_unknown_flow(engine: Engine) -> None:
    with pytest.raises(psycopg.Error, match='unknown flow "nope"'):
        engine.add_step("nope", "a")


def test_add_step_unknown_dep(engine: Engine) -> None:
    engine.create_flow("f")
    engine.add_step("f", "a")
    with pytest.raises(psycopg.Error, match='depends on unknown step "ghost"'):
        engine.add_step("f", "b", ["a", "ghost"])
    assert engine.scalar("select count(*) from flowlane.steps") == 1


def test_add_step_self_dep(engine: Engine) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.Error, match=r"cannot depend on itself|unknown step"):
        engine.add_step("f", "a", ["a"])


def test_add_step_duplicate_dep(engine: Engine) -> None:
    engine.create_flow("f")
    engine.add_step("f", "a")
    with pytest.raises(psycopg.Error, match="lists a dependency twice"):
        engine.add_step("f", "b", ["a", "a"])


@pytest.mark.parametrize("slug", ["run", "a__b", "b_", "9x", ""])
def test_add_step_invalid_slug(engine: Engine, slug: str) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.Error, match="invalid step slug"):
        engine.add_step("f", slug)


def test_step_slug_unique_case_insensitively_within_flow(engine: Engine) -> None:
    engine.create_flow("f")
    engine.create_flow("g")
    engine.add_step("f", "fetch")
    with pytest.raises(psycopg.Error, match="conflicts with existing step"):
        engine.add_step("f", "Fetch")
    assert engine.add_step("g", "Fetch")["step_slug"] == "Fetch"


def test_map_with_two_deps_rejected(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", [], {})])
    with pytest.raises(psycopg.Error, match="has 2 dependencies"):
        engine.add_step("f", "m", ["a", "b"], step_type="map")


def test_unknown_step_type_rejected(engine: Engine) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.Error, match="step_type must be single, map or wait"):
        engine.add_step("f", "a", step_type="fanout")


@pytest.mark.parametrize("pattern", [[1], "x", 3, True])
@pytest.mark.parametrize("field", ["required_input_pattern", "forbidden_input_pattern"])
def test_patterns_must_be_objects(engine: Engine, field: str, pattern: object) -> None:
    engine.create_flow("f")
    from psycopg.types.json import Jsonb

    with pytest.raises(psycopg.Error, match="must be a JSON object"):
        engine.conn.execute(f"select flowlane.add_step('f', 'a', {field} => %s)", (Jsonb(pattern),))


@pytest.mark.parametrize("mode", ["fail", "skip-cascade"])
def test_when_unmet_needs_a_pattern(engine: Engine, mode: str) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.Error, match="only meaningful with a condition"):
        engine.add_step("f", "a", when_unmet=mode)
    assert (
        engine.add_step("f", "a", when_unmet=mode, required_input_pattern={"x": 1})["when_unmet"]
        == mode
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("when_unmet", "explode", "when_unmet must be"),
        ("when_exhausted", "retry", "when_exhausted must be"),
    ],
)
def test_bad_modes_rejected(engine: Engine, field: str, value: str, message: str) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.Error, match=message):
        engine.add_step("f", "a", required_input_pattern={"x": 1}, **{field: value})


@pytest.mark.parametrize(
    ("option", "value", "constraint"),
    [
        ("max_attempts", 0, "steps_max_attempts_positive"),
        ("base_delay", -1, "steps_base_delay_nonnegative"),
        ("timeout", 0, "steps_timeout_positive"),
        ("start_delay", -5, "steps_start_delay_nonnegative"),
    ],
)
def test_step_options_checked(engine: Engine, option: str, value: int, constraint: str) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.errors.CheckViolation, match=constraint):
        options: dict[str, Any] = {option: value}
        engine.add_step("f", "a", **options)


def test_add_step_idempotent_and_options_converge(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {"timeout": 10, "max_attempts": 2})])
    again = engine.add_step("f", "b", ["a"], timeout=20, base_delay=3)
    assert (again["opt_timeout"], again["opt_base_delay"], again["opt_max_attempts"]) == (
        20,
        3,
        None,
    )
    assert again["step_index"] == 1
    assert engine.scalar("select count(*) from flowlane.steps") == 2
    assert engine.scalar("select count(*) from flowlane.deps") == 1


@pytest.mark.parametrize(
    ("changed", "field"),
    [
        ({"step_type": "map"}, "step_type"),
        ({"deps": []}, "deps"),
        ({"required_input_pattern": {"a": 2}}, "required_input_pattern"),
        ({"forbidden_input_pattern": {"a": 1}}, "forbidden_input_pattern"),
        ({"when_unmet": "fail"}, "when_unmet"),
        ({"when_exhausted": "skip"}, "when_exhausted"),
    ],
)
def test_add_step_different_definition_raises(
    engine: Engine, changed: dict[str, object], field: str
) -> None:
    engine.define("f", [("a", [], {})])
    original = {"required_input_pattern": {"a": 1}, "when_unmet": "skip", "when_exhausted": "fail"}
    engine.add_step("f", "b", ["a"], **original)
    deps = changed.pop("deps", ["a"])
    options = {**original, **changed}
    assert isinstance(deps, list)
    with pytest.raises(
        psycopg.Error, match=rf'step "b" of flow "f" already exists with a different {field}'
    ):
        engine.add_step("f", "b", deps, **options)
    row = engine.row("select * from flowlane.steps where step_slug = 'b'")
    assert row is not None and row["step_type"] == "single" and row["when_exhausted"] == "fail"


def test_calculate_retry_delay(engine: Engine) -> None:
    cases = [(5, 0, 5), (5, 1, 10), (5, 3, 40), (1, 1, 2), (0, 7, 0), (3, 2, 12)]
    for base, attempts, expected in cases:
        assert (
            engine.scalar("select flowlane.calculate_retry_delay(%s, %s)", (base, attempts))
            == expected
        )
    assert engine.scalar("select flowlane.calculate_retry_delay(5, 100)") == 2147483647


def test_resolve_flow(engine: Engine) -> None:
    engine.create_flow("orders")
    assert engine.scalar("select flowlane.resolve_flow('orders')") == "orders"
    with pytest.raises(psycopg.Error, match='unknown flow "missing"'):
        engine.scalar("select flowlane.resolve_flow('missing')")


def test_functions_pin_search_path(engine: Engine) -> None:
    unpinned = engine.rows(
        "select p.proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace "
        "where n.nspname = 'flowlane' "
        "and not coalesce(p.proconfig @> array['search_path=\"\"'], false) order by p.proname"
    )
    # the clock's two functions and the run ids' set nothing, so that they are inlined; their
    # bodies qualify every name
    assert [r["proname"] for r in unpinned] == ["_clock_timestamp", "_now", "_uuid_v7"]



def test_a_task_cycle_calls_no_sql_function(engine: Engine) -> None:
    # a language sql function with SET clauses is never inlined, and before PostgreSQL 18 it
    # plans its statement on every call (1.6 ms of a 3.5 ms claim on PostgreSQL 15)
    engine.define("cycle", [("first", [], {"max_attempts": 2}), ("each", ["first"], {"step_type": "map"}),
                            ("last", ["each"], {})])
    pairs = Jsonb([["cycle", step] for step in ("first", "each", "last")])
    claim = "select * from flowlane.claim_tasks('cycle', 10, %s, %s) where outcome = 'claimed'"
    with engine.conn.transaction():
        engine.conn.execute("set local track_functions = 'all'")
        run_id = engine.start("cycle", {"n": 1})
        (task,) = engine.rows(claim, (engine.worker_id, pairs))
        engine.fail(task)
        engine.make_visible("cycle")
        (task,) = engine.rows(claim, (engine.worker_id, pairs))
        engine.complete(task, [1, 2])
        mapped = engine.rows(claim, (engine.worker_id, pairs))
        results = [{"run_id": str(t["run_id"]), "step_slug": t["step_slug"], "task_index": t["task_index"],
                    "attempt": t["attempt"], "output": t["task_index"], "worker_id": str(engine.worker_id)}
                   for t in mapped]
        engine.scalar("select count(*) from flowlane.complete_tasks(%s)", (Jsonb(results),))
        (task,) = engine.rows(claim, (engine.worker_id, pairs))
        engine.complete(task, {})
        engine.scalar("select flowlane.run_deadline(%s)", (run_id,))
        engine.scalar("select flowlane.maintenance_tick()")
        called = engine.rows(
            "select p.proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace "
            "join pg_language l on l.oid = p.prolang "
            "where n.nspname = 'flowlane' and l.lanname = 'sql' and p.proconfig is not null "
            "and coalesce(pg_stat_get_xact_function_calls(p.oid), 0) > 0"
        )
    assert len(mapped) == 2 and engine.run(run_id)["status"] == "completed"
    assert [c["proname"] for c in called] == []

def test_functions_planned_on_keys_are_never_jit_compiled(engine: Engine) -> None:
    # before PostgreSQL 18 a disabled sequential scan is priced past jit_above_cost: a
    # statement that kept one was compiled on every execution wherever JIT is available
    settings = engine.rows(
        "select p.proname, coalesce(p.proconfig @> array['enable_seqscan=off'], false) as on_keys, "
        "coalesce(p.proconfig @> array['jit=off'], false) as no_jit "
        "from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'flowlane'"
    )
    on_keys = {s["proname"] for s in settings if s["on_keys"]}
    assert {"claim_tasks", "prune_runs", "_queue_read", "_fire_schedules"} <= on_keys
    assert {s["proname"] for s in settings if s["on_keys"] and not s["no_jit"]} == set()

def test_workers(engine: Engine) -> None:
    import uuid

    engine.define("orders", [("a", [], {})])
    register = (
        "select * from flowlane.register_worker(%s, 'orders', 'w1', 'orders', '[[\"orders\", \"a\"]]')"
    )
    wid = uuid.uuid4()
    row = engine.row(register, (wid,))
    assert row is not None and row["queue_name"] == "orders" and row["stopped_at"] is None
    assert engine.scalar("select flowlane.heartbeat(%s)", (wid,)) is False
    engine.conn.execute(
        "update flowlane.workers set deprecated_at = now() where worker_id = %s", (wid,)
    )
    assert engine.scalar("select flowlane.heartbeat(%s)", (wid,)) is True
    assert engine.scalar("select flowlane.heartbeat(%s)", (uuid.uuid4(),)) is False
    engine.conn.execute("select flowlane.mark_worker_stopped(%s)", (wid,))
    stopped = engine.row("select * from flowlane.workers where worker_id = %s", (wid,))
    assert stopped is not None and stopped["stopped_at"] is not None
    again = engine.row(register, (wid,))
    assert again is not None and engine.scalar("select count(*) from flowlane.workers") == 1


MAX_TIMEOUT = 2147483617  # 0004: timeout + 30 s (the stall threshold) must fit an int


def test_largest_timeout_can_be_claimed_and_recovered(engine: Engine) -> None:
    # before 0004 a timeout near 2^31 made every claim fail with "integer out of range"
    # and, once such a task was started, requeue_stalled_tasks failed for every flow
    engine.define("slow", [("s", [], {"timeout": MAX_TIMEOUT})], timeout=MAX_TIMEOUT)
    engine.define("fast", [("s", [], {})])
    slow_run, fast_run = engine.start("slow"), engine.start("fast")
    assert len(engine.claim("slow")) == 1 and len(engine.claim("fast")) == 1
    engine.backdate(fast_run, "s", 3600)
    assert engine.scalar("select flowlane.requeue_stalled_tasks()") == 1
    assert engine.task(fast_run, "s")["status"] == "queued"
    assert engine.task(slow_run, "s")["status"] == "started"


@pytest.mark.parametrize("where", ["flow", "step"])
def test_timeout_beyond_the_int_safe_bound_is_refused(engine: Engine, where: str) -> None:
    engine.create_flow("f")
    with pytest.raises(psycopg.errors.CheckViolation, match="timeout_at_most_2147483617"):
        if where == "flow":
            engine.create_flow("f", timeout=MAX_TIMEOUT + 1)
        else:
            engine.add_step("f", "s", timeout=MAX_TIMEOUT + 1)
    assert engine.row("select opt_timeout from flowlane.flows") == {"opt_timeout": 60}


@pytest.mark.parametrize(
    ("statement", "sqlstate", "message"),
    [
        ("select flowlane.add_step('f', 'b', deps_slugs => array[null]::text[])", "22023",
         "a dependency slug is null"),
        ("select flowlane.add_step('f', 'b', deps_slugs => array['nosuch'])", "23503",
         'depends on unknown step "nosuch"'),
        ("select flowlane.add_step('nosuch', 'b')", "23503", 'unknown flow "nosuch"'),
        ("select flowlane.ensure_flow_shape('f', null)", "22023", "a flow shape is a JSON object"),
        ("select flowlane.ensure_flow_shape('f', '[1]')", "22023", "a flow shape is a JSON object"),
        ("select flowlane.ensure_flow_compiled('g', '5')", "22023",
         "a flow shape is a JSON object"),
        ("select flowlane.set_alias('al', 'f', array[null]::text[])", "P0002",
         'flow "NULL" does not exist'),
        ("select flowlane.set_alias('al', 'nosuch')", "P0002", 'flow "nosuch" does not exist'),
        ("select flowlane.set_alias('F', 'f')", "23505", "share one namespace"),
        ("select flowlane.create_flow('f', queue_mode => 'per-step')", "23514",
         "exists with queue_mode flow"),
    ],
)
def test_bad_arguments_raise_clearly_and_change_nothing(engine: Engine, statement: str,
                                                        sqlstate: str, message: str) -> None:
    engine.define("f", [("a", [], {})])
    counts = ("select (select count(*) from flowlane.flows), (select count(*) from flowlane.steps),"
              " (select count(*) from flowlane.deps), (select count(*) from flowlane.aliases),"
              " (select count(*) from flowlane.queues)")
    before = engine.conn.execute(counts).fetchone()
    with pytest.raises(psycopg.Error, match=message) as raised:
        engine.conn.execute(statement)
    assert raised.value.sqlstate == sqlstate
    assert engine.conn.execute(counts).fetchone() == before
