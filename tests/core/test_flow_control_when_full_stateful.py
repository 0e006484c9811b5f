"""A full concurrency key's when_full under concurrent starters: a hypothesis state machine
starts runs from several connections at once (one of them may complete a task at the same
moment) and completes tasks; after every step a model of each key says how many runs are
started and waiting, and the database agrees: never more started runs than the limit, never
a waiting run beside a free slot, and no run lost that should run (replace_waiting: the
newest burst's survivor waits; cancel_running: the newest `limit` runs are started)."""

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
STARTERS = 3
KEYS = 2
_flows = count()


class WhenFullMachine(RuleBasedStateMachine):
    dsn: str

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.engine = Engine(self.conn)
        self.starters = [psycopg.connect(self.dsn, autocommit=True) for _ in range(STARTERS)]
        self.flow = f"wf{next(_flows)}_{uuid.uuid4().hex[:6]}"
        self.started = dict.fromkeys(range(KEYS), 0)
        self.waiting = dict.fromkeys(range(KEYS), 0)
        self.newest: dict[int, set[uuid.UUID]] = {}  # the last burst's runs of a key that had to wait
        self.in_hand: list[Row] = []
        self.starts = 0

    @initialize(when_full=st.sampled_from(["replace_waiting", "cancel_running"]), limit=st.integers(1, 2))
    def define(self, when_full: str, limit: int) -> None:
        self.when_full, self.limit = when_full, limit
        self.engine.define(self.flow, [("a", [], {})], concurrency_limit=limit, concurrency_key="/k",
                           concurrency_when_full=when_full)

    # -- the model ------------------------------------------------------------------------

    def _arrive(self, key: int, runs: set[uuid.UUID]) -> None:
        n = len(runs)
        self.newest[key] = runs
        if self.when_full == "cancel_running":
            self.started[key] = min(self.limit, self.started[key] + n)
            return
        begins = 0 if self.waiting[key] else min(n, self.limit - self.started[key])
        self.started[key] += begins
        if n > begins:
            self.waiting[key] = 1

    def _end(self, key: int) -> None:
        self.started[key] -= 1
        if self.waiting[key]:
            self.waiting[key], self.started[key] = 0, self.started[key] + 1

    # -- rules ----------------------------------------------------------------------------

    @rule(keys=st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=STARTERS),
          complete_meanwhile=st.booleans())
    def start_at_once(self, keys: list[int], complete_meanwhile: bool) -> None:
        finisher = self.in_hand.pop(0) if complete_meanwhile and self.in_hand else None
        parties = len(keys) + (finisher is not None)
        barrier = threading.Barrier(parties)
        made: list[Any] = [None] * len(keys)
        finished: list[Any] = [None]
        errors: list[BaseException] = []

        def starter(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                made[i] = self.starters[i].execute("select run_id from flowlane.start_flow(%s, %s)",
                                                   (self.flow, Jsonb({"k": keys[i]}))).fetchone()
            except BaseException as exc:
                errors.append(exc)

        def completer(task: Row) -> None:
            try:
                conn = psycopg.connect(self.dsn, autocommit=True)
                with conn:
                    barrier.wait(timeout=30)
                    finished[0] = conn.execute(
                        "select status from flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                        (task["run_id"], task["step_slug"], task["task_index"], Jsonb(1),
                         self.engine.worker_id, task["attempt"])).fetchone()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=starter, args=(i,)) for i in range(len(keys))]
        if finisher is not None:
            threads.append(threading.Thread(target=completer, args=(finisher,)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        bursts = {key: {made[i][0] for i in range(len(keys)) if keys[i] == key} for key in set(keys)}
        if finisher is None:
            for key, runs in bursts.items():
                self._arrive(key, runs)
            return
        # a completion raced the starts: which came first decides the counts; the newest runs
        # still run (cancel_running) or wait (replace_waiting), and the model takes the counts
        # (the result is taken, unless a start cancelled its run first: then it is refused)
        run = self.engine.run(finisher["run_id"])
        assert run["status"] == "completed" or (
            run["status"] == "cancelled" and self.when_full == "cancel_running"), (run, finished)
        counts = self.counts()
        for key, runs in bursts.items():
            self.newest[key] = runs
            live = self.engine.scalar("select count(*) from flowlane.runs where run_id = any (%s) "
                                      "and status in ('started', 'completed')", (list(runs),))
            if self.when_full == "cancel_running":
                assert live == min(self.limit, len(runs)), (key, live)
        for key in range(KEYS):
            self.started[key], self.waiting[key] = counts[key]["started"], counts[key]["waiting"]

    def _settle(self, task: Row) -> None:
        """A result in hand: its run completes, or a newer start cancelled the run since the
        claim (cancel_running, counted at that start) and the result is refused."""
        run = self.engine.run(task["run_id"])
        if run["status"] == "cancelled" and self.when_full == "cancel_running":
            assert self.engine.scalar("select status from flowlane.step_tasks where run_id = %s",
                                      (task["run_id"],)) == "cancelled"
            return
        assert run["status"] == "completed", run
        self._end(run["input"]["k"])

    @rule()
    def claim(self) -> None:
        self.in_hand += [r for r in self.engine.rows(
            "select * from flowlane.claim_tasks(%s, 10, %s, %s)",
            (self.flow, self.engine.worker_id, Jsonb([[self.flow, "a"]]))) if r["outcome"] == "claimed"]

    @rule(pick=st.integers(0, 20))
    def complete(self, pick: int) -> None:
        if self.in_hand:
            task = self.in_hand.pop(pick % len(self.in_hand))
            self.engine.complete(task, 1)
            self._settle(task)

    # -- invariants -----------------------------------------------------------------------

    def counts(self) -> dict[int, Row]:
        rows = self.engine.rows(
            "select (input ->> 'k')::int as k, count(*) filter (where status = 'started') as started, "
            "count(*) filter (where status = 'waiting') as waiting, "
            "coalesce(array_agg(run_id) filter (where status = 'waiting'), '{}') as waiting_ids "
            "from flowlane.runs where flow_slug = %s group by 1", (self.flow,))
        found = {r["k"]: r for r in rows}
        return {key: found.get(key, {"started": 0, "waiting": 0, "waiting_ids": []}) for key in range(KEYS)}

    @invariant()
    def the_database_is_the_model(self) -> None:
        if not hasattr(self, "when_full"):
            return
        for key, row in self.counts().items():
            assert row["started"] <= self.limit, (key, row)
            assert row["waiting"] == 0 or row["started"] == self.limit, (key, row)  # no waiting beside room
            assert (row["started"], row["waiting"]) == (self.started[key], self.waiting[key]), (
                key, row, self.started, self.waiting)
            if row["waiting"]:  # the waiting run is one of the newest burst's (the last to commit)
                assert set(row["waiting_ids"]) <= self.newest[key]
        # every cancelled run names the run that superseded it: of the same key, not cancelled before it
        wrong = self.engine.rows(
            "select c.run_id, c.cancel_reason from flowlane.runs c "
            "where c.flow_slug = %s and c.status = 'cancelled' and not exists ("
            "  select 1 from flowlane.runs s where s.flow_slug = c.flow_slug "
            "  and c.cancel_reason like 'superseded by run ' || s.run_id || ' %%' "
            "  and s.input ->> 'k' = c.input ->> 'k')", (self.flow,))
        assert wrong == []

    def teardown(self) -> None:
        try:
            if hasattr(self, "when_full"):
                for _ in range(50):  # drain: every live run completes, none is stranded
                    self.claim()
                    if not self.in_hand:
                        break
                    while self.in_hand:
                        self.complete(0)
                self.the_database_is_the_model()
                assert self.engine.scalar(
                    "select count(*) from flowlane.runs where flow_slug = %s "
                    "and status in ('started', 'waiting')",
                    (self.flow,)) == 0
                assert_invariants(self.engine)
        finally:
            for c in [*self.starters, self.conn]:
                c.close()


def test_when_full_holds_under_concurrent_starters(dsn: str) -> None:
    machine: Callable[[], WhenFullMachine] = type(
        "Machine", (WhenFullMachine,), {"dsn": dsn})  # type: ignore[assignment]
    run_state_machine_as_test(machine, settings=settings(
        max_examples=20, stateful_step_count=30, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        superseded = conn.execute(
            "select count(*) from flowlane.runs where cancel_reason like 'superseded by run %%'").fetchone()
        ended = conn.execute("select count(*) from flowlane.runs where status = 'completed'").fetchone()
        print(f"superseded runs: {superseded}, completed runs: {ended}")
        assert superseded is not None and superseded[0] >= 20
        assert ended is not None and ended[0] >= 20
