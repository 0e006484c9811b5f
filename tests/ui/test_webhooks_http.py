"""`kind: webhook` over real HTTP: uvicorn on a free port, urllib as the sender, a real
database. Both signing schemes: valid, invalid, stale and replayed deliveries; a sender's
retry starting one run; a signal completing a wait step; an oversize body; what the run
and `flowlane webhooks` show."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import uvicorn
from psycopg import sql
from psycopg.conninfo import make_conninfo

from flowlane.cli import main
from flowlane.core import migrator
from flowlane.runtime.webhooks import signed_github, signed_standard
from flowlane.ui import server, webhooks
from tests.cli_support import cli_env, run_flowlane
from tests.runtime.rt_support import wait_until

pytestmark = pytest.mark.slow

STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
GITHUB_SECRET = "it's a secret to everybody"
ENVIRON = {"SHOP_STANDARD_SECRET": STANDARD_SECRET, "SHOP_GITHUB_SECRET": GITHUB_SECRET}

PROJECT = """\
kind: flow
slug: orders_v1
input_schema:
  type: object
  required: [order_id]
  properties:
    order_id: {type: integer}
steps:
  paid:
    type: wait
---
kind: alias
slug: orders
active: orders_v1
---
kind: webhook
name: order_created
scheme: standard
secret_env: SHOP_STANDARD_SECRET
flow: orders
input: {order_id: /data/order_id}
max_body: 1024
---
kind: webhook
name: github_order
scheme: github
secret_env: SHOP_GITHUB_SECRET
flow: orders
input: {order_id: /order/id}
---
kind: webhook
name: payment
scheme: github
secret_env: SHOP_GITHUB_SECRET
flow: orders
signal: {step: paid, run: /run_id}
input: {amount: /amount}
"""


@pytest.fixture
def endpoint(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> Iterator[str]:
    """The project applied to a fresh database and its webhooks served on a free port."""
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "shop.yaml").write_text(PROJECT)
    monkeypatch.chdir(tmp_path)
    assert main(["compile"]) == 0
    assert main(["apply", "--dsn", dsn]) == 0
    capsys.readouterr()
    with serving(webhooks.app(dsn=dsn, project_dir=tmp_path, environ=ENVIRON)) as url:
        yield url


@contextlib.contextmanager
def serving(application: Any) -> Iterator[str]:
    """The application served by uvicorn on a free port, in a thread; its URL."""
    sock = server.bind("127.0.0.1", 0)  # listening before the server runs: no wait for it
    uv = uvicorn.Server(uvicorn.Config(application, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        yield server.url(sock)
    finally:
        uv.should_exit = True
        thread.join()
        sock.close()


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def runs(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("select input, origin, status from flowlane.runs order by started_at").fetchall()


def test_standard_webhooks_valid_retried_invalid_and_stale(endpoint: str, dsn: str) -> None:
    body = json.dumps({"type": "order.created", "data": {"order_id": 7}}).encode()
    headers = signed_standard(STANDARD_SECRET, "msg_1", body)
    status, first = post(endpoint + "order_created", body, headers)
    assert status == 200 and first["existed"] is False and first["flow"] == "orders_v1"
    status, retried = post(endpoint + "order_created", body, headers)  # the sender's retry
    assert status == 200 and retried == {**first, "existed": True}
    assert runs(dsn) == [({"order_id": 7}, {"webhook": "order_created", "delivery": "msg_1"}, "started")]

    wrong_secret = signed_standard("whsec_" + "QUJD" * 8, "msg_2", body)
    assert post(endpoint + "order_created", body, wrong_secret)[0] == 401
    tampered = body.replace(b"7", b"8")
    signed_other_body = signed_standard(STANDARD_SECRET, "msg_3", body)
    assert post(endpoint + "order_created", tampered, signed_other_body)[0] == 401
    stale = signed_standard(STANDARD_SECRET, "msg_4", body, at=datetime.now(UTC) - timedelta(minutes=10))
    status, answer = post(endpoint + "order_created", body, stale)
    assert status == 401 and "too old" in answer["error"]
    assert post(endpoint + "order_created", body, {})[0] == 401
    assert len(runs(dsn)) == 1


def test_github_valid_replayed_and_invalid(endpoint: str, dsn: str) -> None:
    body = json.dumps({"action": "opened", "order": {"id": 11}}).encode()
    headers = signed_github(GITHUB_SECRET, "72d3162e-cc78-11e3-81ab-4c9367dc0958", body)
    status, first = post(endpoint + "github_order", body, headers)
    assert status == 200 and first["existed"] is False
    # GitHub signs no timestamp: a replay of a recorded delivery, however late, finds its run
    status, replayed = post(endpoint + "github_order", body, headers)
    assert status == 200 and replayed["run_id"] == first["run_id"] and replayed["existed"] is True
    forged = {**headers, "x-github-delivery": "another", "x-hub-signature-256": "sha256=" + "0" * 64}
    assert post(endpoint + "github_order", body, forged)[0] == 401
    other_secret = signed_github("not the secret", "another", body)
    assert post(endpoint + "github_order", body, other_secret)[0] == 401
    zen = b'{"zen": "Keep it logically awesome."}'
    ping = signed_github(GITHUB_SECRET, "ping-1", zen, event="ping")
    assert post(endpoint + "github_order", zen, ping) == (200, {"ping": "ok"})
    assert [origin for _input, origin, _status in runs(dsn)] == [
        {"webhook": "github_order", "delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}]


def test_a_webhook_signal_completes_the_wait_step_once(endpoint: str, dsn: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    body = json.dumps({"data": {"order_id": 3}}).encode()
    started = post(endpoint + "order_created", body, signed_standard(STANDARD_SECRET, "msg_9", body))
    run_id = started[1]["run_id"]
    paid = json.dumps({"run_id": run_id, "amount": 1250}).encode()
    headers = signed_github(GITHUB_SECRET, "delivery-paid", paid)
    assert post(endpoint + "payment", paid, headers) == (
        200, {"run_id": run_id, "step": "paid", "existed": False})
    assert post(endpoint + "payment", paid, headers) == (  # GitHub's redelivery
        200, {"run_id": run_id, "step": "paid", "existed": True})
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select status from flowlane.runs").fetchall() == [("completed",)]
        assert conn.execute("select output from flowlane.all_step_states").fetchone() == (
            {"amount": 1250, "by": "webhook payment delivery delivery-paid"},)
    another = signed_github(GITHUB_SECRET, "delivery-late", paid)  # a second payment: the run ended
    status, answer = post(endpoint + "payment", paid, another)
    assert status == 422 and "completed" in answer["error"]

    assert main(["run", run_id, "--dsn", dsn]) == 0
    assert "by        webhook order_created (delivery msg_9)" in capsys.readouterr().out
    assert main(["webhooks", "--dsn", dsn]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:6] for line in lines[1:]] == [
        ["github_order", "github", "run", "orders", "0", "0"],
        ["order_created", "standard", "run", "orders", "1", "0"],
        ["payment", "github", "signal", "orders.paid", "0", "1"],
    ]


def test_oversize_refused_and_inputs_the_flow_refuses(endpoint: str, dsn: str) -> None:
    big = json.dumps({"data": {"order_id": 1, "pad": "x" * 2000}}).encode()
    status, answer = post(endpoint + "order_created", big, signed_standard(STANDARD_SECRET, "msg_big", big))
    assert status == 413 and "1024 bytes" in answer["error"]
    wrong = json.dumps({"data": {"order_id": "seven"}}).encode()
    status, answer = post(endpoint + "order_created", wrong, signed_standard(STANDARD_SECRET, "msg_w", wrong))
    assert status == 422 and "/order_id" in answer["error"]
    assert post(endpoint + "nothing_here", b"{}", {})[0] == 404
    assert runs(dsn) == []


def test_a_server_without_a_secret_refuses_to_start(dsn: str) -> None:
    from flowlane import errors
    from flowlane.compiler import api

    project = api.project_from_text(PROJECT)
    with pytest.raises(errors.UsageError, match=r"\$SHOP_GITHUB_SECRET"):
        webhooks.app(project, dsn=dsn, environ={"SHOP_STANDARD_SECRET": STANDARD_SECRET})


def test_flowlane_webhooks_serve(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The command for a project without a web application: the address it prints answers."""
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "shop.yaml").write_text(PROJECT)
    monkeypatch.chdir(tmp_path)
    assert main(["compile"]) == 0 and main(["apply", "--dsn", dsn]) == 0
    capsys.readouterr()
    missing = run_flowlane("webhooks", "serve", "--dsn", dsn, cwd=tmp_path)
    assert missing.returncode != 0 and "$SHOP_GITHUB_SECRET, $SHOP_STANDARD_SECRET" in missing.stderr
    serving = subprocess.Popen([sys.executable, "-m", "flowlane", "webhooks", "serve", "--port", "0",
                                "--dsn", dsn], cwd=tmp_path, env=cli_env(**ENVIRON),
                               stdout=subprocess.PIPE, text=True)
    try:
        assert serving.stdout is not None
        line = serving.stdout.readline()
        assert "/github_order, /order_created, /payment" in line, line
        url = line.split("serving ", 1)[1].split(" ", 1)[0]
        body = json.dumps({"order": {"id": 5}}).encode()
        status, answer = post(url + "github_order", body, signed_github(GITHUB_SECRET, "d-5", body))
        assert status == 200 and answer["existed"] is False
    finally:
        serving.terminate()
        serving.wait(timeout=60)
    origins = [origin for _input, origin, _status in runs(dsn)]
    assert origins == [{"webhook": "github_order", "delivery": "d-5"}]


def test_a_delivery_racing_its_own_retry_starts_one_run(endpoint: str, dsn: str) -> None:
    """Two deliveries with one id at once: the second waits for the first's key and, once the
    first commits, answers with its run."""
    body = json.dumps({"data": {"order_id": 21}}).encode()
    headers = signed_standard(STANDARD_SECRET, "msg_race", body)
    answers: list[tuple[int, Any]] = []
    with psycopg.connect(dsn) as first:  # the first delivery, its transaction held open
        first.execute("select set_config('flowlane.origin', %s, true)",
                      (json.dumps({"webhook": "order_created", "delivery": "msg_race"}),))
        run_id = first.execute("select run_id::text from flowlane.start_flow('orders', '{\"order_id\": 21}', "
                               "idempotency_key => 'order_created:msg_race')").fetchone()
        second = threading.Thread(target=lambda: answers.append(
            post(endpoint + "order_created", body, headers)))
        second.start()
        with psycopg.connect(dsn, autocommit=True) as watcher:  # the second waits on the key
            wait_until(lambda: watcher.execute(
                "select 1 from pg_stat_activity where wait_event_type = 'Lock' "
                "and query like '%%start_flow%%' and pid <> pg_backend_pid()").fetchone())
        assert answers == []
        first.commit()
        second.join()
    assert run_id is not None
    assert answers == [(200, {"run_id": run_id[0], "flow": "orders_v1", "existed": True})]
    assert runs(dsn) == [({"order_id": 21}, {"webhook": "order_created", "delivery": "msg_race"}, "started")]


def test_the_webhook_server_needs_no_more_than_the_admin_role(dsn: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Started and signalled by a login that is only a member of flowlane_admin
    (docs/security.md), its retry recognised too."""
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "shop.yaml").write_text(PROJECT)
    monkeypatch.chdir(tmp_path)
    name, password = f"fl_webhooks_{secrets.token_hex(4)}", secrets.token_hex(12)  # roles: per cluster
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrator.migrate(conn, roles=True)
        conn.execute(sql.SQL("create role {} login password {} in role flowlane_admin").format(
            sql.Identifier(name), sql.Literal(password)))
    admin = make_conninfo(dsn, user=name, password=password)
    try:
        assert main(["compile"]) == 0 and main(["apply", "--dsn", admin]) == 0
        with serving(webhooks.app(dsn=admin, project_dir=tmp_path, environ=ENVIRON)) as url:
            body = json.dumps({"data": {"order_id": 9}}).encode()
            status, started = post(url + "order_created", body, signed_standard(STANDARD_SECRET, "m", body))
            assert status == 200
            paid = json.dumps({"run_id": started["run_id"], "amount": 1}).encode()
            headers = signed_github(GITHUB_SECRET, "p", paid)
            assert post(url + "payment", paid, headers)[1]["existed"] is False
            assert post(url + "payment", paid, headers)[1]["existed"] is True
        assert [status for _input, _origin, status in runs(dsn)] == ["completed"]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))
