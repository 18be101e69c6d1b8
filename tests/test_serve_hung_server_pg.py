"""``kinbox serve`` stopped by SIGTERM while a request waits on a PostgreSQL server that
stopped answering (hung, paused): the statement it sent waits for good (the kernel
acknowledges the bytes, so no TCP timeout ends it), and the command must still exit, with
its status and its one line (README, "serve")."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.sync.client import connect

from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.grants import new_token
from kinbox.transport.identity import DeviceIdentity

from .test_serve import get, run_kinbox, served_port  # noqa: F401  (a fixture)

EXIT_BOUND = 60.0
"""Seconds the command may take to exit: the 10 s its requests in flight get, the 2 s its
stop's closes get, and a loaded machine's slack."""


class FreezingProxy:
    """A TCP proxy to the database server on 127.0.0.1 that, once frozen, holds every byte
    its connections get and refuses new ones: to a client, a server that hung."""

    def __init__(self, url: str) -> None:
        self.server = urlsplit(url)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.frozen = threading.Event()
        self.opened = 0
        """Connections accepted so far (numbered from 0 in that order)."""
        self.held: set[int] = set()
        """Connections whose client sent a statement after the freeze, left unanswered."""
        self.changed = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        netloc = f"{self.server.username}@127.0.0.1:{self.listener.getsockname()[1]}"
        return self.server._replace(netloc=netloc).geturl()

    def _serve(self) -> None:
        while True:
            client, _ = self.listener.accept()
            if self.frozen.is_set():
                client.close()
                continue
            upstream = socket.create_connection(
                (self.server.hostname, self.server.port or 5432))
            with self.changed:
                number = self.opened
                self.opened += 1
            for source, sink, asks in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(number, source, sink, asks),
                                 daemon=True).start()

    def _pump(self, number: int, source: socket.socket, sink: socket.socket,
              asks: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self.frozen.is_set():
                    if asks:
                        with self.changed:
                            self.held.add(number)
                            self.changed.notify_all()
                    threading.Event().wait()  # never answered, never closed
                sink.sendall(data)

    def wait_held(self, among: range, timeout: float) -> None:
        """Wait until one of the connections numbered ``among`` holds a statement."""
        with self.changed:
            if not self.changed.wait_for(lambda: any(n in among for n in self.held), timeout):
                raise AssertionError(f"no statement of connections {among} reached the "
                                     f"frozen proxy within {timeout} s: {self.held}")


def http_read(port: int) -> None:
    """A read the HTTP API answers from the database on a worker thread."""
    status, _ = get(port, "/cron/jobs")
    assert status == 200


def peer_read(port: int) -> None:
    """A peer link's handshake: the endpoint reads the token's grant on a thread."""
    with contextlib.suppress(ConnectionClosed, InvalidStatus, InvalidURI, OSError):
        token = new_token(os.urandom(32))
        with connect(f"ws://127.0.0.1:{port}/peers/link", open_timeout=30, proxy=None,
                     additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            challenge = f.parse(ws.recv(30))
            assert isinstance(challenge, f.Challenge)
            me = DeviceIdentity.generate()
            nonce = hs.new_nonce(random.randbytes(hs.NONCE_BYTES))
            ws.send(f.encode(hs.hello(me, challenge, token, nonce, challenge.device_id)))
            ws.recv(60)  # the refusal (no such grant), or nothing for as long as it hangs


def unanswered(read: Callable[[int], None], port: int) -> None:
    """``read``, whose answer (if any ever comes) is not the test's business."""
    with contextlib.suppress(Exception):
        read(port)


@pytest.fixture
def proxy(pg_url: str) -> Iterator[FreezingProxy]:
    proxy = FreezingProxy(pg_url)
    yield proxy
    proxy.listener.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("read", [http_read, peer_read], ids=["http", "peer"])
def test_serve_exits_on_sigterm_while_a_request_waits_on_a_hung_server(
        run_kinbox: Any, proxy: FreezingProxy,  # noqa: F811
        read: Callable[[int], None]) -> None:
    """The first SIGTERM ended uvicorn's loop, whose close waited for the request's thread
    (an anyio worker for an HTTP route, the loop's stock default executor for the peer
    endpoint's ``asyncio.to_thread``), and the interpreter joined those threads at exit:
    the command never exited. It now exits with status 0 and its one line."""
    cmd = run_kinbox("serve", "--port", "0", "--db", proxy.url)
    port = served_port(cmd)
    with proxy.changed:
        before = proxy.opened
    read(port)  # the endpoint's thread opens its connection, kept for the next request
    with proxy.changed:
        opened = range(before, proxy.opened)
    proxy.frozen.set()
    threading.Thread(target=unanswered, args=(read, port), daemon=True).start()
    proxy.wait_held(opened, 60)
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.finish(EXIT_BOUND) == 0, cmd.output
    assert "kinbox serve stopped: HTTP closed, runtime stopped" in cmd.output
