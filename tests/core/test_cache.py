"""A step's cache: a completed task's output is kept under the key of its input for the step's
time to live, and a later task with that key completes at once with it, without a message or a
worker. Time passes by moving the test database's clock, never by sleeping."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from flowlane.testing.harness import install_clock
from tests.core.engine import Engine

pytestmark = pytest.mark.slow

CACHED = {"cache_ttl": 3600, "cache_fingerprint": "f1"}


def serve(engine: Engine, queue: str, output: Any) -> int:
    """Claim every visible task of the queue and complete it with ``output`` (a callable gets the
    task); how many handler runs that was."""
    tasks = engine.claim(queue)
    for task in tasks:
        engine.complete(task, output(task) if callable(output) else output)
    return len(tasks)


def cached_flags(engine: Engine, run_id: uuid.UUID, step: str) -> list[bool]:
    return [bool(t["cached"]) for t in engine.tasks(run_id, step)]


def entries(engine: Engine) -> int:
    return int(engine.scalar("select count(*) from flowlane.step_cache"))


def test_a_second_run_with_the_same_input_completes_from_the_cache(engine: Engine) -> None:
    engine.define("f", [("fetch", [], CACHED), ("use", ["fetch"], {})])
    first = engine.start("f", {"url": "a"})
    assert serve(engine, "f", {"body": "A"}) == 1 and entries(engine) == 1
    assert serve(engine, "f", 1) == 1 and engine.run(first)["status"] == "completed"
    second = engine.start("f", {"url": "a"})
    # the cached step completed at its start; only the next step has a message
    assert engine.statuses(second)["fetch"] == "completed"
    assert engine.states(second)["fetch"]["output"] == {"body": "A"}
    assert cached_flags(engine, second, "fetch") == [True] and cached_flags(engine, first, "fetch") == [False]
    assert engine.task(second, "fetch")["message_id"] is None
    [use] = engine.claim("f")
    assert use["step_slug"] == "use" and use["run_id"] == second
    engine.complete(use, 1)
    assert engine.run(second)["status"] == "completed"
    # another input is another key
    third = engine.start("f", {"url": "b"})
    assert engine.statuses(third)["fetch"] == "started"


def test_a_hit_on_the_last_step_completes_the_run(engine: Engine) -> None:
    engine.define("f", [("only", [], CACHED)])
    engine.start("f", {"n": 1})
    serve(engine, "f", {"out": 1})
    run_id = engine.start("f", {"n": 1})
    run = engine.run(run_id)
    assert run["status"] == "completed" and run["output"] == {"only": {"out": 1}}
    assert engine.queue_messages("f") == []


def test_the_key_pointers_pick_what_counts(engine: Engine) -> None:
    engine.define("f", [("fetch", [], {**CACHED, "cache_key": ["/url", "/lang"]})])
    engine.start("f", {"url": "a", "lang": "en", "request_id": 1})
    serve(engine, "f", "A")
    same = engine.start("f", {"url": "a", "lang": "en", "request_id": 2})
    other = engine.start("f", {"url": "a", "lang": "fr", "request_id": 3})
    assert engine.run(same)["status"] == "completed" and engine.run(other)["status"] == "started"


def test_a_dependent_step_keys_on_its_input_the_outputs_it_needs(engine: Engine) -> None:
    engine.define("f", [("a", [], {}), ("b", ["a"], {**CACHED, "cache_key": ["/a/id"]})])
    engine.start("f", {"n": 1})
    serve(engine, "f", lambda t: {"id": 7} if t["step_slug"] == "a" else "B")
    serve(engine, "f", lambda t: {"id": 7} if t["step_slug"] == "a" else "B")
    second = engine.start("f", {"n": 2})
    serve(engine, "f", {"id": 7})  # a runs again (not cached); b completes from the cache
    assert engine.run(second)["status"] == "completed" and engine.states(second)["b"]["output"] == "B"
    assert cached_flags(engine, second, "b") == [True]


def test_map_tasks_are_cached_item_by_item(engine: Engine) -> None:
    engine.define("f", [("each", [], {**CACHED, "step_type": "map"})])
    engine.start("f", [1, 2])
    assert serve(engine, "f", lambda t: t["task_index"] * 10 + 5) == 2
    run_id = engine.start("f", [2, 3, 1])
    # items 2 and 1 are hits, item 3 runs
    assert cached_flags(engine, run_id, "each") == [True, False, True]
    [task] = engine.claim("f")
    assert task["task_index"] == 1
    engine.complete(task, 99)
    assert engine.run(run_id)["status"] == "completed"
    assert engine.states(run_id)["each"]["output"] == [15, 99, 5]
    assert entries(engine) == 3


def test_a_new_fingerprint_never_finds_an_older_entry(engine: Engine) -> None:
    engine.define("f", [("a", [], CACHED)])
    engine.start("f", {"n": 1})
    serve(engine, "f", 1)
    engine.add_step("f", "a", cache_ttl=3600, cache_fingerprint="f2")  # (a new handler, as compiled)
    run_id = engine.start("f", {"n": 1})
    assert engine.run(run_id)["status"] == "started"
    serve(engine, "f", 2)
    assert entries(engine) == 2


def test_the_first_completion_of_a_key_keeps_its_entry(engine: Engine) -> None:
    engine.define("f", [("a", [], CACHED)])
    first, second = engine.start("f", {"n": 1}), engine.start("f", {"n": 1})  # both before a completion
    tasks = {t["run_id"]: t for t in engine.claim("f")}
    engine.complete(tasks[first], "first")
    engine.complete(tasks[second], "second")
    assert engine.scalar("select output from flowlane.step_cache") == "first"
    third = engine.start("f", {"n": 1})
    assert engine.states(third)["a"]["output"] == "first"


def test_a_step_without_a_cache_writes_no_entry(engine: Engine) -> None:
    engine.define("f", [("a", [], {})])
    engine.start("f", {"n": 1})
    serve(engine, "f", 1)
    run_id = engine.start("f", {"n": 1})
    assert engine.statuses(run_id)["a"] == "started" and entries(engine) == 0


def test_an_expired_entry_runs_the_handler_again_and_is_pruned(conn: psycopg.Connection[Any]) -> None:
    install_clock(conn)
    engine = Engine(conn)
    engine.define("f", [("a", [], {**CACHED, "cache_ttl": 60})])
    engine.start("f", {"n": 1})
    serve(engine, "f", "old")
    conn.execute("select flowlane_testing.advance(30)")
    assert engine.run(engine.start("f", {"n": 1}))["status"] == "completed"
    assert engine.scalar("select flowlane.maintenance_tick() -> 'cache_pruned'") == 0
    conn.execute("select flowlane_testing.advance(31)")
    run_id = engine.start("f", {"n": 1})
    assert engine.run(run_id)["status"] == "started"
    assert engine.scalar("select flowlane.maintenance_tick() -> 'cache_pruned'") == 1 and entries(engine) == 0
    serve(engine, "f", "new")  # the handler ran again: its output is the new entry
    assert engine.scalar("select output from flowlane.step_cache") == "new"
    assert engine.states(engine.start("f", {"n": 1}))["a"]["output"] == "new"


@pytest.mark.parametrize(("options", "message"), [
    ({"cache_ttl": 0}, "cache ttl must be at least 1 second"),
    ({"cache_key": ["/a"]}, "a cache key needs a cache ttl"),
    ({"cache_ttl": 5, "cache_key": ["a"]}, "is not a list of JSON pointers"),
    ({"cache_ttl": 5, "step_type": "wait"}, "a cache needs a step with a handler"),
])
def test_add_step_refuses_a_cache_it_cannot_keep(engine: Engine, options: dict[str, Any],
                                                 message: str) -> None:
    engine.create_flow("f")
    with pytest.raises(pg_errors.InvalidParameterValue, match=message):
        engine.add_step("f", "a", **options)


def test_a_hit_takes_no_step_concurrency_slot(engine: Engine) -> None:
    engine.define("f", [("a", [], {**CACHED, "concurrency_limit": 1})])
    engine.start("f", {"n": 1})
    serve(engine, "f", "one")
    running, held = engine.start("f", {"n": 2}), engine.start("f", {"n": 3})
    hit = engine.start("f", {"n": 1})  # the step's only slot is taken, and a task waits for it
    assert engine.run(hit)["status"] == "completed" and engine.states(hit)["a"]["output"] == "one"
    assert [t["run_id"] for t in engine.claim("f")] == [running]
    assert engine.tasks(held) == []  # still held for the slot


def test_a_rerun_from_a_cached_step_runs_its_handler_again(engine: Engine) -> None:
    engine.define("f", [("a", [], CACHED), ("b", ["a"], CACHED)])
    run_id = engine.start("f", {"n": 1})
    serve(engine, "f", "first")
    serve(engine, "f", "first")
    assert engine.run(run_id)["status"] == "completed" and entries(engine) == 2
    engine.row("select * from flowlane.retry_run_from(%s, 'b')", (run_id,))
    assert entries(engine) == 1  # b's entry went; a keeps its own
    assert serve(engine, "f", "second") == 1
    assert engine.run(run_id)["output"] == {"b": "second"}
    assert engine.states(engine.start("f", {"n": 1}))["b"]["output"] == "second"


def test_deleting_a_flow_deletes_its_entries(engine: Engine) -> None:
    engine.define("f", [("a", [], CACHED)])
    engine.define("g", [("a", [], CACHED)])
    for flow in ("f", "g"):
        engine.start(flow, {"n": 1})
        serve(engine, flow, flow)
    engine.scalar("select flowlane.delete_flow_and_data('f')")
    assert engine.rows("select flow_slug from flowlane.step_cache") == [{"flow_slug": "g"}]


def test_a_cached_and_an_uncached_step_share_a_queue(engine: Engine) -> None:
    engine.define("f", [("a", [], CACHED), ("b", [], {})])  # both start together, on queue f
    engine.start("f", {"n": 1})
    assert serve(engine, "f", "out") == 2
    run_id = engine.start("f", {"n": 1})
    assert cached_flags(engine, run_id, "a") == [True]
    [task] = engine.claim("f")
    assert task["step_slug"] == "b"
