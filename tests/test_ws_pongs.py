"""A websocket client that floods pings and never reads their pongs is cut off, on a real
``kinbox serve`` process (and uvicorn with its protocol) on 127.0.0.1: the pongs it leaves
unread cannot pile up in the server's memory, nor hold a connection past its close.
Well-behaved links, keepalive pings and all, are untouched (the peer tests)."""

from __future__ import annotations

import base64
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from kinbox.actors import Runtime
from kinbox.actors.serve import app_for
from kinbox.transport import HandshakeLimits
from kinbox.transport import frames as f
from kinbox.transport.grants import new_token
from kinbox.transport.ws_pongs import bounded_pongs

from .helpers import wait_for
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


@pytest.fixture
def lenient(make_runtime: Callable[..., Runtime], tmp_path: Path) -> Iterator[int]:
    """The port of a uvicorn serving a runtime's app with the protocol of ``kinbox serve``,
    its pending limit far above what a test sends; one handshake at a time, for 1 s."""
    rt = make_runtime(data_dir=tmp_path / "data")
    sock = socket.create_server(("127.0.0.1", 0))
    app = app_for(rt, peer_handshakes=HandshakeLimits(timeout=1.0, max_pending=1))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws=bounded_pongs(1 << 30))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "uvicorn to start")
    yield int(sock.getsockname()[1])
    server.should_exit = True
    thread.join(10)


def unread(port: int) -> socket.socket:
    """A connection to ``/peers/link`` whose client sent pings and reads nothing: more
    pongs than the sockets' buffers hold wait at the server."""
    s = upgraded(port, "/peers/link")
    s.sendall(ping_frame(b"p" * 125) * (8_000_000 // 131))
    return s


def let_in(port: int) -> bool:
    """Is a new handshake let in (its challenge comes), not refused busy?"""
    try:
        with connect(
            f"ws://127.0.0.1:{port}/peers/link",
            open_timeout=10,
            proxy=None,
            additional_headers={"Authorization": f"Bearer {new_token(os.urandom(32))}"},
        ) as ws:
            return isinstance(f.parse(ws.recv(10)), f.Challenge)
    except InvalidStatus as exc:
        assert exc.response.status_code == 503
        return False


@pytest.mark.timeout(120)
def test_a_client_that_reads_nothing_holds_no_handshake_slot_past_its_deadline(
    lenient: int,
) -> None:
    """The handshake's sends had no deadline, only its read: a client that left pongs
    unread (its buffers full) kept the server's challenge, or its goodbye at the deadline,
    waiting to be written for ever, and held its handshake slot for good. 64 such
    connections (one here) and no device could link or pair again: every upgrade was
    refused busy. At its deadline (and a moment for the goodbye) the slot is free."""
    with unread(lenient):
        wait_for(lambda: let_in(lenient), 30, "a new handshake to be let in")


def reset(s: socket.socket) -> bool:
    """Has the server reset ``s``? Asks the system, reading nothing (data the server sent
    earlier would come first)."""
    return s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0


@pytest.mark.timeout(120)
def test_a_connection_whose_output_the_client_never_reads_ends_after_its_close(
    lenient: int,
) -> None:
    """A connection closed while output waited for a client that reads nothing (pongs to
    its pings, below the pending limit) was never closed: the close waits for that output
    to be sent, and the client's system keeps the connection alive for ever with a
    window of zero. Each held its socket and its buffers for good, and the handshake's
    slot was free again, so a client could pile up as many as it liked. Past the close
    timeout after its handshake ended (its deadline, 1 s here), it is dropped."""
    with unread(lenient) as s:
        wait_for(lambda: reset(s), 60, "the server to drop the connection")


@pytest.mark.timeout(10)
def test_a_drop_of_a_connection_whose_socket_is_gone_still_aborts_it() -> None:
    """uvloop's transport hands out a socket object whose descriptor is already -1 once
    the connection closed, and its ``setsockopt`` raises ValueError (not OSError): the
    drop then raised out of the close timer, an ERROR traceback at shutdown, and the
    transport was never aborted."""
    import asyncio

    from kinbox.transport.ws_pongs import ClosingDeadline

    class GoneSocket:
        def setsockopt(self, *args: object) -> None:
            raise ValueError("negative file descriptor")

    class Transport:
        aborted = False

        def get_extra_info(self, name: str) -> object:
            return GoneSocket() if name == "socket" else None

        def abort(self) -> None:
            self.aborted = True

    transport = Transport()
    loop = asyncio.new_event_loop()
    try:
        ClosingDeadline(transport, loop, 10.0).drop()  # type: ignore[arg-type]
    finally:
        loop.close()
    assert transport.aborted
