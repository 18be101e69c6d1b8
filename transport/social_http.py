"""``POST /social/{platform}/events``: chat-platform webhook deliveries into social ingress.

The route checks, in this order and before anything is queued: that the
platform has a webhook (its secret is registered; else 404), the body size
(``Content-Length`` and the bytes actually read; 413 beyond the cap; 408 when it has
not all come in time), the
signature (:mod:`.webhook_signature`; 401 unsigned, malformed, stale or
forged; a delivery seen before within the replay window: 409 while the first is being
handled, the first's 202 receipt marked ``duplicate`` once it was accepted), the JSON
(400 not JSON, 422 not an object), and
then hands the event to the backend, which validates and queues it (422 a
bad field, 503 the queue is full). Accepted: 202 with the event id and the
session it goes to. The signature replaces the ``X-Kinbox`` header the
other state-changing routes need: a platform cannot send that header, and
a forged cross-site request cannot sign.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import json_body
from . import webhook_signature as sig
from .errors import BackendRefused, SignatureProblem, SignatureRejected, quoted
from .http_app import DescribedRoute
from .json_answers import error, refused_answer

log = logging.getLogger("kinbox.http")

MAX_BODY = 256 * 1024
"""Largest webhook body accepted, in bytes."""


class SocialBackend(Protocol):
    """What the webhook route needs from a runtime. ``now`` and ``webhook_secret`` are in
    memory and run on the event loop; ``ingest_event`` may read the database (has another
    process run this event already?), so it runs on a worker thread."""

    def now(self) -> float:
        """The runtime's time (the replay window is measured on it)."""
        ...

    def webhook_secret(self, platform: str) -> bytes | None:
        """The platform's signing secret; None when it has no webhook."""
        ...

    def ingest_event(self, platform: str, event: dict[str, Any]) -> dict[str, Any]:
        """Validate and queue an event; a receipt, or :class:`BackendRefused` (may block)."""
        ...


def social_routes(backend: SocialBackend, *, max_body: int = MAX_BODY,
                  window: float = sig.REPLAY_WINDOW,
                  body_timeout: float = json_body.BODY_TIMEOUT) -> list[Route]:
    """The webhook route (its signature stands in for the app's state-changing rule);
    a body must come whole within ``body_timeout`` seconds (else 408)."""
    guard = sig.ReplayGuard(window)

    async def events(request: Request) -> JSONResponse:
        platform = request.path_params["platform"]
        secret = backend.webhook_secret(platform)
        if not secret:  # None or empty: no webhook (an empty key would sign anything)
            return error(404, "not_found", f"no webhook for platform {quoted(platform)}")
        try:
            body = await json_body.read_capped(request, max_body, body_timeout)
        except BackendRefused as exc:
            return error(exc.status, exc.code, exc.message)
        signature = request.headers.get(sig.SIGNATURE_HEADER)
        try:
            ts = sig.verify(secret, request.headers.get(sig.TIMESTAMP_HEADER), signature, body,
                            backend.now(), window)
            assert signature is not None
            answered = guard.check(signature, backend.now())
        except SignatureRejected as exc:
            log.info("webhook delivery for %s refused: %s", platform, exc.reason.value)
            status = 409 if exc.reason is SignatureProblem.REPLAYED else 401
            return error(status, exc.reason.value, exc.detail)
        if answered is not None:  # accepted before: the platform missed the answer
            log.info("webhook delivery for %s repeated; answered as before", platform)
            return JSONResponse({**answered, "duplicate": True}, status_code=202)
        try:
            event = json_body.parse(body)
            if not isinstance(event, dict):
                raise BackendRefused(422, "invalid_argument", "the body must be a JSON object")
        except BackendRefused as exc:
            return error(exc.status, exc.code, exc.message)
        # Remembered before the first await, so a twin delivery arriving while this one is
        # handled is refused (409: it may yet fail); withdrawn if the handling refuses it
        # (it may come again), its receipt kept if it is accepted (a repeat gets it).
        guard.remember(signature, ts, backend.now())
        try:
            # A thread: the ingest may read the database (a retry another process ran).
            receipt = await run_in_threadpool(backend.ingest_event, platform, event)
        except BackendRefused as exc:
            guard.withdraw(signature)
            return refused_answer(exc)  # a bad event's 422 names its field
        except BaseException:
            guard.withdraw(signature)
            raise
        guard.accepted(signature, receipt)
        return JSONResponse(receipt, status_code=202)

    return [
        DescribedRoute(
            "/social/{platform}/events", events, methods=["POST"],
            about="a chat platform's signed webhook event, queued for its thread's session",
        )
    ]
