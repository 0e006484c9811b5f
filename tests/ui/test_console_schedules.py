"""The console's schedules page and its actions, and the console's own maintenance tick, on a
real `python -m flowlane ui` process."""

from __future__ import annotations

import json
import re

import psycopg
import pytest

from tests.core.engine import Engine
from tests.runtime.rt_support import wait_until
from tests.ui import ui_support

pytestmark = pytest.mark.slow


def _setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        Engine(conn).define("reports", [("build", [], {})])
        conn.execute("select flowlane.set_schedule('hourly_report', 'reports', '{\"kind\": \"hourly\"}', "
                     "every_seconds => 3600)")


def _scheduled_runs(dsn: str) -> list[tuple[object, object]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("select schedule_name, schedule_slot from flowlane.runs "
                            "where schedule_name is not null order by started_at").fetchall()


def test_schedules_page_actions_and_the_consoles_tick(dsn: str) -> None:
    _setup(dsn)
    with ui_support.ui_server(dsn, "--allow-actions") as server:
        page = ui_support.fetch(server.url + "/schedules").body
        assert '<tr data-schedule="hourly_report" data-paused="false">' in page
        assert "every 3600 s" in page and "action-pause-hourly_report" in page

        confirm = ui_support.fetch(
            f"{server.url}/actions/pause_schedule?schedule=hourly_report&back=/schedules")
        assert confirm.status == 200 and "Pause schedule hourly_report?" in confirm.body
        cookie = {"Cookie": confirm.headers["set-cookie"].split(";")[0]}
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', confirm.body)
        assert csrf is not None
        refused = ui_support.fetch(f"{server.url}/actions/pause_schedule", "POST",
                                   body="schedule=hourly_report", headers=cookie)
        assert refused.status == 403
        paused = ui_support.fetch(f"{server.url}/actions/pause_schedule", "POST",
                                  body=f"schedule=hourly_report&reason=audit&csrf={csrf[1]}", headers=cookie)
        assert paused.status == 200
        page = ui_support.fetch(server.url + "/schedules").body
        assert 'data-paused="true"' in page and "audit" in page and "action-resume-hourly_report" in page

        ran = ui_support.fetch(f"{server.url}/actions/trigger_schedule", "POST",
                               body=f"schedule=hourly_report&csrf={csrf[1]}", headers=cookie)
        assert ran.status == 200
        assert _scheduled_runs(dsn) == [("hourly_report", None)]  # a trigger has no slot

        resumed = ui_support.fetch(f"{server.url}/actions/resume_schedule", "POST",
                                   body=f"schedule=hourly_report&csrf={csrf[1]}", headers=cookie)
        assert resumed.status == 200
        # the slot comes due (moved into the past): the console's own tick fires it
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("select flowlane.cancel_run(run_id) from flowlane.runs")  # no overlap
            conn.execute("update flowlane.schedules set next_slot = date_trunc('hour', now())")
        wait_until(lambda: len(_scheduled_runs(dsn)) == 2, timeout=30,
                   message="the console's tick to fire the due slot")
        assert _scheduled_runs(dsn)[1][1] is not None

        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("select extract(epoch from last_slot)::float8, "
                               "extract(epoch from next_slot)::float8 from flowlane.schedules").fetchone()
        assert row is not None
        metrics = ui_support.fetch(server.url + "/metrics").body
        assert 'flowlane_schedule_paused{schedule="hourly_report"} 0.0' in metrics
        for name, value in zip(("last", "next"), row, strict=True):
            line = f'flowlane_schedule_{name}_slot_timestamp_seconds{{schedule="hourly_report"}} '
            assert float(metrics.split(line, 1)[1].split()[0]) == value, metrics


def test_the_schedules_page_lists_triggers_with_what_they_started(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        Engine(conn).define("orders", [("charge", [], {})])
        conn.execute("select flowlane.set_contract('orders', null, "
                     "'{\"properties\": {\"id\": {\"minimum\": 1}}}')")
        conn.execute("create table public.orders (id int primary key)")
        conn.execute("select flowlane.set_trigger('order_placed', 'orders', 'public.orders', "
                     "array['insert'], on_refused => 'record')")
        conn.execute("insert into public.orders values (1), (2), (0)")
    with ui_support.ui_server(dsn) as server:
        page = ui_support.fetch(server.url + "/schedules").body
    assert '<tr data-trigger="order_placed" data-runs="2" data-refusals="1">' in page, page
    assert "insert of public.orders" in page and "/id: " in page


def test_the_schedules_page_lists_what_webhooks_started(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        Engine(conn).define("orders", [("charge", [], {})])
        for delivery in ("d-1", "d-2"):  # as the webhook server starts a run: the origin set first
            with conn.transaction():
                origin = json.dumps({"webhook": "order_placed", "delivery": delivery})
                conn.execute("select set_config('flowlane.origin', %s, true)", (origin,))
                conn.execute("select flowlane.start_flow('orders', '{}')")
        conn.execute("select flowlane.start_flow('orders', '{}')")  # a call: no origin
        assert conn.execute("select origin from flowlane.runs order by started_at").fetchall() == [
            ({"webhook": "order_placed", "delivery": "d-1"},),
            ({"webhook": "order_placed", "delivery": "d-2"},), (None,)]
    with ui_support.ui_server(dsn) as server:
        page = ui_support.fetch(server.url + "/schedules").body
    assert '<tr data-webhook="order_placed" data-runs="2" data-signals="0">' in page, page
