"""Flow shapes (docs/shape.md): get_flow_shape, ensure_flow_shape, ensure_flow_compiled."""

from __future__ import annotations

import copy
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.core.engine import Engine

pytestmark = pytest.mark.slow

SHAPE: dict[str, Any] = {
    "queue_mode": "explicit",
    "steps": [
        {
            "slug": "fetch",
            "type": "single",
            "needs": [],
            "if": None,
            "unless": None,
            "when_unmet": "skip",
            "when_exhausted": "fail",
            "queue": "classify_threads",
        },
        {
            "slug": "classify",
            "type": "map",
            "needs": ["fetch"],
            "if": None,
            "unless": None,
            "when_unmet": "skip",
            "when_exhausted": "fail",
            "queue": "classify_threads",
        },
        {
            "slug": "deliver_slack",
            "type": "single",
            "needs": ["classify", "fetch"],
            "if": {"fetch": {"urgent": True}},
            "unless": {"fetch": {"muted": True}},
            "when_unmet": "skip",
            "when_exhausted": "fail",
            "queue": "deliver_slack_alerts",
        },
    ],
}


def compiled(engine: Engine, slug: str, shape: Any) -> dict[str, Any]:
    result = engine.scalar("select flowlane.ensure_flow_compiled(%s, %s)", (slug, Jsonb(shape)))
    assert isinstance(result, dict)
    return result


def ensure(engine: Engine, slug: str, shape: Any) -> None:
    engine.conn.execute("select flowlane.ensure_flow_shape(%s, %s)", (slug, Jsonb(shape)))


def test_ensure_flow_compiled_creates_then_verifies(engine: Engine) -> None:
    assert compiled(engine, "threads_v2", SHAPE) == {"status": "compiled", "differences": []}
    assert engine.scalar("select flowlane.get_flow_shape('threads_v2')") == SHAPE
    queues = engine.rows("select queue_name, ownership from flowlane.queues order by 1")
    assert queues == [
        {"queue_name": "classify_threads", "ownership": "shared"},
        {"queue_name": "deliver_slack_alerts", "ownership": "shared"},
    ]
    assert compiled(engine, "threads_v2", SHAPE) == {"status": "verified", "differences": []}
    ensure(engine, "threads_v2", SHAPE)


def test_shape_key_order_does_not_matter(engine: Engine) -> None:
    compiled(engine, "f", SHAPE)
    reordered = {
        "steps": [dict(reversed(list(s.items()))) for s in SHAPE["steps"]],
        "queue_mode": "explicit",
    }
    assert compiled(engine, "f", reordered)["status"] == "verified"


def test_get_flow_shape_matches_sql_definitions(engine: Engine) -> None:
    engine.create_flow("community_threads_v2")
    engine.add_step("community_threads_v2", "fetch")
    engine.add_step(
        "community_threads_v2",
        "b",
        ["fetch"],
        required_input_pattern={"fetch": 1},
        when_unmet="fail",
        when_exhausted="skip-cascade",
    )
    shape = engine.scalar("select flowlane.get_flow_shape('community_threads_v2')")
    assert shape == {
        "queue_mode": "flow",
        "steps": [
            {
                "slug": "fetch",
                "type": "single",
                "needs": [],
                "if": None,
                "unless": None,
                "when_unmet": "skip",
                "when_exhausted": "fail",
                "queue": "community_threads_v2",
            },
            {
                "slug": "b",
                "type": "single",
                "needs": ["fetch"],
                "if": {"fetch": 1},
                "unless": None,
                "when_unmet": "fail",
                "when_exhausted": "skip-cascade",
                "queue": "community_threads_v2",
            },
        ],
    }
    assert engine.scalar("select flowlane.get_flow_shape('missing')") is None


def test_needs_sorted_by_code_point(engine: Engine) -> None:
    engine.define("f", [("b", [], {}), ("C", [], {}), ("a", [], {}), ("z", ["b", "a", "C"], {})])
    shape = engine.scalar("select flowlane.get_flow_shape('f')")
    assert shape["steps"][3]["needs"] == ["C", "a", "b"]


def mutate(path: list[Any], value: Any) -> dict[str, Any]:
    shape = copy.deepcopy(SHAPE)
    target: Any = shape
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return shape


@pytest.mark.parametrize(
    ("given", "difference"),
    [
        (
            mutate(["queue_mode"], "per-step"),
            "queue_mode: explicit in the database, per-step in the given shape",
        ),
        (
            mutate(["steps", 1, "type"], "single"),
            "step 1 (classify): type is map in the database, single in the given shape",
        ),
        (
            mutate(["steps", 2, "queue"], "other_q"),
            (
                "step 2 (deliver_slack): queue is deliver_slack_alerts in the database, "
                "other_q in the given shape"
            ),
        ),
        (
            mutate(["steps", 2, "needs"], ["fetch"]),
            (
                'step 2 (deliver_slack): needs is ["classify", "fetch"] in the database, '
                '["fetch"] in the given shape'
            ),
        ),
        (
            mutate(["steps", 2, "if"], None),
            (
                'step 2 (deliver_slack): if is {"fetch": {"urgent": true}} in the database, '
                "null in the given shape"
            ),
        ),
        (
            mutate(["steps", 2, "when_exhausted"], "skip"),
            (
                "step 2 (deliver_slack): when_exhausted is fail in the database, "
                "skip in the given shape"
            ),
        ),
        (
            mutate(["steps", 0, "slug"], "fetch2"),
            "step 0: slug is fetch in the database, fetch2 in the given shape",
        ),
        (
            {"queue_mode": "explicit", "steps": SHAPE["steps"][:2]},
            "step count: 3 in the database, 2 in the given shape",
        ),
        (
            {"queue_mode": "explicit", "steps": SHAPE["steps"][:2]},
            "step 2 (deliver_slack): only in the database",
        ),
    ],
)
def test_mismatches_are_reported_readably(
    engine: Engine, given: dict[str, Any], difference: str
) -> None:
    compiled(engine, "f", SHAPE)
    before = engine.scalar("select flowlane.get_flow_shape('f')")
    result = compiled(engine, "f", given)
    assert result["status"] == "mismatch"
    assert difference in result["differences"]
    with pytest.raises(psycopg.Error) as info:
        ensure(engine, "f", given)
    assert "FLOWLANE_SHAPE_MISMATCH" in str(info.value)
    assert (
        info.value.diag.message_detail is not None and difference in info.value.diag.message_detail
    )
    # never destroys or changes anything
    assert engine.scalar("select flowlane.get_flow_shape('f')") == before


def test_step_added_in_shape_is_a_mismatch(engine: Engine) -> None:
    compiled(engine, "f", SHAPE)
    extra = copy.deepcopy(SHAPE)
    extra["steps"].append(
        {
            "slug": "more",
            "type": "single",
            "needs": [],
            "if": None,
            "unless": None,
            "when_unmet": "skip",
            "when_exhausted": "fail",
            "queue": "classify_threads",
        }
    )
    result = compiled(engine, "f", extra)
    assert result["differences"] == [
        "step count: 3 in the database, 4 in the given shape",
        "step 3 (more): only in the given shape",
    ]
    assert engine.scalar("select count(*) from flowlane.steps") == 3


def test_ensure_flow_shape_unknown_flow(engine: Engine) -> None:
    with pytest.raises(psycopg.Error, match='flow "nope" does not exist'):
        ensure(engine, "nope", SHAPE)


@pytest.mark.parametrize("bad", [[], "x", {"queue_mode": "flow", "steps": {}}, None])
def test_malformed_shape_rejected_before_any_change(engine: Engine, bad: Any) -> None:
    with pytest.raises(psycopg.Error):
        compiled(engine, "f", bad)
    assert engine.scalar("select count(*) from flowlane.flows") == 0


def test_compile_with_invalid_route_leaves_nothing(engine: Engine) -> None:
    bad = mutate(["steps", 2, "queue"], "Bad_Queue")
    with pytest.raises(psycopg.Error, match="not canonical"):
        compiled(engine, "f", bad)
    assert engine.scalar("select count(*) from flowlane.flows") == 0
    assert engine.scalar("select count(*) from flowlane.queues") == 0
    assert engine.scalar("select count(*) from pgmq.list_queues()") == 0


@pytest.mark.parametrize("mode", ["flow", "per-step"])
def test_compile_owned_modes(engine: Engine, mode: str) -> None:
    queue = {"flow": "orders", "per-step": "orders__a"}[mode]
    shape: dict[str, Any] = {
        "queue_mode": mode,
        "steps": [
            {
                "slug": "a",
                "type": "single",
                "needs": [],
                "if": None,
                "unless": None,
                "when_unmet": "skip",
                "when_exhausted": "fail",
                "queue": queue,
            }
        ],
    }
    assert compiled(engine, "orders", shape)["status"] == "compiled"
    assert engine.rows("select queue_name, ownership, owner_flow_slug from flowlane.queues") == [
        {"queue_name": queue, "ownership": "owned", "owner_flow_slug": "orders"}
    ]
    wrong = copy.deepcopy(shape)
    wrong["steps"][0]["queue"] = "elsewhere"
    assert compiled(engine, "orders", wrong)["status"] == "mismatch"


def test_compiled_flow_runs(engine: Engine) -> None:
    compiled(engine, "f", SHAPE)
    run_id = engine.start("f", {})
    [fetch] = engine.claim("classify_threads")
    engine.complete(fetch, [1, 2])
    assert len(engine.claim("classify_threads")) == 2
    assert engine.statuses(run_id)["deliver_slack"] == "created"


def test_ensure_flow_compiled_takes_an_advisory_lock(engine: Engine, dsn: str) -> None:
    with psycopg.connect(dsn) as other:
        other.execute("select flowlane.ensure_flow_compiled('f', %s)", (Jsonb(SHAPE),))
        locks = engine.scalar(
            "select count(*) from pg_locks where locktype = 'advisory' and granted"
        )
        assert locks >= 1
        other.rollback()
    assert engine.scalar("select count(*) from pg_locks where locktype = 'advisory'") == 0
    assert engine.scalar("select count(*) from flowlane.flows") == 0


def test_concurrent_compiles_serialize(dsn: str, engine: Engine) -> None:
    statuses: list[str] = []

    def run(conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            "select flowlane.ensure_flow_compiled('f', %s) ->> 'status'", (Jsonb(SHAPE),)
        ).fetchone()
        assert row is not None
        statuses.append(row[0])

    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        run(first)
        second.execute("set lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            run(second)  # waits for the first compile's advisory lock
        second.rollback()
        first.commit()
        run(second)
        second.commit()
    assert statuses == ["compiled", "verified"]


def apply_compiled(conn: psycopg.Connection[Any], slug: str, shape: dict[str, Any]) -> None:
    """Like a compiled SQL file: one transaction, create_flow, add_step..., ensure_flow_shape."""
    with conn.transaction():
        conn.execute(
            "select flowlane.create_flow(%s, queue_mode => %s)", (slug, shape["queue_mode"])
        )
        for step in shape["steps"]:
            conn.execute(
                "select flowlane.add_step(flow_slug => %s, step_slug => %s, deps_slugs => %s, "
                "step_type => %s, required_input_pattern => %s, forbidden_input_pattern => %s, "
                "when_unmet => %s, when_exhausted => %s, queue_name => %s)",
                (
                    slug,
                    step["slug"],
                    step["needs"],
                    step["type"],
                    None if step["if"] is None else Jsonb(step["if"]),
                    None if step["unless"] is None else Jsonb(step["unless"]),
                    step["when_unmet"],
                    step["when_exhausted"],
                    step["queue"],
                ),
            )
        conn.execute("select flowlane.ensure_flow_shape(%s, %s)", (slug, Jsonb(shape)))


def test_compiled_sql_apply_is_idempotent(engine: Engine) -> None:
    apply_compiled(engine.conn, "f", SHAPE)
    apply_compiled(engine.conn, "f", SHAPE)
    assert engine.scalar("select flowlane.get_flow_shape('f')") == SHAPE


@pytest.mark.parametrize("change", ["added_step", "removed_step", "changed_route"])
def test_compiled_sql_with_other_shape_raises_and_changes_nothing(
    engine: Engine, change: str
) -> None:
    apply_compiled(engine.conn, "f", SHAPE)
    other = copy.deepcopy(SHAPE)
    if change == "added_step":
        other["steps"].append(
            {
                "slug": "more",
                "type": "single",
                "needs": ["fetch"],
                "if": None,
                "unless": None,
                "when_unmet": "skip",
                "when_exhausted": "fail",
                "queue": "brand_new_q",
            }
        )
    elif change == "removed_step":
        other["steps"].pop()
    else:
        other["steps"][0]["queue"] = "elsewhere"
    before = engine.rows("select * from flowlane.steps order by step_index")
    with pytest.raises(psycopg.Error, match="FLOWLANE_SHAPE_MISMATCH"):
        apply_compiled(engine.conn, "f", other)
    assert engine.rows("select * from flowlane.steps order by step_index") == before
    assert (
        engine.scalar(
            "select count(*) from flowlane.queues where queue_name in ('brand_new_q', 'elsewhere')"
        )
        == 0
    )


def test_new_steps_refused_once_a_flow_has_runs(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.add_step("f", "b", ["a"])  # still being defined: allowed
    engine.start("f", {})
    with pytest.raises(psycopg.Error, match='flow "f" is already applied and has no step "c"'):
        engine.add_step("f", "c")
    assert engine.add_step("f", "a", timeout=7)["opt_timeout"] == 7  # options still converge
