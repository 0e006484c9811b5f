"""A flow's debounce under concurrent starters: a hypothesis state machine starts runs from
several connections at once (also while a tick begins the key's run), lets time pass for a
key (by backdating its pending run) and ticks; a model of each key says which run is pending
and how many began, and the database agrees after every step: one pending run per key whose
input is the last start's (of the last burst, whose starts commit in the order of the key's
lock), and exactly one run begun per quiet period or reached maximum wait, with the input of
the last start before it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb

from tests.core.engine import Engine, assert_invariants

pytestmark = pytest.mark.slow

STARTERS = 3
KEYS = 2
PERIOD = 60
MAX_WAIT = 100
STEP = 20  # time passes in steps that reach PERIOD and MAX_WAIT exactly: a real second is no step
_flows = count()
MAX_WAIT_REACHED: list[uuid.UUID] = []  # runs begun by their maximum wait (never a quiet period)


@dataclass
class Pending:
    run_id: uuid.UUID
    inputs: set[int]  # the n of the last burst's starts: one of them is the run's input
    since_first: int = 0
    since_last: int = 0

    @property
    def due(self) -> bool:
        return self.since_last >= PERIOD or self.since_first >= MAX_WAIT


@dataclass
class Key:
    pending: Pending | None = None
    begun: list[tuple[uuid.UUID, set[int]]] = field(default_factory=list)


class DebounceMachine(RuleBasedStateMachine):
    dsn: str

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.engine = Engine(self.conn)
        self.starters = [psycopg.connect(self.dsn, autocommit=True) for _ in range(STARTERS)]
        self.flow = f"db{next(_flows)}_{uuid.uuid4().hex[:6]}"
        self.engine.define(self.flow, [("a", [], {})], debounce_key="/k", debounce_period=PERIOD,
                           debounce_max_wait=MAX_WAIT)
        self.keys = [Key() for _ in range(KEYS)]
        self.n = count()

    def _start(self, conn: psycopg.Connection[Any], key: int, n: int) -> tuple[uuid.UUID, bool]:
        row = conn.execute("select r.run_id, current_setting('flowlane.found_run', true) = r.run_id::text "
                           "from flowlane.start_flow(%s, %s) r",
                           (self.flow, Jsonb({"k": key, "n": n}))).fetchone()
        assert row is not None
        return row[0], bool(row[1])

    @rule(keys=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=STARTERS))
    def start_at_once(self, keys: list[int]) -> None:
        ns = [next(self.n) for _ in keys]
        barrier = threading.Barrier(len(keys))
        made: list[Any] = [None] * len(keys)
        errors: list[BaseException] = []

        def starter(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                made[i] = self._start(self.starters[i], keys[i], ns[i])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=starter, args=(i,)) for i in range(len(keys))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for key in set(keys):
            burst = [i for i in range(len(keys)) if keys[i] == key]
            runs = {made[i][0] for i in burst}
            assert len(runs) == 1, runs  # every start of a key in the burst gets the same run
            [run] = runs
            pending = self.keys[key].pending
            created = [i for i in burst if not made[i][1]]
            if pending is None:
                assert len(created) == 1  # one start created it, the others joined it
                self.keys[key].pending = Pending(run, {ns[i] for i in burst})
            else:
                assert run == pending.run_id and created == []
                pending.inputs, pending.since_last = {ns[i] for i in burst}, 0

    @rule(key=st.integers(0, KEYS - 1), starters=st.integers(1, STARTERS))
    def start_while_a_tick_begins_the_key(self, key: int, starters: int) -> None:
        """The key's pending run falls due, and starts of the key race the tick that begins it:
        each start joins the run before the tick takes it (the run begins with the input of the
        last of them) or makes the key's next run after it."""
        pending = self.keys[key].pending
        if pending is not None:
            for _ in range(PERIOD // STEP):
                self.time_passes(key)
        ns = [next(self.n) for _ in range(starters)]
        barrier = threading.Barrier(starters + 1)
        made: list[Any] = [None] * starters
        errors: list[BaseException] = []

        def starter(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                made[i] = self._start(self.starters[i], key, ns[i])
            except BaseException as exc:
                errors.append(exc)

        def ticker() -> None:
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    barrier.wait(timeout=30)
                    conn.execute("select flowlane.maintenance_tick()")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=starter, args=(i,)) for i in range(starters)]
        threads.append(threading.Thread(target=ticker))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for other in self.keys:  # the tick began the other keys' due runs too
            if other is not self.keys[key] and other.pending is not None and other.pending.due:
                other.begun.append((other.pending.run_id, other.pending.inputs))
                other.pending = None
        joined = [i for i in range(starters) if pending is not None and made[i][0] == pending.run_id]
        later = [i for i in range(starters) if i not in joined]
        assert len({made[i][0] for i in later}) <= 1, made  # one next run for all the later starts
        if pending is not None:
            assert all(made[i][1] for i in joined)
            if self.engine.run(pending.run_id)["status"] == "waiting":  # every start came first
                assert later == []
                pending.inputs, pending.since_last = {ns[i] for i in joined}, 0
                return
            self.keys[key].begun.append((pending.run_id, {ns[i] for i in joined} or pending.inputs))
            self.keys[key].pending = None
        if later:
            assert [made[i][1] for i in later].count(False) == 1  # one start made it, the rest joined
            self.keys[key].pending = Pending(made[later[0]][0], {ns[i] for i in later})

    @rule(key=st.integers(0, KEYS - 1))
    def start_one(self, key: int) -> None:
        n = next(self.n)
        run, existed = self._start(self.conn, key, n)
        pending = self.keys[key].pending
        assert existed == (pending is not None)
        if pending is None:
            self.keys[key].pending = Pending(run, {n})
        else:
            assert run == pending.run_id
            pending.inputs, pending.since_last = {n}, 0

    @rule(key=st.integers(0, KEYS - 1))
    def time_passes(self, key: int) -> None:
        pending = self.keys[key].pending
        if pending is None:
            return
        self.conn.execute("update flowlane.runs set start_at = start_at - make_interval(secs => %s), "
                          "debounce_since = debounce_since - make_interval(secs => %s) where run_id = %s",
                          (STEP, STEP, pending.run_id))
        pending.since_first += STEP
        pending.since_last += STEP

    @rule(key=st.integers(0, KEYS - 1), starts=st.integers(1, 6))
    def steady_stream(self, key: int, starts: int) -> None:
        """Starts a step apart: never quiet for a period, so only the maximum wait begins the run."""
        for _ in range(starts):
            self.time_passes(key)
            self.start_one(key)

    @rule()
    def tick(self) -> None:
        self.engine.row("select flowlane.maintenance_tick() as t")  # (the invariant checks what began)
        due = [k for k in self.keys if k.pending is not None and k.pending.due]
        for k in due:
            assert k.pending is not None
            if k.pending.since_last < PERIOD:
                MAX_WAIT_REACHED.append(k.pending.run_id)
            k.begun.append((k.pending.run_id, k.pending.inputs))
            k.pending = None

    @invariant()
    def the_database_is_the_model(self) -> None:
        rows = self.engine.rows("select run_id, status, (input ->> 'k')::int as k, (input ->> 'n')::int as n "
                                "from flowlane.runs where flow_slug = %s", (self.flow,))
        for key, model in enumerate(self.keys):
            mine = [r for r in rows if r["k"] == key]
            waiting = [r for r in mine if r["status"] == "waiting"]
            started = [r for r in mine if r["status"] == "started"]
            if model.pending is None:
                assert waiting == []
            else:
                [row] = waiting
                assert row["run_id"] == model.pending.run_id and row["n"] in model.pending.inputs
            assert sorted(r["run_id"] for r in started) == sorted(run for run, _ in model.begun)
            for run, inputs in model.begun:
                assert next(r["n"] for r in started if r["run_id"] == run) in inputs

    def teardown(self) -> None:
        try:
            assert_invariants(self.engine)
            self.conn.execute("select flowlane.cancel_run(run_id) from flowlane.runs "
                              "where flow_slug = %s and status = 'waiting'", (self.flow,))
        finally:
            for c in [*self.starters, self.conn]:
                c.close()


def test_debounce_holds_under_concurrent_starters(dsn: str) -> None:
    machine: Callable[[], DebounceMachine] = type(
        "Machine", (DebounceMachine,), {"dsn": dsn})  # type: ignore[assignment]
    run_state_machine_as_test(machine, settings=settings(
        max_examples=20, stateful_step_count=30, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    assert len(MAX_WAIT_REACHED) >= 3  # the runs show the maximum wait holding, not only quiet periods
