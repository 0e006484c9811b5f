"""Who may talk to the console: loopback by default, a token elsewhere, CSRF for actions.

The rule (one place): a token is required unless the server binds a loopback address.
When a token is set, every request carries it: ``Authorization: Bearer TOKEN``, the
``flowlane_token`` cookie, or once ``?token=TOKEN`` (answered with a redirect that sets the
cookie and drops the token from the address). Without a token the console serves only
requests addressed to a loopback host name (no DNS rebinding from a web page).
Actions (POST) need the per-session CSRF token: an HMAC of the session cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from urllib.parse import urlencode

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

from flowlane import errors

TOKEN_ENV = "FLOWLANE_UI_TOKEN"
TOKEN_COOKIE = "flowlane_token"
SESSION_COOKIE = "flowlane_session"
SESSION_CHARS = 43  # secrets.token_urlsafe(32)
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token."""
    if not is_loopback(host) and not token:
        raise errors.UsageError(
            f"binding {host} exposes the console beyond this machine: a token is required",
            hint=f"pass --token TOKEN (or set {TOKEN_ENV}); every request must then carry it",
        )


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


class Guard(BaseHTTPMiddleware):
    """Token, Host and session handling for every request; security headers on every response."""

    def __init__(self, app: ASGIApp, *, token: str | None, secret: bytes) -> None:
        super().__init__(app)
        self.token = token
        self.secret = secret

    def csrf_token(self, session: str) -> str:
        return hmac.new(self.secret, session.encode(), hashlib.sha256).hexdigest()

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        refused = self._refusal(request)
        if refused is not None:
            return _secured(refused)
        if self.token and _same(request.query_params.get("token"), self.token):
            return _secured(self._drop_token_from_url(request))
        session = request.cookies.get(SESSION_COOKIE, "")
        new_session = len(session) != SESSION_CHARS
        if new_session:
            session = secrets.token_urlsafe(32)
        request.state.csrf = self.csrf_token(session)
        response = await call_next(request)
        if new_session:
            response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict")
        return _secured(response)

    def _refusal(self, request: Request) -> Response | None:
        if self.token:
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip() or None
            carried = (_same(bearer, self.token) or _same(request.cookies.get(TOKEN_COOKIE), self.token)
                       or _same(request.query_params.get("token"), self.token))
            if not carried:
                return PlainTextResponse(
                    "401 this console needs its token: open it with ?token=TOKEN once, "
                    "or send 'Authorization: Bearer TOKEN'\n", status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="flowlane ui"'})
            return None
        host = (request.url.hostname or "").lower()
        if not is_loopback(host):
            return PlainTextResponse(f"421 this console answers only to a loopback host, not {host!r}\n",
                                     status_code=421)
        return None

    def _drop_token_from_url(self, request: Request) -> Response:
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        location = request.url.path + (f"?{urlencode(rest)}" if rest else "")
        response = RedirectResponse(location, status_code=303)
        response.set_cookie(TOKEN_COOKIE, self.token or "", httponly=True, samesite="strict")
        return response


def check_csrf(request: Request, submitted: str | None) -> bool:
    """An action's form carries this session's CSRF token, from this console's own pages."""
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return False
    return _same(submitted, request.state.csrf)


def _secured(response: Response) -> Response:
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    )
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    # not no-referrer: under it browsers send "Origin: null" with forms, which check_csrf refuses
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response
