"""`kind: webhook` deliveries: verify the sender, map the body, start a run or send a signal.

The HTTP side (body limits, status codes) is ``flowlane.ui.webhooks``; this module knows the
two signing schemes and what a verified delivery does. A delivery's id is the idempotency key
of the run it starts (``<webhook name>:<delivery id>``, scoped to the webhook's flow), so a
sender that retries, or replays, a delivery finds the first run. The run records
``{"webhook": name, "delivery": id}`` as what started it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flowlane import errors, extras
from flowlane.compiler.model import Project, Webhook
from flowlane.runtime.client import AsyncClient

GITHUB_SIGNATURE = "x-hub-signature-256"
GITHUB_DELIVERY = "x-github-delivery"
GITHUB_EVENT = "x-github-event"
STANDARD_ID = "webhook-id"
_DATA_EXCEPTION = "22"  # SQLSTATE class of an input the flow's checks refuse


class Refused(Exception):
    """A delivery that starts nothing: ``status`` is the HTTP answer (401: not signed by the
    sender, 400: signed but unusable, 422: the flow or the step refused it)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Delivery:
    """A verified delivery: its id (the sender's) and its body, parsed."""

    id: str
    body: Any


class Endpoint:
    """A webhook with its secret, read from the environment when the server starts."""

    def __init__(self, webhook: Webhook, secret: str) -> None:
        self.webhook = webhook
        self._secret = secret
        self._standard: Any = None
        if webhook.scheme == "standard":
            with extras.needs("webhooks", "a webhook with `scheme: standard`"):
                from standardwebhooks.webhooks import Webhook as StandardWebhook
            try:
                self._standard = StandardWebhook(secret)
            except Exception as exc:  # the library raises bare errors on a malformed secret
                raise errors.UsageError(
                    f"webhook {webhook.name}: ${webhook.secret_env} is not a Standard Webhooks secret",
                    hint="the sender shows it as whsec_ followed by base64") from exc

    def verify(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """The delivery these headers sign, or :class:`Refused` (401) when they do not."""
        if self._standard is not None:
            delivery_id = self._verify_standard(headers, body)
        else:
            delivery_id = self._verify_github(headers, body)
        try:
            return Delivery(delivery_id, json.loads(body))
        except ValueError as exc:
            raise Refused(400, f"the body is not JSON: {exc}") from exc

    def _verify_standard(self, headers: Mapping[str, str], body: bytes) -> str:
        from standardwebhooks.webhooks import WebhookVerificationError

        try:  # checks the timestamp against the library's tolerance, then the signature
            self._standard.verify(body, dict(headers), json_parse=False)
        except WebhookVerificationError as exc:
            raise Refused(401, f"signature refused: {exc}") from exc
        return headers[STANDARD_ID]

    def _verify_github(self, headers: Mapping[str, str], body: bytes) -> str:
        given = headers.get(GITHUB_SIGNATURE, "")
        expected = "sha256=" + hmac.new(self._secret.encode(), body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Refused(401, f"signature refused: no valid {GITHUB_SIGNATURE} header")
        delivery_id = headers.get(GITHUB_DELIVERY)
        if not delivery_id:
            raise Refused(400, f"the {GITHUB_DELIVERY} header is missing: it is the delivery's id")
        return delivery_id

    def is_ping(self, headers: Mapping[str, str]) -> bool:
        """GitHub's `ping` event, sent when the hook is created: answered, starts nothing."""
        return self.webhook.scheme == "github" and headers.get(GITHUB_EVENT) == "ping"


def endpoints(project: Project, environ: Mapping[str, str] | None = None) -> dict[str, Endpoint]:
    """The project's webhooks by name, each with its secret; raises naming every secret
    variable that is not set (a server never accepts unsigned deliveries)."""
    environ = os.environ if environ is None else environ
    missing = sorted({w.secret_env for w in project.webhooks if not environ.get(w.secret_env)})
    if missing:
        raise errors.UsageError(
            "webhook secrets not set: " + ", ".join(f"${name}" for name in missing),
            hint="export each variable the webhooks' `secret_env` names, with the sender's secret")
    return {w.name: Endpoint(w, environ[w.secret_env]) for w in project.webhooks}


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at a JSON pointer (``/data/id``; ``~1`` is ``/``, ``~0`` is ``~``), or None."""
    value = document
    for token in pointer.split("/")[1:]:
        name = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(name)
        elif isinstance(value, list) and name.isdigit() and int(name) < len(value):
            value = value[int(name)]
        else:
            return None
    return value


def mapped(webhook: Webhook, body: Any) -> Any:
    """The run input (or signal payload): the mapped fields, or the whole body."""
    if webhook.input is None:
        return body
    return {name: resolve_pointer(body, pointer) for name, pointer in webhook.input.items()}


async def deliver(client: AsyncClient, endpoint: Endpoint, delivery: Delivery) -> dict[str, Any]:
    """Start the webhook's run or send its signal; return what happened, once committed.
    A delivery the flow or the step refuses raises :class:`Refused` (422); any other database
    error is raised as it is (the sender is told to retry: the delivery id makes that safe)."""
    webhook = endpoint.webhook
    if webhook.signal_step is not None:
        return await _signal(client, webhook, delivery)
    origin = {"webhook": webhook.name, "delivery": delivery.id}
    try:
        started = await client.start(webhook.flow, mapped(webhook, delivery.body),
                                     key=f"{webhook.name}:{delivery.id}", origin=origin)
    except errors.InputRefused as exc:
        if not (exc.sqlstate or "").startswith(_DATA_EXCEPTION):
            raise  # not the input's fault: the sender's retry may succeed
        raise Refused(422, str(exc)) from exc
    return {"run_id": started.run_id, "flow": started.flow_slug, "existed": started.existed}


async def _signal(client: AsyncClient, webhook: Webhook, delivery: Delivery) -> dict[str, Any]:
    step = str(webhook.signal_step)
    run_id = resolve_pointer(delivery.body, str(webhook.signal_run))
    if not isinstance(run_id, str):
        raise Refused(422, f"no run id at {webhook.signal_run} in the body")
    by = f"webhook {webhook.name} delivery {delivery.id}"
    try:
        signal = await client.signal(run_id, step, mapped(webhook, delivery.body), by=by)
    except errors.SignalRefused as exc:
        if await _signalled_by(client, run_id, step, by):  # a retry of a delivered signal
            return {"run_id": run_id, "step": step, "existed": True}
        raise Refused(422, str(exc)) from exc
    except (errors.UsageError, errors.NotFound) as exc:
        raise Refused(422, str(exc)) from exc
    return {"run_id": signal.run_id, "step": step, "existed": False}


async def _signalled_by(client: AsyncClient, run_id: str, step: str, by: str) -> bool:
    state = await client.get_run(run_id)
    return any(w.step_slug == step and w.signal is not None and isinstance(w.signal.payload, dict)
               and w.signal.payload.get("by") == by for w in state.waits)


def signed_standard(secret: str, delivery_id: str, body: bytes, at: datetime | None = None
                    ) -> dict[str, str]:
    """The headers a Standard Webhooks sender puts on ``body`` (for tests and examples)."""
    with extras.needs("webhooks", "signing a Standard Webhooks delivery"):
        from standardwebhooks.webhooks import Webhook as StandardWebhook
    when = at or datetime.now(UTC)
    return {STANDARD_ID: delivery_id, "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": StandardWebhook(secret).sign(delivery_id, when, body)}


def signed_github(secret: str, delivery_id: str, body: bytes, event: str = "push") -> dict[str, str]:
    """The headers GitHub puts on ``body`` (for tests and examples)."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {GITHUB_SIGNATURE: f"sha256={digest}", GITHUB_DELIVERY: delivery_id, GITHUB_EVENT: event}

