"""The HTTP API: a Starlette application a host can serve or mount (FO8).

Transport knows nothing of the runtime: it talks to an :class:`HttpBackend`
that the actors layer implements. Every answer is JSON, errors included: an
unknown route is a 404 (a known one with a trailing slash too: no redirect; and a
websocket upgrade to a path no websocket route takes), a plain request to a
websocket endpoint a 426, a wrong method a 405 with ``Allow``, a Host the
operator did not allow a 400 (:mod:`.host_guard`). ``GET /`` lists the routes
and ``GET /healthz`` says whether the runtime can serve (200) or not (503), one
entry per check.

State-changing calls (``DELETE``, ``POST``) must carry ``X-Kinbox: 1``, which
a cross-site form cannot send; when the operator set a token
(:class:`.OperatorToken`, required off loopback) they must carry
``Authorization: Bearer <token>`` instead, and so must reads: a token is set
because others can reach the server, and the reads hold message bodies
(Focal's last message, notifications, cron prompts and results). ``GET /``
and ``/healthz`` (what is served, whether it is up) answer without it. A client
(peer address) that presents too many wrong tokens gets ``429`` with ``Retry-After``
for a while (:mod:`.token_tries`), so the token cannot be guessed by trying.

The backend's methods block (they read and write the database), so every
handler runs them on a worker thread, never on the event loop: a slow
database slows the requests that need it, not the server. ``/healthz`` has
its own small thread budget, so it answers even when every worker thread is
waiting on the database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio.to_thread
from anyio import CapacityLimiter
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from .errors import BackendRefused, ExposedWithoutToken, clipped, quoted
from .host_guard import HostGuard
from .host_names import is_loopback
from .json_answers import error, refused_answer
from .operator_token import OperatorToken
from .request_shape import Handler, shaped
from .token_tries import TokenTries, retry_after

log = logging.getLogger("kinbox.http")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
STATE_HEADER = "x-kinbox"
HEALTH_THREADS = 2
"""Threads reserved for ``/healthz``, apart from the pool the other routes share."""

Refusal = Callable[[Request], Response | None]
"""The app's rule for its guarded routes: why ``request`` may not go on, or None. A read
(``GET``, ``HEAD``) needs the operator token when one is set; a state-changing call needs
it, or ``X-Kinbox: 1`` when none is set."""


class DescribedRoute(Route):
    """A route that says what it is in ``GET /``'s list (``about``)."""

    def __init__(
        self, path: str, endpoint: Callable[..., Any], *, methods: list[str], about: str
    ) -> None:
        super().__init__(path, endpoint, methods=methods)
        self.about = about


def about_route(route: BaseRoute) -> dict[str, Any] | None:
    """``GET /``'s entry for a route mounted beside the API's own: its ``about``, or for a
    websocket endpoint the first line of its handler's docstring."""
    if isinstance(route, Route):
        return {
            "path": route.path,
            "methods": sorted(route.methods or ()),
            "about": getattr(route, "about", ""),
        }
    if isinstance(route, WebSocketRoute):
        doc = (getattr(route.endpoint, "__doc__", None) or "").strip().split("\n")[0]
        return {
            "path": route.path,
            "methods": ["GET"],
            "about": f"websocket upgrade: {doc}".rstrip(": "),
        }
    return None


def guard(refusal: Refusal) -> Callable[[Handler], Handler]:
    """What puts a handler behind ``refusal``: the request meets the rule first."""

    def guarded(handler: Handler) -> Handler:
        async def checked(request: Request) -> Response:
            refused = refusal(request)
            return refused if refused is not None else await handler(request)

        return checked

    return guarded


class HttpBackend(Protocol):
    """What the HTTP API needs from a runtime. Every method may block."""

    def focal_status(self) -> dict[str, Any]:
        """``GET /focal``: creates the Focal chat if needed."""
        ...

    def focal_panel(self) -> dict[str, Any]:
        """``GET /focal/panel``: the fixed tool list and the scheduled wake-ups."""
        ...

    def cancel_wakeup(self, job_id: str) -> bool:
        """Cancel one of Focal's own wake-ups; False when the id is not one."""
        ...

    def notifications(self) -> dict[str, Any]:
        """The user notification feed and the unread count."""
        ...

    def mark_read(self) -> None:
        """The user has seen the notifications."""
        ...

    def health(self) -> dict[str, Any]:
        """``{"healthy": bool, "checks": {name: {"ok": bool, ...}}}``; never raises."""
        ...


ERROR_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    429: "too_many_tries",
    500: "execution_failed",
    503: "unavailable",
}


def create_app(
    backend: HttpBackend,
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
    operator: OperatorToken | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    *,
    guarded_routes: Callable[[Refusal], Sequence[BaseRoute]] | None = None,
    tries: TokenTries | None = None,
    clock: Callable[[], float] = time.monotonic,
    allow_unauthenticated: bool = False,
) -> Starlette:
    """The Starlette application.

    ``allowed_hosts`` are the Host names it answers; ``operator``, when given,
    is the token every call but ``GET /`` and ``/healthz`` must present. Answering a name
    that is not loopback (one other machines reach, also through a proxy on this one) needs
    it: :class:`.ExposedWithoutToken` without, unless ``allow_unauthenticated`` says that
    something in front of the app authenticates every request (then a warning is logged;
    ``/healthz``
    answers a caller without it with each failed check's error type only: a driver's
    text may name hosts, users or tables). ``extra_routes`` are mounted beside the API
    as they are; ``guarded_routes(refusal)`` gives routes built with the app's own rule
    (the cron and social routes), so that rule lives here only. ``tries`` counts wrong
    tokens per client address (a :class:`.TokenTries` of the default limits when not
    given), read against ``clock`` (monotonic seconds).
    """
    exposed = tuple(h for h in allowed_hosts if not is_loopback(h))
    if exposed and operator is None:
        if not allow_unauthenticated:
            raise ExposedWithoutToken(exposed)
        log.warning("the HTTP app answers %s without an operator token "
                    "(allow_unauthenticated): whatever is in front of it must authenticate "
                    "every request", ", ".join(clipped(h) for h in exposed))
    health_limiter: list[CapacityLimiter] = []  # made on first use, inside the event loop
    # Called from the handlers on the event loop only, so one thread at a time.
    token_tries = tries if tries is not None else TokenTries()

    def refusal(request: Request) -> Response | None:
        """Why a request to a guarded route may not go on, or None when it may."""
        reading = request.method in ("GET", "HEAD")
        if operator is not None:
            client = request.client.host if request.client is not None else ""
            now = clock()
            wait = token_tries.wait(client, now)
            if wait > 0:
                return error(
                    429,
                    "too_many_tries",
                    "too many wrong operator tokens from this address: try again later",
                    {"Retry-After": retry_after(wait)},
                )
            authorization = request.headers.get("authorization")
            if operator.allows(authorization):
                token_tries.succeeded(client)
                return None
            if authorization is not None:  # a try; no header at all guesses nothing
                token_tries.failed(client, now)
            return error(
                401,
                "unauthorized",
                f"{'reads' if reading else 'state-changing calls'}"
                " need the operator token: Authorization: Bearer <token>",
                {"WWW-Authenticate": "Bearer"},
            )
        if reading or request.headers.get(STATE_HEADER) == "1":
            return None
        return error(403, "forbidden", "state-changing calls need the header X-Kinbox: 1")

    guarded = guard(refusal)

    async def index(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "service": "kinbox",
                "routes": [
                    {"path": path, "methods": methods, "about": about}
                    for path, methods, _, about in table
                ]
                + [entry for entry in map(about_route, routes[len(table) :]) if entry is not None],
            }
        )

    async def healthz(request: Request) -> JSONResponse:
        if not health_limiter:
            health_limiter.append(CapacityLimiter(HEALTH_THREADS))
        report = await anyio.to_thread.run_sync(backend.health, limiter=health_limiter[0])
        if refusal(request) is not None:  # open to anyone: say what failed, not the text
            report = _without_error_text(report)
        return JSONResponse(report, status_code=200 if report.get("healthy") else 503)

    async def focal(request: Request) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(backend.focal_status))

    async def panel(request: Request) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(backend.focal_panel))

    async def cancel(request: Request) -> JSONResponse:
        job_id = request.path_params["job_id"]
        if not await run_in_threadpool(backend.cancel_wakeup, job_id):
            return error(404, "not_found", f"no Focal wake-up with id {quoted(job_id)}")
        return JSONResponse({"cancelled": job_id})

    async def feed(request: Request) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(backend.notifications))

    async def read(request: Request) -> JSONResponse:
        await run_in_threadpool(backend.mark_read)
        return JSONResponse(await run_in_threadpool(backend.notifications))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if "Allow" in headers:  # Starlette joins a set: give a stable order
            headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
        message = (
            f"no route {clipped(request.url.path)}"
            if exc.status_code == 404
            else f"{clipped(request.method)} is not allowed here; allowed: {headers['Allow']}"
            if exc.status_code == 405 and "Allow" in headers
            else str(exc.detail)
        )
        return error(
            exc.status_code, ERROR_CODES.get(exc.status_code, "http_error"), message, headers
        )

    async def refused(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BackendRefused)
        return refused_answer(exc)

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return error(500, "execution_failed", "the runtime could not answer this request")

    table: list[tuple[str, list[str], Handler, str]] = [
        ("/", ["GET"], index, "this list"),
        (
            "/healthz",
            ["GET"],
            healthz,
            "200 when database, writer and dispatcher are fit, else 503; one entry per check",
        ),
        ("/focal", ["GET"], focal, "Focal's status: waiting, stalled, unread, last message"),
        ("/focal/panel", ["GET"], panel, "Focal's fixed tools and scheduled wake-ups"),
        ("/focal/wakeups/{job_id}", ["DELETE"], cancel, "cancel one of Focal's wake-ups"),
        ("/focal/notifications", ["GET"], feed, "the user notification feed"),
        ("/focal/notifications/read", ["POST"], read, "mark the notifications read"),
    ]
    open_paths = ("/", "/healthz")
    # The health probe is not shaped: probes (a load balancer's, an orchestrator's) add
    # query strings of their own, and a 422 read as a runtime down.
    probes = ("/healthz",)
    routes: list[BaseRoute] = [
        Route(path, handler if path in probes
              else shaped(handler) if path in open_paths else guarded(shaped(handler)),
              methods=methods)
        for path, methods, handler, _ in table
    ]
    routes += [*extra_routes, *(guarded_routes(refusal) if guarded_routes is not None else ())]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(HostGuard, allowed_hosts=list(allowed_hosts))],
        exception_handlers={HTTPException: http_error, BackendRefused: refused, 500: failed},
    )
    # A path with a trailing slash is a route this API does not have: a 404 saying so.
    # Starlette's router would answer it with a bodiless 307 to the path without the
    # slash, for any method and before any route's rule (no X-Kinbox, no token).
    app.router.redirect_slashes = False
    app.router.default = _not_found(app.router.default, routes)
    return app


def _not_found(http_not_found: ASGIApp, routes: Sequence[BaseRoute]) -> ASGIApp:
    """The router's answer to a path no route takes: a JSON 426 for a request to a
    websocket endpoint, ``http_not_found`` for any other request, a JSON 404 for a
    websocket upgrade. Starlette answers the first with "no route", and closes an
    upgrade unaccepted, which servers answer 403 with no body: a peer's address checked
    with curl did not exist, and a peer that dialled a wrong path heard "forbidden"."""
    sockets = [r for r in routes if isinstance(r, WebSocketRoute)]

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            as_upgrade = {**scope, "type": "websocket"}
            if any(r.matches(as_upgrade)[0] is Match.FULL for r in sockets):
                await error(
                    426,
                    "upgrade_required",
                    f"{clipped(scope['path'])} is a websocket endpoint: "
                    "connect with a websocket upgrade",
                    {"Upgrade": "websocket"},
                )(scope, receive, send)
            else:
                await http_not_found(scope, receive, send)
            return
        ws = WebSocket(scope, receive, send)
        answer = error(404, "not_found", f"no websocket route {clipped(scope['path'])}")
        try:
            await ws.send_denial_response(answer)
        except RuntimeError:  # the server lacks the denial-response extension
            await ws.close(code=1008, reason="not_found")

    return not_found


def _without_error_text(report: dict[str, Any]) -> dict[str, Any]:
    """A health report whose failed checks give their ``error_type`` as their ``error``,
    without the exception's text."""
    checks = {
        name: ({**check, "error": check.get("error_type", "error")} if "error" in check else check)
        for name, check in report.get("checks", {}).items()
    }
    return {**report, "checks": checks}
