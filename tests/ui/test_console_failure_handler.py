"""The console's run page links a failed run with its failure handler's run and its
compensations' runs, both ways (a real `flowlane ui` process over HTTP)."""

from __future__ import annotations

import html

import psycopg
import pytest

from tests.core.engine import Engine
from tests.ui import ui_support

pytestmark = pytest.mark.slow


def test_the_run_page_links_a_failed_run_its_failure_handler_and_compensations(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("undo_order", [("report", [], {})])
        engine.define("orders", [("reserve", [], {"compensate": "undo_order"}),
                                 ("charge", ["reserve"], {"max_attempts": 1})], on_failure="undo_order")
        run_id = engine.start("orders", {})
        (task,) = engine.claim("orders")
        engine.complete(task, {})
        (task,) = engine.claim("orders")
        engine.fail(task, "card declined")
        handler_id = engine.scalar("select run_id from flowlane.runs where failure_of = %s", (run_id,))
        undo_id = engine.scalar("select run_id from flowlane.runs where compensation_of = %s", (run_id,))
    with ui_support.ui_server(dsn) as console:
        failed = html.unescape(ui_support.fetch(f"{console.url}/runs/{run_id}").body)
        assert (f'<p class="facts" id="failure-handler">failure handler: run <a class="mono" '
                f'href="/runs/{handler_id}">{handler_id}</a> (undo_order, '
                '<span class="status-started">started</span>)</p>') in failed
        assert ('<p class="facts" id="compensation">compensation running: '
                '<span data-compensation="reserve">reserve '
                f'<a class="mono status-started" href="/runs/{undo_id}">started</a></span></p>') in failed
        undo = html.unescape(ui_support.fetch(f"{console.url}/runs/{undo_id}").body)
        assert (f'<p class="facts" id="compensation-of">undoes step reserve of run <a class="mono" '
                f'href="/runs/{run_id}">{run_id}</a> (orders, failed)</p>') in undo
        handler = html.unescape(ui_support.fetch(f"{console.url}/runs/{handler_id}").body)
        assert (f'<p class="facts" id="failure-of">handles the failure of run <a class="mono" '
                f'href="/runs/{run_id}">{run_id}</a> (orders, failed)</p>') in handler
