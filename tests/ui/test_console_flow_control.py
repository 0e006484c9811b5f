"""The console says what a run or task waits for under flow control (a real `flowlane ui`
process over HTTP): a run held for its flow's concurrency key, a task held back by its
queue's concurrency, and the queue's limits on the queues page."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.ui import ui_support

pytestmark = pytest.mark.slow


def test_run_and_queue_pages_say_what_waits_for_what(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.create_flow('alerts', concurrency_limit => 1, "
                     "concurrency_key => '/customer_id')")
        conn.execute("select flowlane.add_step('alerts', 'deliver', queue_name => 'alerts')")
        conn.execute("select flowlane.set_queue_limits('alerts', 1, null, null, archive => false)")
        first, held, other = (conn.execute("select run_id from flowlane.start_flow('alerts', %s)",
                                           (Jsonb({"customer_id": c}),)).fetchone()[0]  # type: ignore[index]
                              for c in (42, 42, 7))
        claimed = conn.execute("select count(*) from flowlane.claim_tasks('alerts', 10, %s, %s) "
                               "where outcome = 'claimed'",
                               (uuid.uuid4(), Jsonb([["alerts", "deliver"]]))).fetchone()
        assert claimed == (1,)
    with ui_support.ui_server(dsn) as console:
        held_page = ui_support.fetch(f"{console.url}/runs/{held}").body
        assert ('<p class="facts waiting" data-held="run">waiting for: concurrency customer_id=42: '
                '1 of 1 started (1st in line)</p>') in held_page
        assert 'id="start-at"' not in held_page  # held, not a delayed start
        other_page = ui_support.fetch(f"{console.url}/runs/{other}").body
        assert ('waiting for: queue concurrency alerts: 1 of 1 started '
                '<span class="muted">(deliver: 1 task)</span>') in other_page
        assert "data-held" not in ui_support.fetch(f"{console.url}/runs/{first}").body
        queues = ui_support.fetch(console.url + "/queues").body
        row = re.search(r'<tr data-queue="alerts">.*?</tr>', queues, re.DOTALL)
        assert row is not None
        assert ('<td class="limits">1 of 1 started · <span data-archive="off">archive off</span>'
                '<br><span class="muted" data-held="1">waiting '
                'for: queue concurrency alerts: 1 of 1 started</span></td>') in row[0], row[0]


def test_a_debounced_run_says_when_it_begins_on_its_page_and_in_the_runs_list(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.create_flow('carts', debounce_key => '/customer_id', "
                     "debounce_period => 3600)")
        conn.execute("select flowlane.add_step('carts', 'sync')")
        pending = {conn.execute("select run_id from flowlane.start_flow('carts', %s)",
                                (Jsonb({"customer_id": 7, "n": n}),)).fetchone()[0]  # type: ignore[index]
                   for n in range(3)}
    assert len(pending) == 1
    [run] = pending
    with ui_support.ui_server(dsn) as console:
        page = ui_support.fetch(f"{console.url}/runs/{run}").body
        assert re.search(r'<p class="facts waiting" data-held="run">waiting for: debounce customer_id=7: '
                         r'starts in \d+(\.\d)? s unless another arrives</p>', page), page
        listed = ui_support.fetch(f"{console.url}/runs").body
        assert re.search(r'data-waiting-for="debounce customer_id=7: starts in \d+(\.\d)? s unless another '
                         r'arrives"', listed), listed


def test_a_step_completed_from_its_cache_is_marked_cached_on_the_run_page(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("select flowlane.create_flow('docs')")
        conn.execute("select flowlane.add_step('docs', 'embed', step_type => 'map', cache_ttl => 3600)")
        first = conn.execute("select run_id from flowlane.start_flow('docs', '[1, 2]')").fetchone()[0]  # type: ignore[index]
        worker = uuid.uuid4()
        for task in conn.execute("select run_id, step_slug, task_index, attempt from flowlane.claim_tasks("
                                 "'docs', 10, %s, %s) where outcome = 'claimed'",
                                 (worker, Jsonb([["docs", "embed"]]))).fetchall():
            conn.execute("select flowlane.complete_task(%s, %s, %s, %s, %s, %s)",
                         (*task[:3], Jsonb(task[2]), worker, task[3]))
        second = conn.execute("select run_id from flowlane.start_flow('docs', '[2, 1, 3]')").fetchone()[0]  # type: ignore[index]
    with ui_support.ui_server(dsn) as console:
        page = ui_support.fetch(f"{console.url}/runs/{second}").body
        assert '<span class="tag" data-cached="2" ' in page and ">cached 2 of 3</span>" in page, page
        assert "docs · cached" in page
        assert "data-cached" not in ui_support.fetch(f"{console.url}/runs/{first}").body
