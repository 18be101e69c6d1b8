"""What an API request may carry besides what its route reads: the query parameters the
route takes, each once, and no body where it takes none.

Starlette hands a route whatever the query string holds; a route reads the names it
knows and the rest went unread. So ``GET /cron/runs?job=cj_1`` (the filter is the path,
``/cron/jobs/cj_1/runs``) answered every job's runs as if filtered, ``?limti=5`` a full
listing, ``?limit=1&limit=500`` whichever one Starlette kept; and a body sent to a call
that takes none (``POST .../trigger`` with ``{"at": ...}``) was dropped, the job run
now. Each is refused here, naming what was not taken, before the route acts. The
webhook and websocket routes are not shaped: platforms and peers have their own rules;
nor is ``/healthz``, whose probes add query strings of their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response

from . import json_body
from .errors import BackendRefused, clipped, quoted
from .json_answers import refused_answer

Handler = Callable[[Request], Awaitable[Response]]

EMPTY_CAP = 64
"""The most bytes read of a body where a call takes none (room for ``{}`` and blanks)."""

PAGE = ("limit", "offset")
"""The query parameters of a listing."""


def check_query(request: Request, takes: Sequence[str]) -> None:
    """:class:`BackendRefused` (422) for a query parameter ``request``'s route does not
    take, or one given more than once."""
    names = Counter(name for name, _ in request.query_params.multi_items())
    unknown = sorted(name for name in names if name not in takes)
    known = f"it takes {list(takes)}" if takes else "it takes none"
    if unknown:
        raise BackendRefused(422, "invalid_argument",
                             f"unknown query parameters {quoted(unknown)}"
                             f" for {request.method} {clipped(request.url.path)}; {known}")
    repeated = sorted(name for name, count in names.items() if count > 1)
    if repeated:  # names the route takes (unknown ones are refused above): ``field`` too
        raise BackendRefused(422, "invalid_argument",
                             f"query parameters given more than once: {quoted(repeated)}",
                             field=repeated[0])


async def check_no_body(request: Request) -> None:
    """:class:`BackendRefused` (422) for a body on a call that takes none; an empty one,
    or an empty JSON object (what some clients send by default), is no body."""
    try:
        raw = (await json_body.read_capped(request, EMPTY_CAP)).strip()
    except BackendRefused as exc:
        if exc.status != 413:
            raise
        raw = b"?"  # longer than any empty body: refused below, unread
    if raw and not _empty_object(raw):
        raise BackendRefused(422, "invalid_argument",
                             f"{request.method} {clipped(request.url.path)} takes no body")


def _empty_object(raw: bytes) -> bool:
    try:
        return raw[:1] == b"{" and json_body.parse(raw) == {}
    except BackendRefused:  # not JSON: a body all the same
        return False


def shaped(handler: Handler, *, query: Sequence[str] = (), body: bool = False) -> Handler:
    """``handler``, reached only by a request with no query parameter but ``query`` (each
    once) and, unless it takes a ``body``, none on a call that changes state."""

    async def checked(request: Request) -> Response:
        try:
            check_query(request, query)
            if not body and request.method not in ("GET", "HEAD"):
                await check_no_body(request)
        except BackendRefused as exc:  # answered here: the routes mount in any app
            return refused_answer(exc)
        return await handler(request)

    return checked
