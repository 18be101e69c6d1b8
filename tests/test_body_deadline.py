"""A request body must come whole in time, on a real uvicorn server on 127.0.0.1: a client
that sends its head and then drips or stops its body is answered 408, and nothing of it
reaches the runtime."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from starlette.applications import Starlette

from kinbox.transport import social_routes

from .test_http import Served


class Backend:
    """A social backend that records what it was asked to queue."""

    def __init__(self) -> None:
        self.ingested: list[dict[str, Any]] = []

    def now(self) -> float:
        return 1_000_000.0

    def webhook_secret(self, platform: str) -> bytes | None:
        return b"s3cret-for-slack"

    def ingest_event(self, platform: str, event: dict[str, Any]) -> dict[str, Any]:
        self.ingested.append(event)
        return {"accepted": True}


@pytest.mark.timeout(60)
def test_a_body_that_stops_coming_is_answered_408_at_its_deadline() -> None:
    """A webhook body declared 100 bytes of which 10 came held its route for ever, waiting
    for the rest: a client could hold as many as it opened. Past the route's deadline it
    is answered 408 ``request_timeout``, and nothing was queued."""
    backend = Backend()
    srv = Served(Starlette(routes=social_routes(backend, body_timeout=0.5)))
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
            s.sendall(
                b"POST /social/slack/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"text": "'
            )
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                chunk = s.recv(4096)  # the server answers; 20 s is far past the deadline
                assert chunk, answer
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        assert json.loads(body)["error"] == "request_timeout"
        assert backend.ingested == []
    finally:
        srv.close()
