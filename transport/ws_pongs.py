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
bytes), one that does not has nothing more to wait for.

Give :func:`bounded_pongs` to ``uvicorn.Config(ws=...)`` (``kinbox serve`` does).
"""

from __future__ import annotations

import logging

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger("kinbox.serve")

PENDING_LIMIT = 1 << 20
"""Bytes a connection may have written and not yet sent when a pong is added to them."""


def bounded_pongs(limit: int = PENDING_LIMIT) -> type[WebSocketsSansIOProtocol]:
    """uvicorn's websocket protocol, dropping a connection once its unsent output passes
    ``limit`` bytes as it answers a ping."""
    if limit < 1:
        raise ValueError("a pending limit must be positive")

    class BoundedPongs(WebSocketsSansIOProtocol):
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
                self.transport.abort()

    return BoundedPongs
