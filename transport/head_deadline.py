"""A deadline for a request's head on uvicorn: a slow client cannot hold a connection for ever.

uvicorn (its h11 protocol) waits for the end of a request's line and headers as long as
the client takes: a client that opens a connection and sends nothing, or a head one
byte at a time, holds it (and its socket) for ever, before any route or the peer
endpoint's handshake limits see it. This protocol arms a timer whenever the connection
waits for a head (on connect, and when the next request of a kept-alive connection
begins to arrive) and disarms it once the head is whole; past :data:`HEAD_TIMEOUT` the
client is answered ``408`` and the connection closed. What follows the head (a body, a
websocket) has its own deadlines (:mod:`.json_body`, :mod:`.handshake_slots`).

A route that answers before it read the whole body (413 too large, 408 too slow, 404
and 401 before the body) leaves the rest of the body coming: uvicorn reads and drops it
so the connection can serve the next request, and each byte the client drips holds the
connection open again, past every deadline. So once an answer is complete while its
request's body is still coming, the rest has the same ``timeout`` to end; past it the
connection is closed. Not at once: a client still uploading would get a reset in place
of its answer (the last bytes it sent make the closed socket answer with a reset, which
can drop the answer unread), so a well-behaved client still reads its 413.

A request h11 cannot parse is answered in JSON too (:mod:`.not_http`).

Give :func:`head_deadline` to ``uvicorn.Config(http=...)`` (``kinbox serve`` does).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .not_http import NotHttpAnswered

HEAD_TIMEOUT = 10.0
"""Seconds a client has to send a request's line and headers (a few hundred bytes)."""
_BODY = b'{"error": "request_timeout", "message": "the request head did not come in time"}'
TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
)
"""The answer to a head that did not all come in time."""


def head_deadline(timeout: float = HEAD_TIMEOUT) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a ``timeout`` (seconds) on every request head (and a
    JSON answer to a request it cannot parse)."""
    if not timeout > 0:
        raise ValueError("a head deadline must be positive")

    class HeadDeadline(NotHttpAnswered):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._watch_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                cycle = self.cycle  # this request's: a later one on the connection is not cut
                self.loop.call_later(timeout, self._rest_of_body_late, cycle)

        def _rest_of_body_late(self, cycle: object) -> None:
            if (
                self.cycle is cycle
                and self.conn.their_state is h11.SEND_BODY
                and not self.transport.is_closing()
            ):
                self.transport.close()

        def _watch_head(self) -> None:
            """Armed while a head is awaited and the connection is open, else disarmed."""
            waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if waiting and self._head_timer is None:
                self._head_timer = self.loop.call_later(timeout, self._late)
            elif not waiting:
                self._disarm()

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _late(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(TIMED_OUT)
                self.transport.close()

    return HeadDeadline
