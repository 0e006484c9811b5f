"""The console's web application: Starlette routes over :class:`flowlane.app.console.Console`.

Pages are rendered on the server (Jinja2); ``static/console.js`` only refreshes marked
regions (live runs) and loads payloads on demand. Actions exist only with ``allow_actions``.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from flowlane import defaults, errors
from flowlane.app.console import (
    FAILURE_HOURS,
    MAX_PAGE_SIZE,
    PAGE_SIZE,
    THROUGHPUT_MINUTES,
    Console,
    parse_run_id,
)
from flowlane.app.observability import ConsoleProbe
from flowlane.compiler import diagram
from flowlane.defaults import STALE_AFTER
from flowlane.runtime.limits import STATUSES, TERMINAL
from flowlane.runtime.report import hold_lines, signal_words, started_by
from flowlane.ui import layout, pages, security


@dataclass(frozen=True)
class Settings:
    token: str | None = None
    allow_actions: bool = False
    refresh_ms: int = 2000


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("flowlane.ui", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(
        duration=pages.duration, timestamp=pages.timestamp, size=pages.size, age=pages.age,
    )
    env.globals["signals_lane"] = diagram.SIGNALS
    env.globals["signal_words"] = signal_words  # as `flowlane run` and `signal` say it
    return Jinja2Templates(env=env)


TEMPLATES = _templates()


def create_app(console: Console, settings: Settings) -> Starlette:
    """The ASGI application over an opened ``console``, closed on shutdown."""

    probe = ConsoleProbe(console.target.dsn)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(console.close)
        await run_in_threadpool(probe.close)

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.update(settings=settings, csrf=request.state.csrf, path=request.url.path)
        return TEMPLATES.TemplateResponse(request, name, context, status_code=status_code)

    def not_found(request: Request, what: str) -> Response:
        return render(request, "message.html", 404, title="Not found", message=what, ok=False)

    def flows_page(request: Request) -> Response:
        aliases = console.aliases()
        return render(request, "flows.html", flows=console.flows(), aliases=aliases,
                      roles=pages.alias_roles(aliases))

    def flow_page(request: Request) -> Response:
        slug = request.path_params["slug"]
        flow = console.flow(slug)
        if flow is None:
            return not_found(request, f"no flow {slug} in this database")
        steps = console.flow_steps(slug)
        aliases = [a for a in console.aliases() if slug == a["active"] or slug in a["draining"]]
        return render(request, "flow.html", flow=flow, steps=steps,
                      graph=layout.layout(pages.flow_model(flow, steps)),
                      aliases=aliases, history=console.alias_history([a["alias"] for a in aliases]))

    def runs_page(request: Request) -> Response:
        params = request.query_params
        flow = params.get("flow") or None
        status = params.get("status") or None
        try:
            since = pages.parse_time(params.get("since"))
            until = pages.parse_time(params.get("until"))
            limit = min(max(int(params.get("limit") or PAGE_SIZE), 1), MAX_PAGE_SIZE)
            page = console.runs(flow=flow, status=status, since=since, until=until,
                                cursor=params.get("after") or None, limit=limit)
        except (ValueError, errors.UsageError) as exc:
            return render(request, "message.html", 400, title="Bad filter", message=str(exc), ok=False)
        filters = {k: v for k, v in (("flow", flow), ("status", status), ("since", params.get("since")),
                                     ("until", params.get("until")), ("limit", params.get("limit"))) if v}
        context: dict[str, Any] = {
            "page": page, "filters": filters,
            "next_url": "/runs?" + urlencode({**filters, "after": page.next_cursor})
            if page.next_cursor else None,
            "live_url": None if params.get("after") else "/runs/rows?" + urlencode(filters),
            "paged": bool(params.get("after")),
        }
        if request.url.path == "/runs/rows":  # the live refresh of the first page's rows
            return render(request, "runs_rows.html", **context)
        names = {f["flow_slug"] for f in console.flows()} | {a["alias"] for a in console.aliases()}
        return render(request, "runs.html", names=sorted(names), statuses=STATUSES, **context)

    def run_context(run_id: str) -> dict[str, Any] | None:
        run = console.run(run_id)
        if run is None:
            return None
        steps = console.run_steps(run_id)
        tasks: dict[str, list[dict[str, Any]]] = {}
        for task in console.run_tasks(run_id):
            tasks.setdefault(task["step_slug"], []).append(task)
        attempts: dict[str, list[dict[str, Any]]] = {}
        for attempt in console.run_attempts(run_id):
            attempts.setdefault(attempt["step_slug"], []).append(attempt)
        flow = console.flow(run["flow_slug"])
        assert flow is not None  # runs reference their flow
        model = pages.flow_model(flow, console.flow_steps(run["flow_slug"]))
        return {
            "run": run, "steps": steps, "tasks": tasks, "attempts": attempts,
            "graph": layout.layout(model, {s["step_slug"]: s["status"] for s in steps}),
            "terminal": run["status"] in TERMINAL,
            "waiting": console.waiting(run_id) if run["status"] == "started" else [],
            "holds": (hold_lines(console.holds(run_id)) if run["status"] in ("waiting", "started")
                      else []),
            "family": console.family(run_id),
            "started_by": started_by(run),
        }

    def run_page(request: Request) -> Response:
        given = request.path_params["run_id"]
        run_id = parse_run_id(given)
        if run_id is None:  # a prefix, as the runs list shows ids: the one run it names
            try:
                full = console.run_by_prefix(given)
            except errors.FlowlaneError as exc:
                return not_found(request, str(exc))
            return RedirectResponse(request.url.path.replace(given, full, 1), status_code=303)
        context = run_context(run_id)
        if context is None:
            return not_found(request, f"no run {request.path_params['run_id']}")
        name = "run_body.html" if request.url.path.endswith("/live") else "run.html"
        return render(request, name, **context)

    def payload(request: Request) -> Response:
        run_id = parse_run_id(request.path_params["run_id"])
        params = request.query_params
        try:
            task = int(params["task"]) if params.get("task") else None
            found = console.payload(run_id, params.get("what", ""), params.get("step") or None,
                                    task) if run_id else None
        except (ValueError, errors.UsageError) as exc:
            return PlainTextResponse(f"{exc}\n", status_code=400)
        if found is None:
            return PlainTextResponse("no such run, step or task\n", status_code=404)
        if found["bytes"] is None:
            return PlainTextResponse("null (not set yet)\n")
        text = found["text"]
        if len(text.encode()) < found["bytes"]:
            shown = len(found["text"])
            text += f"\n… truncated: {pages.size(found['bytes'])} in all, first {shown} characters"
        return PlainTextResponse(text, headers={"X-Total-Bytes": str(found["bytes"])})

    def queues_page(request: Request) -> Response:
        series = console.throughput()
        queues = console.queues()
        return render(request, "queues.html", queues=queues, routes=console.queue_routes(),
                      charts={q["queue_name"]: pages.sparkline(series.get(q["queue_name"],
                                                                          [0] * THROUGHPUT_MINUTES))
                              for q in queues},
                      minutes=THROUGHPUT_MINUTES)

    def workers_page(request: Request) -> Response:
        workers = console.workers()
        deployments = console.deployments()
        for worker in workers:
            worker["state"] = pages.worker_state(worker)
        return render(request, "workers.html", workers=workers, deployments=deployments,
                      stale_after=STALE_AFTER)

    async def metrics(request: Request) -> Response:
        body, content_type = await run_in_threadpool(probe.metrics)
        return Response(body, media_type=content_type)

    async def readyz(request: Request) -> Response:
        problems = await run_in_threadpool(probe.ready)
        return PlainTextResponse("\n".join(problems or ["ready"]) + "\n", 503 if problems else 200)

    def failures_page(request: Request) -> Response:
        groups = console.failures()
        return render(request, "failures.html", groups=groups, hours=FAILURE_HOURS,
                      charts=[pages.sparkline(g["hourly"]) for g in groups])

    def schedules_page(request: Request) -> Response:
        return render(request, "schedules.html", schedules=console.schedules(), triggers=console.triggers(),
                      webhooks=console.webhooks(), tick=defaults.TICK_INTERVAL)

    routes = [
        Route("/", lambda request: RedirectResponse("/runs", status_code=303)),
        Route("/metrics", metrics),
        Route("/healthz", lambda request: PlainTextResponse("ok\n")),
        Route("/readyz", readyz),
        Route("/flows", flows_page),
        Route("/flows/{slug}", flow_page),
        Route("/runs", runs_page),
        Route("/runs/rows", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/live", run_page),
        Route("/runs/{run_id}/payload", payload),
        Route("/queues", queues_page),
        Route("/workers", workers_page),
        Route("/schedules", schedules_page),
        Route("/failures", failures_page),
        Mount("/static", StaticFiles(packages=[("flowlane.ui", "static")]), name="static"),
    ]
    if settings.allow_actions:
        routes += _action_routes(console, render)
    def database_error(request: Request, exc: Exception) -> Response:
        hint = exc.hint if isinstance(exc, errors.FlowlaneError) else None
        return render(request, "message.html", 503, title="Database error", message=str(exc), hint=hint,
                      ok=False)

    middleware = [Middleware(security.Guard, token=settings.token, secret=secrets.token_bytes(32))]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers={errors.FlowlaneError: database_error})


# what each action's confirmation asks, and which form fields it passes on
ACTION_FORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cancel": ("Cancel run {run_id}? Queued tasks are archived and dependents never start.",
               ("run_id", "reason")),
    "retry": ("Retry the failed steps of run {run_id} with a fresh attempt budget?", ("run_id",)),
    "retry_failures": ("Retry every failed run of flow {flow} that failed in step {step} with {error_type}?",
                       ("flow", "step", "error_type")),
    "rerun": (("Rerun step {step_slug} of run {run_id} and every step that depends on it? "
               "The other steps keep their outputs."), ("run_id", "step_slug")),
    "approve": ("Approve step {step} of run {run_id}? The approval completes the step.",
                ("run_id", "step", "by", "comment")),
    "reject": ("Reject step {step} of run {run_id}? The rejection completes the step.",
               ("run_id", "step", "by", "comment")),
    "set_deployment_enabled": ("{verb} worker deployment {deployment}?", ("deployment", "enabled", "reason")),
    "pause_schedule": ("Pause schedule {schedule}? It starts no run until resumed.", ("schedule", "reason")),
    "resume_schedule": ("Resume schedule {schedule} from its next slot?", ("schedule",)),
    "trigger_schedule": ("Start a run of schedule {schedule} now?", ("schedule",)),
}


def _action_routes(console: Console, render: Callable[..., Response]) -> list[Route]:
    def fields(name: str, source: dict[str, str]) -> dict[str, str]:
        return {key: source.get(key, "") for key in ACTION_FORMS[name][1]}

    def confirm(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ACTION_FORMS:
            return render(request, "message.html", 404, title="Not found", message=f"no action {name}",
                          ok=False)
        values = fields(name, dict(request.query_params))
        question = ACTION_FORMS[name][0].format(
            verb="Enable" if values.get("enabled") == "true" else "Disable", **values)
        return render(request, "confirm.html", action=name, question=question, values=values,
                      back=safe_back(request.query_params.get("back")))

    async def perform(request: Request) -> Response:
        name = request.path_params["name"]
        form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
        if not security.check_csrf(request, form.get("csrf")):
            return render(request, "message.html", 403, title="Refused",
                          message="the form's CSRF token does not match this session: "
                                  "reload the page and confirm again", ok=False)
        if name not in ACTION_FORMS:
            return render(request, "message.html", 404, title="Not found", message=f"no action {name}",
                          ok=False)
        params: dict[str, Any] = fields(name, form)
        back = safe_back(form.get("back"))
        if "enabled" in params:
            params["enabled"] = params["enabled"] == "true"
        if name in ("approve", "reject"):
            params["approved"] = name == "approve"
            params["by"] = params["by"].strip() or "the console"
        if "reason" in params and not params["reason"]:
            # a disabled deployment or a cancelled run says who did it; enabling clears the reason
            params["reason"] = None if params.get("enabled") is True else "from the console"
        try:
            said = await run_in_threadpool(console.perform, name, **params)
        except errors.FlowlaneError as exc:
            return render(request, "message.html", 409, title=f"{name} failed", message=str(exc),
                          hint=exc.hint, back=back, ok=False)
        return render(request, "message.html", title="Done", message=said or f"{name}: done", back=back,
                      ok=True)

    return [Route("/actions/{name}", confirm, methods=["GET"]),
            Route("/actions/{name}", perform, methods=["POST"])]


def safe_back(value: str | None) -> str:
    """A same-site path to return to after an action (never another origin)."""
    # "//host" and "/\\host" are other origins to a browser
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/runs"

