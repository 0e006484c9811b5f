"""The webhook endpoint as an ASGI application: ``POST /<name>`` for each `kind: webhook`.

Mount it in an existing application (``Mount("/hooks", flowlane.ui.webhooks.app())``) or serve
it with ``flowlane webhooks serve``. Each delivery is read up to its webhook's ``max_body``
(413 beyond), verified (401 on a bad or stale signature, before anything is started), then
started or signalled; the 2xx answer is sent after that start committed. A database that
cannot be reached, or any other failure but a refusal, answers 503, which senders retry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowlane import errors, extras
from flowlane.compiler import api
from flowlane.compiler.model import Project
from flowlane.core import db
from flowlane.runtime import webhooks
from flowlane.runtime.client import AsyncClient

with extras.needs("webhooks", "webhook endpoints"):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

log = logging.getLogger("flowlane.webhooks")


def app(project: Project | None = None, *, dsn: str | None = None, project_dir: Path | None = None,
        environ: Mapping[str, str] | None = None) -> Starlette:
    """The ASGI application of the project's webhooks (default: the YAML under the project's
    ``flows/``), starting runs on ``dsn`` (resolved like the CLI's). Raises when a webhook's
    secret variable is not set in ``environ`` (default: the process environment)."""
    project = project if project is not None else api.load_project(
        None if project_dir is None else project_dir / "flows")
    endpoints = webhooks.endpoints(project, environ)
    target = db.resolve(dsn, project_dir)

    async def receive(request: Request) -> JSONResponse:
        endpoint = endpoints.get(request.path_params["name"])
        if endpoint is None:
            return JSONResponse({"error": "no such webhook"}, status_code=404)
        try:
            return await _receive(request, endpoint, target.dsn)
        except webhooks.Refused as refused:
            log.warning("webhook %s: %s (%s)", endpoint.webhook.name, refused.reason, refused.status)
            return JSONResponse({"error": refused.reason}, status_code=refused.status)
        except errors.DatabaseError as exc:  # unreachable, or a conflict a retry resolves
            log.warning("webhook %s: %s", endpoint.webhook.name, exc)
            return JSONResponse({"error": "not started: retry the delivery"}, status_code=503)

    return Starlette(routes=[Route("/{name}", receive, methods=["POST"])])


async def _receive(request: Request, endpoint: webhooks.Endpoint, dsn: str) -> JSONResponse:
    body = await _body(request, endpoint.webhook.max_body)
    headers = {name.lower(): value for name, value in request.headers.items()}
    delivery = endpoint.verify(headers, body)
    if endpoint.is_ping(headers):
        return JSONResponse({"ping": "ok"})
    async with AsyncClient(dsn) as client:
        done: dict[str, Any] = await webhooks.deliver(client, endpoint, delivery)
    return JSONResponse(done)


async def _body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise webhooks.Refused(413, f"the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise webhooks.Refused(413, f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
