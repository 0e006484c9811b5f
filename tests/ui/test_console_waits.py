"""The console's Runs and Run pages say what a run waits for besides flow control (a real
`flowlane ui` process over HTTP), in the words `flowlane runs` and `flowlane run` use: a wait
step's signal, a child run, a started task whose worker's heartbeat is stale."""

from __future__ import annotations

import html
import re
import uuid

import psycopg
import pytest

from tests.ui import ui_support

pytestmark = pytest.mark.slow


def _waiting_cell(page: str, run_id: uuid.UUID) -> str:
    row = re.search(rf'<tr data-run="{run_id}".*?</tr>', page, re.DOTALL)
    assert row is not None, page
    cell = re.search(r'<td class="waiting-cell"[^>]*>(.*?)</td>', row[0], re.DOTALL)
    assert cell is not None, row[0]
    return html.unescape(cell[1])


def test_runs_and_run_pages_say_what_each_run_waits_for(dsn: str) -> None:
    waits = ui_support.seed_waits(dsn)
    reasons = ui_support.wait_reasons(dsn, waits)
    with ui_support.ui_server(dsn) as console:
        runs = ui_support.fetch(console.url + "/runs").body
        assert "<th>waiting for</th>" in runs
        assert _waiting_cell(runs, waits.approval) == reasons["approval"]
        assert _waiting_cell(runs, waits.child) == reasons["child_signal"]
        assert _waiting_cell(runs, waits.parent) == reasons["child"]
        assert _waiting_cell(runs, waits.stale) == reasons["stale"]

        parent = html.unescape(ui_support.fetch(f"{console.url}/runs/{waits.parent}").body)
        assert (f'<p class="facts waiting" data-held="child">waiting for: {reasons["child"]} '
                '<span class="muted">(child)</span></p>') in parent
        assert (f'<p class="facts waiting" data-held="approve">waiting for: {reasons["parent_signal"]} '
                '<span class="muted">(approve)</span></p>') in parent
        stale = html.unescape(ui_support.fetch(f"{console.url}/runs/{waits.stale}").body)
        assert (f'<p class="facts waiting" data-held="work: 1 task">waiting for: {reasons["stale"]} '
                '<span class="muted">(work: 1 task)</span></p>') in stale

        with psycopg.connect(dsn, autocommit=True) as conn:  # a live heartbeat: nothing to wait for
            conn.execute("select flowlane.heartbeat(%s)", (waits.stale_worker,))
        assert 'data-held' not in ui_support.fetch(f"{console.url}/runs/{waits.stale}").body
        runs = ui_support.fetch(console.url + "/runs").body
        assert _waiting_cell(runs, waits.stale) == ""
