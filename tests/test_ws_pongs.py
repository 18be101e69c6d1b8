"""A websocket client that floods pings and never reads their pongs is cut off, on a real
``kinbox serve`` process on 127.0.0.1: the pongs it leaves unread cannot pile up in the
server's memory. Well-behaved links, keepalive pings and all, are untouched."""

from __future__ import annotations

import base64
import os
import socket

import pytest

from kinbox.transport.grants import new_token

from .peer_harness import Receiver

FLOOD_BYTES = 64 << 20
"""Pings a flood sends at most: far past what the server may keep of their pongs (its
socket's buffers and the pending limit), small enough not to strain the machine when the
server keeps them all."""


def ping_frame(payload: bytes) -> bytes:
    """A masked websocket ping, as a client sends it."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x89, 0x80 | len(payload)]) + mask + masked


def upgraded(port: int, path: str) -> socket.socket:
    """A raw socket whose websocket upgrade to ``path`` was accepted; it reads no more."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {new_token(os.urandom(32))}"
        "\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return s


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", ["/peers/link", "/peers/pair"])
def test_a_client_that_floods_pings_and_reads_no_pong_is_cut_off(
    receiver: Receiver, path: str
) -> None:
    """Anyone who reaches the port (no token needed: the handshake has not begun) could
    send pings as fast as the network carries them and read nothing: the server answered
    each with a pong it kept in memory until the client read it, past the handshake's
    deadline too, so the server's memory grew by what the client sent (a gigabyte in
    under a minute, from each of 64 such connections). Once the pongs a connection left
    unread pass the pending limit, the server drops it."""
    chunk = ping_frame(b"p" * 125) * 512
    sent = 0
    # A reset, or a broken pipe: the server dropped the connection.
    with upgraded(receiver.port, path) as s, pytest.raises(OSError):
        while sent < FLOOD_BYTES:
            s.sendall(chunk)
            sent += len(chunk)
    assert sent < FLOOD_BYTES
