"""A bound on the pongs a websocket client leaves unread, on uvicorn: a client that floods
pings cannot grow the server's memory.

uvicorn's websocket protocol answers every ping frame with a pong as it arrives, written
to the connection whatever the client reads; what the client leaves unread waits in the
server's memory (the application's own sends wait for the buffer to drain, pongs do
not). So anyone who reaches the port could send pings as fast as the network carries
them and read nothing, before any handshake (the upgrade to ``/peers/link`` needs only a
well-formed token) and past its deadline, and the server kept a copy of all of it. Here
a connection whose unsent output passes :data:`PENDING_LIMIT` after a pong is dropped
at once (a reset): a client that reads what it is sent stays far below it (the
application's sends stop at the transport's high-water mark, a keepalive pong is a few
bytes), one that does not has nothing more to wait for. And a connection that closes is
dropped if it has not closed within the protocol's close timeout (10 s,
:class:`ClosingDeadline`): a close waits for the output to be sent, and the system of a
client that reads nothing keeps the connection open for ever (a window of zero), each one
holding its socket and buffers (and a link's application, waiting to write) for good.

Give :func:`bounded_pongs` to ``uvicorn.Config(ws=...)`` (``kinbox serve`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from typing import Any, cast

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger("kinbox.serve")

PENDING_LIMIT = 1 << 20
"""Bytes a connection may have written and not yet sent when a pong is added to them."""


def bounded_pongs(limit: int = PENDING_LIMIT) -> type[WebSocketsSansIOProtocol]:
    """uvicorn's websocket protocol, dropping a connection once its unsent output passes
    ``limit`` bytes as it answers a ping, or once it has not closed within the close
    timeout of its close."""
    if limit < 1:
        raise ValueError("a pending limit must be positive")

    class BoundedPongs(WebSocketsSansIOProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.closing = ClosingDeadline(
                cast(asyncio.Transport, transport), self.loop, self.close_timeout
            )
            super().connection_made(self.closing)  # type: ignore[arg-type]

        def connection_lost(self, exc: Exception | None) -> None:
            self.closing.lost()
            super().connection_lost(exc)

        def handle_ping(self) -> None:
            if self.transport.is_closing():
                self.conn.data_to_send()  # the pong of a connection going: nobody reads it
                return
            super().handle_ping()
            if self.transport.get_write_buffer_size() > limit:
                log.info(
                    "dropped a websocket client that left %d bytes of pongs unread",
                    self.transport.get_write_buffer_size(),
                )
                self.closing.drop()

    return BoundedPongs


class ClosingDeadline:
    """A connection's transport whose close ends within ``timeout`` seconds: a close waits
    for the output to be sent, and the system of a client that reads nothing keeps the
    connection open for ever (a window of zero). Past ``timeout`` it is dropped."""

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, timeout: float
    ) -> None:
        self.transport = transport
        self.loop = loop
        self.timeout = timeout
        self.timer: asyncio.TimerHandle | None = None

    def close(self) -> None:
        """Close once the output is sent, or drop the connection past the timeout."""
        self.transport.close()
        if self.timer is None:
            self.timer = self.loop.call_later(self.timeout, self.drop)

    def drop(self) -> None:
        """Reset the connection now, its unsent output discarded, here and in the system
        (a plain close would leave the system sending it, to a client that reads none)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            # A socket already gone: OSError, or under uvloop ValueError (its descriptor -1).
            with contextlib.suppress(OSError, ValueError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def lost(self) -> None:
        """The connection ended: no drop is due."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
