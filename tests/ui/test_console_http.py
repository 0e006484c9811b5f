"""`flowlane ui` over real HTTP: pages, filters, keyset paging, payload limits, the token and
loopback rules, CSRF on actions. The server is a real `python -m flowlane ui` process."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.cli_support import run_flowlane
from tests.core.engine import Engine
from tests.ui import ui_support

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def console(seeded_db: tuple[str, ui_support.Seeded]) -> Iterator[ui_support.UiServer]:
    with ui_support.ui_server(seeded_db[0]) as server:
        yield server


def _run_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-run="([0-9a-f-]{36})"', html)


def test_every_page_renders(console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    seeded = seeded_db[1]
    flows = ui_support.fetch(console.url + "/flows")
    assert flows.status == 200
    for slug in ("orders_v1", "orders_v2", "ping"):
        assert f'<tr data-flow="{slug}">' in flows.body
    assert "orders (active)" in flows.body and "orders (draining)" in flows.body
    flow = ui_support.fetch(console.url + "/flows/orders_v2")
    assert flow.status == 200 and "alias <b>orders</b>: active" in flow.body
    assert 'id="input-schema"' not in flow.body  # no contract, no section
    ping = ui_support.fetch(console.url + "/flows/ping").body
    assert re.search(r'<pre id="input-schema" class="mono">\{\s*"properties": \{\s*"note"', ping), ping
    assert '<td class="mono contract">{"properties": {"pong": {"const": true}}' in ping, ping
    queues = ui_support.fetch(console.url + "/queues")
    assert queues.status == 200
    assert re.search(r'<tr data-queue="ping">.*?owned by <a href="/flows/ping">', queues.body, re.DOTALL)
    with psycopg.connect(seeded_db[0]) as conn:
        completed = conn.execute("select count(*) from flowlane.step_tasks where queue_name = 'pricing' "
                                 "and completed_at > now() - interval '15 minutes'").fetchone()
    assert completed is not None and completed[0] > 0
    assert re.search(rf'<tr data-queue="pricing">.*?aria-label="{completed[0]} completed in 15 min"',
                     queues.body, re.DOTALL)
    workers = ui_support.fetch(console.url + "/workers").body
    assert re.findall(r'data-state="(\w+)"', workers) == ["live", "stale", "stopped"]
    assert re.findall(r'data-deployment="(\w+)" data-enabled="(\w+)"', workers) == [
        ("intake_workers", "true"), ("notify_workers", "false"), ("pricing_workers", "true")]
    assert "unsupported work on queue notify: message 7 (orders_v3, notify)" in workers
    assert "orders_v2.price" in workers  # the pairs a worker recorded
    for run in (seeded.completed, seeded.failed, seeded.queued, seeded.running):
        assert ui_support.fetch(f"{console.url}/runs/{run}").status == 200
    # a wait has a reason on the page: the queue ping has no live worker
    queued = ui_support.fetch(f"{console.url}/runs/{seeded.queued}").body
    assert ("waiting: queue ping: 1 queued task(s); no live worker serves queue ping; "
            "`flowlane serve` or `flowlane worker --queue ping`") in queued
    assert 'data-waiting="1"' not in ui_support.fetch(f"{console.url}/runs/{seeded.completed}").body
    assert '<p class="facts" id="run-origin">started by a call (start_flow, flowlane start)</p>' in queued
    assert ui_support.fetch(console.url + "/").headers["location"] == "/runs"
    for missing in ("/flows/nope", "/runs/00000000-0000-0000-0000-000000000000", "/runs/not-a-uuid"):
        assert ui_support.fetch(console.url + missing).status == 404


def test_a_run_page_takes_a_unique_prefix_of_the_run_id(
        console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    run_id = str(seeded_db[1].completed)
    # run ids are time-ordered: their first 12 hex digits are the start's millisecond, which
    # the seeded runs may share; a prefix that reaches into the random part names one run
    for shown, suffix in ((run_id[:23], ""), (run_id[:21].upper(), "/live")):
        moved = ui_support.fetch(f"{console.url}/runs/{shown}{suffix}")
        assert (moved.status, moved.headers["location"]) == (303, f"/runs/{run_id}{suffix}")
    assert ui_support.fetch(f"{console.url}{moved.headers['location']}").status == 200
    unknown = "0000" if not run_id.startswith("0000") else "ffff"
    missing = ui_support.fetch(f"{console.url}/runs/{unknown}")
    assert missing.status == 404 and f"no run starts with {unknown}" in missing.body
    malformed = ui_support.fetch(f"{console.url}/runs/xyz")
    assert malformed.status == 404 and "is not a run id" in malformed.body


def test_runs_filter_by_status_alias_and_time(
        console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    seeded = seeded_db[1]

    def ids(**filters: str) -> set[str]:
        reply = ui_support.fetch(f"{console.url}/runs?{urlencode(filters)}")
        assert reply.status == 200, reply.body
        return set(_run_ids(reply.body))

    assert ids(status="failed") == {str(seeded.failed)}
    assert ids(flow="ping") == {str(seeded.queued)}
    # an alias stands for every version it named: active orders_v2 and draining orders_v1
    assert ids(flow="orders") == {str(r) for r in (seeded.completed, seeded.skipped_notify,
                                                   seeded.failed, seeded.running)}
    assert ids(flow="orders_v2", status="completed") == {str(seeded.skipped_notify)}
    assert ids(since="2999-01-01T00:00:00") == set()
    assert ids(until="2000-01-01T00:00:00") == set()
    assert len(ids(since="2000-01-01T00:00:00")) == 5
    assert ui_support.fetch(console.url + "/runs?since=yesterday").status == 400


def test_keyset_pages_cover_every_run_once_newest_first(cluster: object) -> None:
    dsn = cluster.clone()  # type: ignore[attr-defined]
    ui_support.apply_flows(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        started = [engine.start("ping", {"n": n}) for n in range(7)]
        # three runs share one start time: the run id breaks the tie
        conn.execute("update flowlane.runs set started_at = '2026-01-01T00:00:00Z' where run_id = any(%s)",
                     (started[2:5],))
        expected = [str(r[0]) for r in conn.execute(
            "select run_id from flowlane.runs order by started_at desc, run_id desc")]
    with ui_support.ui_server(dsn) as server:
        seen: list[str] = []
        url: str | None = "/runs?limit=3"
        while url:
            reply = ui_support.fetch(server.url + url)
            seen += _run_ids(reply.body)
            found = re.search(r'<a href="([^"]+)" id="older">', reply.body)
            url = found[1].replace("&amp;", "&") if found else None
        assert seen == expected


def test_payloads_are_served_on_demand_within_a_size_limit(
        console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    dsn, seeded = seeded_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        big = Engine(conn).start("ping", {"blob": "x" * 100_000})
        conn.execute("update flowlane.runs set input = %s where run_id = %s",
                     (Jsonb({"blob": "x" * 100_000}), big))
    reply = ui_support.fetch(f"{console.url}/runs/{big}/payload?what=input")
    assert reply.status == 200
    assert int(reply.headers["x-total-bytes"]) == len('{"blob": ""}') + 100_000
    assert reply.body.startswith('{"blob": "xxx')
    assert "truncated: 97.7 KiB in all, first 65536 characters" in reply.body
    run_page = ui_support.fetch(f"{console.url}/runs/{big}").body
    assert "x" * 1000 not in run_page  # the page itself never inlines payloads
    step = ui_support.fetch(f"{console.url}/runs/{seeded.completed}/payload?what=output&step=fetch")
    assert step.body == "[10, 20]"
    task = ui_support.fetch(f"{console.url}/runs/{seeded.completed}/payload?what=output&step=price&task=1")
    assert task.body == "40"
    assert ui_support.fetch(f"{console.url}/runs/{seeded.completed}/payload?what=secrets").status == 400


def test_read_only_console_has_no_action_routes(
        console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    seeded = seeded_db[1]
    assert "read-only" in console.banner
    page = ui_support.fetch(f"{console.url}/runs/{seeded.queued}").body
    assert "/actions/" not in page
    reply = ui_support.fetch(f"{console.url}/actions/cancel", "POST", body=f"run_id={seeded.queued}")
    assert reply.status in (404, 405)


def test_actions_refuse_a_post_without_the_sessions_csrf_token(
        seeded_db: tuple[str, ui_support.Seeded]) -> None:
    dsn = seeded_db[0]
    with ui_support.ui_server(dsn, "--allow-actions") as server:
        assert "actions enabled" in server.banner
        confirm = ui_support.fetch(
            f"{server.url}/actions/set_deployment_enabled?deployment=pricing_workers&enabled=false&back=/workers")
        assert confirm.status == 200
        session = confirm.headers["set-cookie"].split(";")[0]
        csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', confirm.body)
        assert csrf is not None
        form = "deployment=pricing_workers&enabled=false&reason=test"
        cookie = {"Cookie": session}
        for body, headers in ((form, cookie),                                     # no token
                              (f"{form}&csrf={'0' * 64}", cookie),                 # a wrong one
                              (f"{form}&csrf={csrf[1]}", {}),                      # another session
                              (f"{form}&csrf={csrf[1]}", {**cookie, "Origin": "http://evil.example"})):
            reply = ui_support.fetch(f"{server.url}/actions/set_deployment_enabled", "POST", body=body,
                                     headers=headers)
            assert reply.status == 403, (body, headers)
            assert _enabled(dsn, "pricing_workers")
        accepted = ui_support.fetch(f"{server.url}/actions/set_deployment_enabled", "POST",
                                    body=f"{form}&csrf={csrf[1]}", headers=cookie)
        assert accepted.status == 200
        assert not _enabled(dsn, "pricing_workers")
        unknown = ui_support.fetch(f"{server.url}/actions/set_deployment_enabled", "POST",
                                   body=f"deployment=nope&enabled=true&csrf={csrf[1]}", headers=cookie)
        assert unknown.status == 409 and "unknown worker deployment" in unknown.body
        refused = ui_support.fetch(f"{server.url}/actions/retry", "POST",
                                   body=f"run_id={seeded_db[1].completed}&csrf={csrf[1]}", headers=cookie)
        assert refused.status == 409 and "only a failed run can be retried" in refused.body


def _enabled(dsn: str, deployment: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select enabled from flowlane.worker_deployments where deployment_name = %s",
                           (deployment,)).fetchone()
    assert row is not None
    return bool(row[0])


def test_token_is_required_on_every_request_when_set(seeded_db: tuple[str, ui_support.Seeded]) -> None:
    token = "t0ken-for-tests"
    # 0.0.0.0 is not loopback: the token rule applies; the test reaches it through 127.0.0.1
    with ui_support.ui_server(seeded_db[0], "--host", "0.0.0.0", env={"FLOWLANE_UI_TOKEN": token}) as server:
        assert "token required" in server.banner
        url = server.url.replace("0.0.0.0", "127.0.0.1")
        payload = f"/runs/{seeded_db[1].failed}/payload?what=input"
        for path in ("/runs", "/flows", "/static/console.js", payload):
            assert ui_support.fetch(url + path).status == 401, path
        assert ui_support.fetch(url + "/runs", headers={"Authorization": "Bearer wrong"}).status == 401
        assert ui_support.fetch(url + "/runs", headers={"Authorization": f"Bearer {token}"}).status == 200
        given = ui_support.fetch(f"{url}/runs?status=failed&token={token}")
        assert given.status == 303 and given.headers["location"] == "/runs?status=failed"
        cookie = given.headers["set-cookie"].split(";")[0]
        assert cookie == f"flowlane_token={token}"
        assert ui_support.fetch(url + "/queues", headers={"Cookie": cookie}).status == 200


def test_loopback_console_answers_only_to_loopback_host_names(console: ui_support.UiServer) -> None:
    # a page that DNS-rebinds evil.example to 127.0.0.1 must not read the console
    assert ui_support.fetch(console.url + "/runs", headers={"Host": "evil.example"}).status == 421
    port = console.url.rsplit(":", 1)[1]
    assert ui_support.fetch(console.url + "/runs", headers={"Host": f"localhost:{port}"}).status == 200


def test_security_headers(console: ui_support.UiServer) -> None:
    headers = ui_support.fetch(console.url + "/runs").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert "httponly" in headers["set-cookie"].lower() and "samesite=strict" in headers["set-cookie"].lower()


def test_unreachable_database_and_unmigrated_database_are_clear_errors(
        db_factory: Callable[..., str], tmp_path: Path) -> None:
    down = run_flowlane("ui", "--port", "0", "--dsn", "postgresql://nobody@127.0.0.1:1/none", cwd=tmp_path)
    assert down.returncode == 1 and down.stderr.startswith("error: cannot connect to")
    for version in ("none", "0002"):  # nothing migrated; the original core
        behind = run_flowlane("ui", "--port", "0", "--dsn", db_factory(version), cwd=tmp_path)
        assert behind.returncode == 1, behind.stderr
        assert "0003_release_0_1_0.sql" in behind.stderr and "`flowlane db migrate`" in behind.stderr
        assert "Traceback" not in behind.stderr
    assert "Traceback" not in down.stderr


def test_queues_page_tells_pgmq_only_queues_from_adopted_ones(
        console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    with psycopg.connect(seeded_db[0], autocommit=True) as conn:
        conn.execute("select pgmq.create('legacy_jobs')")
        before = ui_support.fetch(console.url + "/queues").body
        conn.execute("select flowlane.adopt_queue('legacy_jobs')")
    after = ui_support.fetch(console.url + "/queues").body
    row = r'<tr data-queue="legacy_jobs">.*?</tr>'
    found_before, found_after = re.search(row, before, re.DOTALL), re.search(row, after, re.DOTALL)
    assert found_before and "not adopted" in found_before[0] and "flowlane queue adopt" in found_before[0]
    assert found_after and "not adopted" not in found_after[0] and "shared" in found_after[0]
    assert "(adopted " in found_after[0]


def test_a_failed_runs_unstarted_steps_say_the_run_failed_first_in_the_console_and_cli(
        console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded],
        tmp_path: Path) -> None:
    dsn, seeded = seeded_db
    with psycopg.connect(dsn) as conn:
        unstarted = [slug for (slug,) in conn.execute(
            "select step_slug from flowlane.all_step_states where run_id = %s and status = 'cancelled'"
            " and started_at is null order by step_slug", (seeded.failed,))]
    assert unstarted  # the steps after the failed one end with the run
    page = ui_support.fetch(f"{console.url}/runs/{seeded.failed}").body
    for slug in unstarted:
        row = re.search(rf'<tr id="step-{slug}" data-step="{slug}" data-status="cancelled">.*?</tr>',
                        page, re.DOTALL)
        assert row is not None and "not started: the run failed first" in row.group(0), slug
    assert "waiting for" not in page
    shown = run_flowlane("run", str(seeded.failed), "--dsn", dsn, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    for slug in unstarted:
        [line] = [x for x in shown.stdout.splitlines() if x.split()[:1] == [slug]]
        assert "cancelled" in line and "not started: the run failed first" in line, shown.stdout
    assert "waiting" not in shown.stdout + shown.stderr


def test_metrics_and_probes(console: ui_support.UiServer,
                            seeded_db: tuple[str, ui_support.Seeded]) -> None:
    with psycopg.connect(seeded_db[0], autocommit=True) as conn:  # other tests add ping runs
        row = conn.execute("select count(*) from flowlane.step_tasks "
                           "where queue_name = 'ping' and status in ('queued', 'started')").fetchone()
    assert row is not None and row[0] >= 1
    metrics = ui_support.fetch(console.url + "/metrics")
    assert metrics.status == 200
    assert f'flowlane_queue_depth{{queue="ping"}} {float(row[0])}' in metrics.body
    assert 'flowlane_disabled_deployments{queue="notify"} 1.0' in metrics.body
    assert "flowlane_database_up 1.0" in metrics.body
    assert ui_support.fetch(console.url + "/healthz").body == "ok\n"
    ready = ui_support.fetch(console.url + "/readyz")
    assert (ready.status, ready.body) == (200, "ready\n")
