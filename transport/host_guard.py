"""The Host check: requests must name a host the operator allowed, or get a JSON 400.

A browser tricked into calling a loopback server from a hostile page (DNS
rebinding) sends that page's name in ``Host``; answering only the names the
operator chose closes that door. Starlette's ``TrustedHostMiddleware`` does
the same but answers in plain text; every answer of this API is JSON.

Which names may be allowed, and how a ``Host`` header is read, are
:mod:`.host_names`'.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import quoted
from .host_names import AllowedHosts, host_of


class HostGuard:
    """ASGI middleware: HTTP requests whose Host is not allowed get a JSON 400."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allows = AllowedHosts(allowed_hosts).allows

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = host_of(Headers(scope=scope).get("host", ""))
            if not self.allows(host):
                response = JSONResponse(
                    {"error": "invalid_host",
                     "message": f"this server does not answer for Host {quoted(host)}; "
                                "its operator names the allowed hosts (--allow-host)"},
                    status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
