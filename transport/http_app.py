"""The HTTP API: a Starlette application a host can serve or mount (FO8).

Transport knows nothing of the runtime: it talks to a :class:`FocalBackend`
that the actors layer implements. Every answer is JSON. Requests whose Host
is not an allowed (loopback) name are refused, and state-changing calls
must carry the ``X-Kinbox: 1`` header, which a cross-site form cannot send.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
STATE_HEADER = "x-kinbox"


class FocalBackend(Protocol):
    """What the HTTP API needs from a runtime."""

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


def error(status: int, code: str, message: str) -> JSONResponse:
    """A JSON error body."""
    return JSONResponse({"error": code, "message": message}, status_code=status)


def _state_change_allowed(request: Request) -> bool:
    return request.headers.get(STATE_HEADER) == "1"


def create_app(backend: FocalBackend, allowed_hosts: Sequence[str] = LOOPBACK_HOSTS,
               extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The Starlette application; ``allowed_hosts`` are the Host names it answers.

    ``extra_routes`` (the peer websocket endpoint, say) are mounted beside the API.
    """

    async def focal(request: Request) -> JSONResponse:
        return JSONResponse(backend.focal_status())

    async def panel(request: Request) -> JSONResponse:
        return JSONResponse(backend.focal_panel())

    async def cancel(request: Request) -> JSONResponse:
        if not _state_change_allowed(request):
            return error(403, "forbidden", "state-changing calls need the header X-Kinbox: 1")
        job_id = request.path_params["job_id"]
        if not backend.cancel_wakeup(job_id):
            return error(404, "not_found", f"no Focal wake-up with id {job_id!r}")
        return JSONResponse({"cancelled": job_id})

    async def feed(request: Request) -> JSONResponse:
        return JSONResponse(backend.notifications())

    async def read(request: Request) -> JSONResponse:
        if not _state_change_allowed(request):
            return error(403, "forbidden", "state-changing calls need the header X-Kinbox: 1")
        backend.mark_read()
        return JSONResponse(backend.notifications())

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return error(404, "not_found", f"no route {request.url.path}")

    async def not_allowed(request: Request, exc: Exception) -> JSONResponse:
        return error(405, "method_not_allowed", f"{request.method} is not allowed here")

    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return error(500, "execution_failed", "the runtime could not answer this request")

    routes = [
        Route("/focal", focal, methods=["GET"]),
        Route("/focal/panel", panel, methods=["GET"]),
        Route("/focal/wakeups/{job_id}", cancel, methods=["DELETE"]),
        Route("/focal/notifications", feed, methods=["GET"]),
        Route("/focal/notifications/read", read, methods=["POST"]),
        *extra_routes,
    ]
    return Starlette(routes=routes,
                     middleware=[Middleware(TrustedHostMiddleware,
                                            allowed_hosts=list(allowed_hosts))],
                     exception_handlers={404: not_found, 405: not_allowed, 500: failed})
