"""The console in a real headless Chromium against a real database with runs in every state."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.core.engine import Engine
from tests.ui import ui_support

WAIT = 20.0  # seconds a condition may take to appear; polling, never a fixed sleep


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with ui_support.browser() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def console(seeded_db: tuple[str, ui_support.Seeded]) -> Iterator[ui_support.UiServer]:
    with ui_support.ui_server(seeded_db[0], "--refresh", "0.2") as server:
        yield server


def _statuses(driver: Any) -> dict[str, str]:
    # read in one script: the live region may be swapped between two element lookups
    rows: list[list[str]] = driver.execute_script(
        "return [...document.querySelectorAll('#runs-body tr[data-run]')]"
        ".map(r => [r.dataset.run, r.dataset.status])")
    return dict(rows)


@pytest.mark.slow
def test_runs_page_lists_every_state_and_updates_when_a_run_finishes(
        driver: Any, console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    dsn, seeded = seeded_db
    driver.get(console.url + "/runs")
    assert _statuses(driver) == {
        str(seeded.completed): "completed", str(seeded.skipped_notify): "completed",
        str(seeded.failed): "failed", str(seeded.queued): "started", str(seeded.running): "started",
    }
    marker = driver.execute_script("window.flowlaneMarker = 1; return window.flowlaneMarker")

    ui_support.finish(dsn, seeded)

    WebDriverWait(driver, WAIT).until(lambda d: _statuses(d)[str(seeded.running)] == "completed")
    # the same document, updated in place: no reload happened
    assert driver.execute_script("return window.flowlaneMarker") == marker


@pytest.mark.slow
def test_run_page_shows_the_failed_step_error_and_colours_the_graph(
        driver: Any, console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    seeded = seeded_db[1]
    driver.get(f"{console.url}/runs/{seeded.failed}")
    assert driver.find_element(By.ID, "run-status").text == "failed"
    error = driver.find_element(By.CSS_SELECTOR, "tr[data-error-for='price'] pre.error").text
    assert error == ui_support.PRICE_ERROR
    attempt = driver.find_element(By.CSS_SELECTOR, "tr[data-attempts-for='price'] tr[data-attempt='1/1']")
    assert attempt.find_element(By.CSS_SELECTOR, "pre.error").text == ui_support.PRICE_ERROR
    attempt.find_element(By.CSS_SELECTOR, "details.traceback summary").click()
    traceback = attempt.find_element(By.CSS_SELECTOR, "details.traceback pre").text
    assert traceback.startswith("Traceback (most recent call last):")
    assert 'raise ValueError(f"line {line} has a negative price ({value})")' in traceback
    nodes = {n.get_attribute("data-step"): n.get_attribute("data-status")
             for n in driver.find_elements(By.CSS_SELECTOR, "svg.graph g.node")}
    assert nodes == {"fetch": "completed", "audit": "completed", "price": "failed",
                     "notify": "skipped", "report": "cancelled"}  # ended with the run, never started
    failed_task = driver.find_element(By.CSS_SELECTOR, "tr[data-task='price/1']")
    assert failed_task.get_attribute("data-status") == "failed"

    payload = driver.find_element(By.CSS_SELECTOR, "details.payload[data-src$='what=input']")
    payload.find_element(By.TAG_NAME, "summary").click()
    pre = payload.find_element(By.TAG_NAME, "pre")
    WebDriverWait(driver, WAIT).until(lambda d: pre.text == '{"order": 3}')


@pytest.mark.slow
def test_run_page_follows_a_running_run_until_it_ends(
        driver: Any, console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    def status(d: Any) -> list[str]:
        # one script: the region is replaced while we look
        found: list[str] = d.execute_script(
            "return [document.getElementById('run-status').textContent,"
            " document.querySelector('svg.graph g.node').dataset.status]")
        return found

    dsn = seeded_db[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        run_id = engine.start("ping", {"late": True})
        driver.get(f"{console.url}/runs/{run_id}")
        assert status(driver) == ["started", "started"]
        # this run's message only: the seeded queued run on the same queue stays queued
        engine.complete(ui_support.claim_only(engine, "ping", run_id), {"pong": True})

    WebDriverWait(driver, WAIT).until(lambda d: status(d) == ["completed", "completed"])


@pytest.mark.slow
def test_flow_graph_has_one_node_per_step_and_one_lane_per_queue(
        driver: Any, console: ui_support.UiServer) -> None:
    driver.get(console.url + "/flows/orders_v1")
    svg = driver.find_element(By.CSS_SELECTOR, "svg.graph")
    lanes = [lane.get_attribute("data-queue") for lane in svg.find_elements(By.CSS_SELECTOR, "g.lane")]
    assert lanes == ["intake", "pricing", "notify"]
    nodes = {n.get_attribute("data-step"): n for n in svg.find_elements(By.CSS_SELECTOR, "g.node")}
    assert sorted(nodes) == ["audit", "fetch", "notify", "price", "report"]
    assert {s: n.get_attribute("data-queue") for s, n in nodes.items()} == {
        "fetch": "intake", "price": "pricing", "audit": "intake", "notify": "notify", "report": "intake"}
    assert "map" in nodes["price"].get_attribute("class").split()
    assert len(nodes["price"].find_elements(By.CSS_SELECTOR, ".box")) == 3  # stacked boxes
    assert "conditional" in nodes["notify"].get_attribute("class").split()
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to"))
             for e in svg.find_elements(By.CSS_SELECTOR, "path.edge")}
    assert edges == {("fetch", "price"), ("fetch", "audit"), ("audit", "notify"),
                     ("price", "report"), ("audit", "report")}
    # every node is drawn inside its own lane's band
    bands = {lane.get_attribute("data-queue"): lane.find_element(By.TAG_NAME, "rect").rect
             for lane in svg.find_elements(By.CSS_SELECTOR, "g.lane")}
    for node in nodes.values():
        box, band = node.find_element(By.CSS_SELECTOR, ".box:not(.behind)").rect, bands[
            node.get_attribute("data-queue")]
        assert band["y"] <= box["y"] and box["y"] + box["height"] <= band["y"] + band["height"]


@pytest.mark.slow
def test_actions_are_absent_without_allow_actions(
        driver: Any, console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    seeded = seeded_db[1]
    for page in (f"/runs/{seeded.failed}", f"/runs/{seeded.queued}", "/workers"):
        driver.get(console.url + page)
        assert driver.find_elements(By.CSS_SELECTOR, "#actions, .action") == [], page
    driver.get(f"{console.url}/actions/set_deployment_enabled?deployment=intake_workers&enabled=false")
    assert "Not Found" in driver.page_source


def _deployment(driver: Any, name: str) -> tuple[str, str]:
    row = driver.find_element(By.CSS_SELECTOR, f"#deployments tr[data-deployment='{name}']")
    return row.get_attribute("data-enabled"), row.find_element(By.CSS_SELECTOR, ".reason").text


@pytest.mark.slow
def test_actions_work_behind_a_confirmation(
        driver: Any, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    dsn = seeded_db[0]
    with ui_support.ui_server(dsn, "--allow-actions") as server:
        driver.get(server.url + "/workers")
        assert _deployment(driver, "intake_workers") == ("true", "")
        _follow(driver, driver.find_element(By.ID, "action-disable-intake_workers"))
        assert driver.find_element(By.ID, "question").text == "Disable worker deployment intake_workers?"
        assert _deployment_in_db(dsn, "intake_workers") == (True, None)  # nothing happens before confirming
        assert len(driver.find_element(By.NAME, "csrf").get_attribute("value")) == 64
        driver.find_element(By.NAME, "reason").send_keys("maintenance window")
        _follow(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
        assert _deployment_in_db(dsn, "intake_workers") == (False, "maintenance window")
        _follow(driver, driver.find_element(By.ID, "back"))
        assert _deployment(driver, "intake_workers") == ("false", "maintenance window")

        _follow(driver, driver.find_element(By.ID, "action-enable-intake_workers"))
        _follow(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
        assert _deployment_in_db(dsn, "intake_workers") == (True, None)

        # a run to cancel and a run to retry, made for this test
        with psycopg.connect(dsn, autocommit=True) as conn:
            engine = Engine(conn)
            to_cancel = engine.start("ping", {"cancel": True})
            to_retry = engine.start("orders_v1", {"retry": True})  # max_attempts 1: one failure fails it
            engine.fail(ui_support.claim_only(engine, "intake", to_retry), "RuntimeError: upstream down")

        driver.get(f"{server.url}/runs/{to_cancel}")
        assert _absent(driver, "action-retry")  # only a failed run can be retried
        _follow_live(driver, "action-cancel")
        assert str(to_cancel) in driver.find_element(By.ID, "question").text
        driver.find_element(By.NAME, "reason").send_keys("wrong input")
        _follow(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
        _follow(driver, driver.find_element(By.ID, "back"))
        assert driver.find_element(By.ID, "run-status").text == "cancelled"
        assert driver.find_element(By.ID, "cancel-reason").text == "cancelled: wrong input"

        driver.get(f"{server.url}/runs/{to_retry}")
        assert driver.find_element(By.ID, "run-status").text == "failed"
        assert _absent(driver, "action-cancel")  # a failed run cannot be cancelled
        _follow_live(driver, "action-retry")
        _follow(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
        with psycopg.connect(dsn) as conn:
            row = conn.execute("select status, retry_count from flowlane.runs where run_id = %s",
                               (to_retry,)).fetchone()
        assert row == ("started", 1)

        # a completed run reruns from a step: its completed task stays in the history
        with psycopg.connect(dsn, autocommit=True) as conn:
            engine = Engine(conn)
            to_rerun = engine.start("ping", {"note": "rerun"})
            engine.complete(ui_support.claim_only(engine, "ping", to_rerun), {"pong": True})
        driver.get(f"{server.url}/runs/{to_rerun}")
        assert driver.find_element(By.ID, "run-status").text == "completed"
        _follow_live(driver, "action-rerun-pong")
        assert driver.find_element(By.ID, "question").text.startswith(f"Rerun step pong of run {to_rerun}")
        _follow(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
        with psycopg.connect(dsn) as conn:
            row = conn.execute("select status, retry_count from flowlane.runs where run_id = %s",
                               (to_rerun,)).fetchone()
            history = conn.execute("select step_slug, outcome, output from flowlane.task_attempts "
                                   "where run_id = %s", (to_rerun,)).fetchall()
        assert row == ("started", 1)
        assert history == [("pong", "superseded", {"pong": True})]
        _follow(driver, driver.find_element(By.ID, "back"))
        assert _absent(driver, "action-rerun-pong")  # a started run is not rerun


class CardDeclined(Exception):
    pass


def _failure_row(driver: Any, flow: str, step: str, error_type: str) -> list[Any]:
    selector = f"#failures tr[data-flow='{flow}'][data-step='{step}'][data-error-type='{error_type}']"
    return driver.find_elements(By.CSS_SELECTOR, selector)


@pytest.mark.slow
def test_the_failures_page_groups_failed_runs_and_retries_a_group(
        driver: Any, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    dsn = seeded_db[0]
    kind = ui_support.error_type(CardDeclined())  # as a worker records it: with its module
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        declined = [engine.start("orders_v1", {"declined": n}) for n in range(3)]
        for run_id in declined:  # max_attempts 1: the fetch's failure fails the run
            ui_support.fail_like_a_worker(conn, ui_support.claim_only(engine, "intake", run_id),
                                          engine.worker_id, CardDeclined("card 4242 declined"))
    with ui_support.ui_server(dsn, "--allow-actions") as server:
        driver.get(server.url + "/failures")
        [row] = _failure_row(driver, "orders_v1", "fetch", kind)
        assert row.find_element(By.CSS_SELECTOR, ".count").text == "3"
        assert row.find_element(By.CSS_SELECTOR, "svg.spark title").get_attribute("textContent").startswith(
            "3 failed in the last 24 h")
        [seeded] = _failure_row(driver, "orders_v1", "price", "ValueError")  # the seed's failed run
        assert seeded.find_element(By.CSS_SELECTOR, ".count").text == "1"

        _follow(driver, driver.find_element(By.ID, f"action-retry-orders_v1-fetch-{kind}"))
        assert driver.find_element(By.ID, "question").text == (
            f"Retry every failed run of flow orders_v1 that failed in step fetch with {kind}?")
        _follow(driver, driver.find_element(By.ID, "confirm"))
        assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
        assert "retried 3 of 3 matching runs in 1 batch" in driver.find_element(By.ID, "message").text
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("select status, retry_count from flowlane.runs where run_id = any(%s)",
                                (declined,)).fetchall()
        assert rows == [("started", 1)] * 3
        _follow(driver, driver.find_element(By.ID, "back"))
        assert _failure_row(driver, "orders_v1", "fetch", kind) == []
        assert len(_failure_row(driver, "orders_v1", "price", "ValueError")) == 1


def _decide(driver: Any, server: ui_support.UiServer, run_id: uuid.UUID, action: str,
            by: str, comment: str) -> None:
    driver.get(f"{server.url}/runs/{run_id}")
    _follow_live(driver, f"action-{action}-ask")
    assert driver.find_element(By.ID, "question").text.startswith(
        f"{action.capitalize()} step ask of run {run_id}?")
    driver.find_element(By.NAME, "by").send_keys(by)
    driver.find_element(By.NAME, "comment").send_keys(comment)
    _follow(driver, driver.find_element(By.ID, "confirm"))
    assert driver.find_element(By.CSS_SELECTOR, "#message h1").text == "Done"
    _follow(driver, driver.find_element(By.ID, "back"))


@pytest.mark.slow
def test_a_waiting_step_is_approved_or_rejected_from_the_console(
        driver: Any, seeded_db: tuple[str, ui_support.Seeded]) -> None:
    dsn = seeded_db[0]
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        engine.define("console_gate", [("ask", [], {"step_type": "wait", "timeout": 3600}),
                                       ("go", ["ask"], {})])
        approved, rejected = engine.start("console_gate"), engine.start("console_gate")
    with ui_support.ui_server(dsn, "--allow-actions") as server:
        driver.get(f"{server.url}/runs/{approved}")
        waiting = driver.find_element(By.CSS_SELECTOR, "[data-wait='ask']").text
        assert waiting.startswith("waiting for a signal since") and "gives up at" in waiting
        _decide(driver, server, approved, "approve", "ana", "looks right")
        decision = driver.find_element(By.CSS_SELECTOR, "[data-wait='ask'] .decision")
        assert decision.get_attribute("data-approved") == "true"
        assert decision.text.startswith("approved by a signal from ana at") and "looks right" in decision.text
        assert _absent(driver, "action-approve-ask")  # decided once
        _decide(driver, server, rejected, "reject", "", "")
        decision = driver.find_element(By.CSS_SELECTOR, "[data-wait='ask'] .decision")
        assert decision.get_attribute("data-approved") == "false"
        assert decision.text.startswith("rejected by a signal from the console at")
    with psycopg.connect(dsn, autocommit=True) as conn:
        engine = Engine(conn)
        outputs = {run: engine.states(run)["ask"]["output"] for run in (approved, rejected)}
        assert engine.statuses(approved)["go"] == "started"  # the approval started it
    assert {k: outputs[approved][k] for k in ("approved", "by", "comment")} == {
        "approved": True, "by": "ana", "comment": "looks right"}
    assert outputs[approved]["at"]  # when it was decided, from the database's clock
    assert {k: outputs[rejected][k] for k in ("approved", "by", "comment")} == {
        "approved": False, "by": "the console", "comment": None}


def _absent(driver: Any, element_id: str) -> bool:
    """Asked inside the page in one step: a run page replaces its live region while it runs,
    and a lookup through the driver can race with that replacement."""
    return bool(driver.execute_script("return document.getElementById(arguments[0]) === null",
                                      element_id))


def _follow_live(driver: Any, element_id: str) -> None:
    """``_follow`` on a page whose live region may be replaced between finding and clicking."""
    page = driver.find_element(By.TAG_NAME, "html")
    WebDriverWait(driver, WAIT, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.find_element(By.ID, element_id).click() or True)
    _wait_for_next_page(driver, page)


def _follow(driver: Any, element: Any) -> None:
    """Click a link or submit button and wait until the next page has loaded (a click returns
    before the navigation it starts has finished)."""
    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    _wait_for_next_page(driver, page)


def _left(page: Any) -> Any:
    """True once ``page`` (the old document's root) is gone. While the browser swaps documents,
    chromedriver may answer "does not belong to the document" instead of "stale element"."""
    stale = expected_conditions.staleness_of(page)

    def check(driver: Any) -> bool:
        try:
            return bool(stale(driver))
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise

    return check


def _wait_for_next_page(driver: Any, page: Any) -> None:
    WebDriverWait(driver, WAIT).until(_left(page))
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _deployment_in_db(dsn: str, name: str) -> tuple[bool, str | None]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select enabled, reason from flowlane.worker_deployments "
                           "where deployment_name = %s", (name,)).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.slow
def test_a_token_console_refuses_a_browser_without_it_and_remembers_it_once_given(
        driver: Any, seeded_db: tuple[str, ui_support.Seeded], tmp_path: Path) -> None:
    token = "s3cret-token"
    with ui_support.ui_server(seeded_db[0], "--host", "0.0.0.0", "--token", token) as server:
        local = server.url.replace("0.0.0.0", "127.0.0.1")
        driver.get(local + "/runs")
        assert "needs its token" in driver.find_element(By.TAG_NAME, "body").text
        driver.get(f"{local}/flows?token={token}")
        assert driver.current_url == local + "/flows"  # the token left the address bar
        driver.get(local + "/queues")  # carried by the cookie from now on
        assert driver.find_element(By.CSS_SELECTOR, "#queues tr[data-queue='pricing']")


@pytest.mark.slow
def test_screenshots_of_the_main_pages(
        driver: Any, console: ui_support.UiServer, seeded_db: tuple[str, ui_support.Seeded],
        tmp_path: Path) -> None:
    shots = ui_support.screenshots(driver, console.url, seeded_db[1], tmp_path)
    assert [p.name for p in shots] == [f"console-{name}.png" for name in ui_support.SCREENSHOTS]
    for shot in shots:
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the run page fits: a 7-step run with a wait step and a child flow at 1400 px ----------

GEOMETRY = """
const svg = document.querySelector('svg.graph');
const nodes = [...svg.querySelectorAll('g.node')].map(g => ({
  step: g.dataset.step, boxes: [...g.querySelectorAll('.box')].map(b => b.getBoundingClientRect())}));
const crossings = [];
let sampled = 0;
for (const edge of svg.querySelectorAll('path.edge')) {
  const toScreen = edge.getScreenCTM(), length = edge.getTotalLength();
  for (let at = 0; at <= length; at += 1, sampled += 1) {
    const local = edge.getPointAtLength(at);
    const p = new DOMPoint(local.x, local.y).matrixTransform(toScreen);
    for (const node of nodes) {
      if (node.step === edge.dataset.from || node.step === edge.dataset.to) continue;
      if (node.boxes.some(b => p.x > b.left && p.x < b.right && p.y > b.top && p.y < b.bottom))
        crossings.push(`${edge.dataset.from} -> ${edge.dataset.to} crosses ${node.step}`);
    }
  }
}
const box = svg.getBoundingClientRect();
return {left: box.left, right: box.right, viewport: document.documentElement.clientWidth,
        scrollable: document.documentElement.scrollWidth > document.documentElement.clientWidth,
        nodes: nodes.length, edges: svg.querySelectorAll('path.edge').length, sampled: sampled,
        crossings: [...new Set(crossings)]};
"""

# each badge (and what is in it): its text colour and the first background behind it
COLOURS = """
const opaque = el => { for (; el; el = el.parentElement) {
  const bg = getComputedStyle(el).backgroundColor;
  if (!/^rgba\\(.*, 0\\)$/.test(bg) && bg !== 'transparent') return bg; } return 'rgb(255, 255, 255)'; };
return [...document.querySelectorAll('.status, .tag, .child-run, .status *, .tag *, .child-run *')]
  .filter(el => el.textContent.trim())
  .map(el => [el.textContent.trim(), getComputedStyle(el).color, opaque(el)]);
"""


def _luminance(css: str) -> float:
    channels = [int(float(c)) / 255 for c in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(foreground: str, background: str) -> float:
    """The WCAG contrast ratio of two computed CSS colours."""
    light, dark = sorted((_luminance(foreground), _luminance(background)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_contrast_follows_wcag() -> None:
    assert round(contrast("rgb(0, 0, 0)", "rgb(255, 255, 255)"), 1) == 21.0
    assert round(contrast("rgb(47, 95, 208)", "rgb(30, 142, 78)"), 2) == 1.37  # blue on green


@pytest.mark.slow
def test_run_page_fits_1400_px_without_edges_through_boxes_and_badges_read_well(dsn: str) -> None:
    waits = ui_support.seed_waits(dsn)
    with ui_support.ui_server(dsn) as console, ui_support.browser(width=1400) as chromium:
        chromium.get(f"{console.url}/runs/{waits.parent}")
        chromium.save_screenshot("/tmp/flowlane-run-page-1400.png")
        geometry = chromium.execute_script(GEOMETRY)
        assert geometry["nodes"] == 7 and geometry["edges"] == 8 and geometry["sampled"] > 1000
        assert geometry["left"] >= 0 and geometry["right"] <= geometry["viewport"], geometry
        assert not geometry["scrollable"]
        assert geometry["crossings"] == []
        size = "return document.querySelector('svg.graph').getBoundingClientRect().width"
        fitted = chromium.execute_script(size)
        chromium.find_element(By.CSS_SELECTOR, "[data-graph-size]").click()  # full size: it scrolls
        assert chromium.execute_script(size) > fitted
        assert chromium.find_element(By.CSS_SELECTOR, "[data-graph-size]").text == "fit to page"
        chromium.find_element(By.CSS_SELECTOR, "[data-graph-size]").click()
        assert chromium.execute_script(size) == fitted
        badges = chromium.execute_script(COLOURS)
        texts = {text for text, _, _ in badges}
        assert {"started", "completed", "created", "wait", "flow: review", "[0] started"} <= texts, texts
        low = [(text, fg, bg, round(contrast(fg, bg), 2)) for text, fg, bg in badges
               if contrast(fg, bg) < 4.5]
        assert low == []
