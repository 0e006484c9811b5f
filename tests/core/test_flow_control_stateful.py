"""Flow control under concurrent claimers: a hypothesis state machine starts runs, claims
from several connections at once, completes, fails and cancels, and changes every limit;
after every step no limit is exceeded, and no task is lost or claimed twice. At the end
everything drains: held runs and tasks were all begun."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from itertools import count
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

Row = dict[str, Any]
CLAIMERS = 3
KEYS = 3
_flows = count()


def _claim(conn: psycopg.Connection[Any], queue: str, qty: int, worker: uuid.UUID, pairs: Any) -> list[Row]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute("select * from flowlane.claim_tasks(%s, %s, %s, %s)", (queue, qty, worker, pairs))
        return [r for r in cur.fetchall() if r["outcome"] == "claimed"]


class Ceiling:
    """A limit that may be lowered below what is started: the count may not grow past the
    larger of the limit and what was started when it was lowered, and that bound only falls."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.bound: dict[Any, int] = {}

    def change(self, limit: int | None, counts: dict[Any, int]) -> None:
        self.limit = limit
        self.bound = {k: max(limit or 0, n) for k, n in counts.items()}

    def check(self, what: str, counts: dict[Any, int]) -> None:
        if self.limit is None:
            self.bound = {}
            return
        for key, n in counts.items():
            bound = self.bound.get(key, self.limit)
            assert n <= bound, f"{what} {key}: {n} started, limit {self.limit} (bound {bound})"
            self.bound[key] = max(self.limit, min(bound, n))


class FlowControlMachine(RuleBasedStateMachine):
    dsn: str

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.engine = Engine(self.conn)
        self.claimers = [psycopg.connect(self.dsn, autocommit=True) for _ in range(CLAIMERS)]
        self.workers = [uuid.uuid4() for _ in range(CLAIMERS)]
        self.flow = f"fc{next(_flows)}_{uuid.uuid4().hex[:6]}"
        self.in_hand: list[Row] = []
        self.seen: set[tuple[Any, str, int, int]] = set()
        self.runs: list[uuid.UUID] = []

    @initialize(run_limit=st.integers(1, 3), step_limit=st.integers(1, 2), queue_limit=st.integers(2, 4))
    def define(self, run_limit: int, step_limit: int, queue_limit: int) -> None:
        self.engine.create_flow(self.flow, concurrency_limit=run_limit, concurrency_key="/0", base_delay=0,
                                max_attempts=2)
        self.engine.add_step(self.flow, "m", step_type="map", concurrency_limit=step_limit,
                             concurrency_key="/0")
        self.engine.add_step(self.flow, "b", ["m"])
        self.engine.scalar("select flowlane.set_queue_limits(%s, %s, null, null)", (self.flow, queue_limit))
        self.pairs = Jsonb([[self.flow, "m"], [self.flow, "b"]])
        self.run_ceiling = Ceiling(run_limit)
        self.step_ceiling = Ceiling(step_limit)
        self.queue_ceiling = Ceiling(queue_limit)

    # -- counts ---------------------------------------------------------------------------

    def run_counts(self) -> dict[Any, int]:
        return {r["concurrency_key"]: r["n"] for r in self.engine.rows(
            "select concurrency_key, count(*) as n from flowlane.runs where flow_slug = %s "
            "and status = 'started' group by 1", (self.flow,))}

    def step_counts(self) -> dict[Any, int]:
        # the sent, unfinished tasks of the limited step, by key (the run input's first element)
        return {r["k"]: r["n"] for r in self.engine.rows(
            "select r.input ->> 0 as k, count(*) as n from flowlane.step_tasks t "
            "join flowlane.runs r on r.run_id = t.run_id "
            "where t.flow_slug = %s and t.step_slug = 'm' and t.status in ('queued', 'started') group by 1",
            (self.flow,))}

    def queue_counts(self) -> dict[Any, int]:
        return {self.flow: self.engine.scalar(
            "select count(*) from flowlane.step_tasks where queue_name = %s and status = 'started'",
            (self.flow,))}

    # -- rules ----------------------------------------------------------------------------

    @rule(key=st.integers(0, KEYS - 1), n=st.integers(1, 3))
    def start(self, key: int, n: int) -> None:
        inputs = [Jsonb([str(key), str(key)]) for _ in range(n)]
        rows = self.engine.rows("select run_id from flowlane.start_flows(%s, %s::jsonb[])",
                                (self.flow, inputs))
        self.runs += [r["run_id"] for r in rows]

    @rule(qtys=st.lists(st.integers(1, 4), min_size=CLAIMERS, max_size=CLAIMERS))
    def claim_at_once(self, qtys: list[int]) -> None:
        barrier = threading.Barrier(CLAIMERS)
        found: list[list[Row]] = [[] for _ in range(CLAIMERS)]
        errors: list[BaseException] = []

        def claimer(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                found[i] = _claim(self.claimers[i], self.flow, qtys[i], self.workers[i], self.pairs)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for i, rows in enumerate(found):
            for r in rows:
                key = (r["run_id"], r["step_slug"], r["task_index"], r["attempt"])
                assert key not in self.seen, f"claimed twice: {key}"
                self.seen.add(key)
                self.in_hand.append({**r, "worker": self.workers[i]})

    def _result(self, pick: int, function: str, value: Any) -> None:
        if not self.in_hand:
            return
        task = self.in_hand.pop(pick % len(self.in_hand))
        self.engine.rows(
            f"select * from flowlane.{function}(%s, %s, %s, %s, %s, %s)",
            (task["run_id"], task["step_slug"], task["task_index"], value, task["worker"], task["attempt"]))

    @rule(pick=st.integers(0, 50))
    def complete(self, pick: int) -> None:
        self._result(pick, "complete_task", Jsonb([1, 2]))

    @rule(pick=st.integers(0, 50))
    def fail(self, pick: int) -> None:
        self._result(pick, "fail_task", "boom")

    @rule(pick=st.integers(0, 50))
    def cancel(self, pick: int) -> None:
        if self.runs:
            run_id = self.runs[pick % len(self.runs)]
            if self.engine.run(run_id)["status"] in ("started", "waiting"):
                self.engine.scalar("select flowlane.cancel_run(%s)", (run_id,))

    @rule(limit=st.integers(1, 3))
    def change_run_limit(self, limit: int) -> None:
        self.engine.create_flow(self.flow, concurrency_limit=limit, concurrency_key="/0", base_delay=0,
                                max_attempts=2)
        self.run_ceiling.change(limit, self.run_counts())

    @rule(limit=st.integers(1, 3))
    def change_step_limit(self, limit: int) -> None:
        self.engine.add_step(self.flow, "m", step_type="map", concurrency_limit=limit, concurrency_key="/0")
        self.step_ceiling.change(limit, self.step_counts())

    @rule(limit=st.one_of(st.none(), st.integers(1, 5)))
    def change_queue_limit(self, limit: int | None) -> None:
        self.engine.scalar("select flowlane.set_queue_limits(%s, %s, null, null)", (self.flow, limit))
        self.queue_ceiling.change(limit, self.queue_counts())

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def limits_hold_and_nothing_is_lost(self) -> None:
        if not hasattr(self, "run_ceiling"):
            return
        self.run_ceiling.check("run key", self.run_counts())
        self.step_ceiling.check("step key", self.step_counts())
        self.queue_ceiling.check("queue", self.queue_counts())
        # every task of a started step of a started run exists exactly once: sent or held
        lost = self.engine.rows(
            "select ss.run_id, ss.step_slug from flowlane.all_step_states ss "
            "join flowlane.runs r on r.run_id = ss.run_id and r.status = 'started' "
            "where ss.flow_slug = %s and ss.status = 'started' and ss.initial_tasks <> "
            "  (select count(*) from flowlane.step_tasks t"
            "   where t.run_id = ss.run_id and t.step_slug = ss.step_slug)"
            "  + (select count(*) from flowlane.held_tasks h"
            "     where h.run_id = ss.run_id and h.step_slug = ss.step_slug)",
            (self.flow,))
        assert lost == [], f"tasks neither sent nor held: {lost}"
        # a held task never had a message or an attempt; a held run has no task
        assert self.engine.scalar(
            "select count(*) from flowlane.held_tasks h "
            "join flowlane.step_tasks t using (run_id, step_slug, task_index) "
            "where h.flow_slug = %s", (self.flow,)) == 0
        assert self.engine.scalar(
            "select count(*) from flowlane.runs r join flowlane.step_tasks t on t.run_id = r.run_id "
            "where r.flow_slug = %s and r.status = 'waiting' and r.retry_count = 0", (self.flow,)) == 0
        # the step slots are exactly the sent, unfinished tasks of the limited step
        assert self.engine.scalar(
            "select count(*) from (select run_id, step_slug, task_index from flowlane.step_slots "
            "  where flow_slug = %s "
            "  except select run_id, step_slug, task_index from flowlane.step_tasks "
            "  where flow_slug = %s and step_slug = 'm' and status in ('queued', 'started')) x",
            (self.flow, self.flow)) == 0
        assert self.engine.scalar(
            "select count(*) from flowlane.step_tasks t where t.flow_slug = %s and t.step_slug = 'm' "
            "and t.status in ('queued', 'started') and not exists (select 1 from flowlane.step_slots s "
            "where s.run_id = t.run_id and s.step_slug = t.step_slug and s.task_index = t.task_index)",
            (self.flow,)) == 0

    def teardown(self) -> None:
        try:
            if hasattr(self, "run_ceiling"):
                self._drain()
                assert_invariants(self.engine)
        finally:
            for c in [*self.claimers, self.conn]:
                c.close()

    def _drain(self) -> None:
        """Complete everything: every run ends, so no held run or task was stranded."""
        for _ in range(200):
            while self.in_hand:
                self.complete(0)
            self.engine.make_visible(self.flow)
            self.claim_at_once([4] * CLAIMERS)
            self.limits_hold_and_nothing_is_lost()
            if not self.in_hand and self.engine.scalar(
                "select count(*) from flowlane.runs where flow_slug = %s "
                "and status in ('started', 'waiting')",
                (self.flow,)) == 0:
                return
        open_runs = self.engine.rows(
            "select run_id, status from flowlane.runs where flow_slug = %s "
            "and status in ('started', 'waiting')",
            (self.flow,))
        raise AssertionError(f"runs still open after draining: {open_runs}")


def test_flow_control_holds_under_concurrent_claimers(dsn: str) -> None:
    machine: Callable[[], FlowControlMachine] = type(
        "Machine", (FlowControlMachine,), {"dsn": dsn})  # type: ignore[assignment]
    run_state_machine_as_test(machine, settings=settings(
        max_examples=12, stateful_step_count=25, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        # the examples did hold work back (runs and tasks took hold_seq numbers) and finished it
        held = conn.execute("select last_value from flowlane.hold_seq").fetchone()
        ended = conn.execute("select count(*) from flowlane.runs where status = 'completed'").fetchone()
        print(f"held runs and tasks: {held}, completed runs: {ended}")
        assert held is not None and held[0] >= 50
        assert ended is not None and ended[0] >= 20
