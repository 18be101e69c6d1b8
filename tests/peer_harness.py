"""Two real runtimes on 127.0.0.1: a receiving ``kinbox serve`` process, a cutting proxy.

``Receiver`` runs ``python -m kinbox.actors serve`` on its own SQLite file
and port, can be killed (SIGKILL) and started again on the same port, and
answers questions about its database by reading the file. ``CuttingProxy``
forwards TCP between a sender and the receiver and drops every connection
on request, as a flaky network would. ``FakePeer`` proves a device key like a
receiver and then behaves as a test tells it. ``Served`` serves a runtime this test
process drives (its HTTP app, with the peer endpoint) with uvicorn in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvicorn
import websockets
from websockets.asyncio.server import ServerConnection
from websockets.sync.client import ClientConnection

from kinbox.actors import Runtime
from kinbox.actors.cli import main
from kinbox.actors.peers import new_invite
from kinbox.actors.serve import app_for
from kinbox.persistence.peers import DeviceRecord
from kinbox.transport import HandshakeLimits
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.grants import GrantView, new_token, secret_hash
from kinbox.transport.handshake import new_nonce
from kinbox.transport.identity import SEAL_NONCE_BYTES, DeviceIdentity
from kinbox.transport.link import LinkState, SenderLink

from .helpers import wait_for


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVING = re.compile(r"kinbox serving http://127\.0\.0\.1:(\d+)/")
"""The line ``kinbox serve`` writes once its socket is bound."""


def port_open(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:port."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def cli(*argv: str) -> Any:
    """Run a ``kinbox`` command with ``--json`` in this process; its parsed output."""
    out = io.StringIO()
    assert main([*argv, "--json"], out=out) == 0
    return json.loads(out.getvalue())


class Receiver:
    """A ``kinbox serve`` child process on its own database and port."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "receiver.db"
        self.url = f"sqlite:///{self.path}"
        self.port = port or 0
        """0 until the first start: ``kinbox serve --port 0`` binds a port nobody holds and
        says which (a port chosen free here and bound later by the child could be taken
        in between, by another test worker). Later starts bind it again."""
        self.log = folder / "receiver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        """The receiver's URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        """Start serving and wait until the port accepts connections."""
        said = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kinbox.actors", "serve", "--db", self.url,
                 "--port", str(self.port)], stdout=log, stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        proc = self.proc
        if self.port:
            wait_for(lambda: port_open(self.port) or proc.poll() is not None, 60,
                     "the receiver to listen")
        else:
            wait_for(lambda: self._serving(said) or proc.poll() is not None, 60,
                     "the receiver to say where it serves")
            self.port = self._serving(said) or 0
        assert proc.poll() is None, self.log.read_text()[-2000:]
        return self

    def _serving(self, offset: int) -> int | None:
        """The port of the "kinbox serving http://..." line written after ``offset``."""
        with self.log.open("rb") as log:
            log.seek(offset)
            found = SERVING.search(log.read().decode(errors="replace"))
        return int(found.group(1)) if found else None

    def kill(self) -> None:
        """SIGKILL: no goodbyes, nothing flushed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        wait_for(lambda: not port_open(self.port), 10, "the port to close")

    def stop(self) -> None:
        """SIGTERM and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def invite(self, ttl: str = "10m") -> str:
        """A pairing code from ``kinbox peers invite`` on the receiver's database."""
        return str(cli("peers", "invite", "--db", self.url, "--ttl", ttl)["code"])

    def peers(self, *action: str) -> Any:
        """``kinbox peers <action...>`` on the receiver's database."""
        return cli("peers", *action, "--db", self.url)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Read the receiver's database directly (it may be running)."""
        with contextlib.closing(sqlite3.connect(self.path, timeout=10)) as con:
            return con.execute(sql, params).fetchall()

    def peer_rows(self, device_id: str) -> list[str]:
        """Ids of the inbox rows received from ``device_id``, in journal order."""
        return [r[0] for r in self.query(
            "SELECT message_id FROM agent_inbox_messages WHERE sender_chat_id = ? "
            "ORDER BY seq", (f"peer:{device_id}",))]


class CuttingProxy:
    """A TCP forwarder whose live connections can be cut at once."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.server.getsockname()[1])
        self.http = f"http://127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cuts = 0
        self._replies = threading.Event()
        """Cleared while the receiver's replies on live connections are held back."""
        self._replies.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), 5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self._replies),
                             daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket,
              flowing: threading.Event | None = None) -> None:
        try:
            while data := src.recv(65536):
                if flowing is not None:
                    flowing.wait()  # held: what the receiver said waits here (or is cut)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def hold_replies(self) -> None:
        """Forward nothing more from the receiver to the sender (its acks among it) until
        :meth:`cut`: what the sender sends still arrives, as when a link dies one way."""
        self._replies.clear()

    def cut(self) -> None:
        """Drop every live connection (both directions, mid-frame if need be)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self.cuts += 1
        self._replies.set()  # what was held is lost with the connections; new ones flow

    def close(self) -> None:
        """Stop accepting and cut everything."""
        self.server.close()
        self.cut()


class FakePeer:
    """A websockets server on 127.0.0.1 that proves its device key as a kinbox receiver
    does (challenge, then a welcome signed for an active grant) and then hands the open
    link to ``after_welcome``: a receiver of another version, or one that misbehaves.

    :meth:`grant_to` stores the outbound grant in a sender runtime, as a pairing would."""

    def __init__(self, after_welcome: Callable[[ServerConnection], Awaitable[None]]) -> None:
        self.identity = DeviceIdentity.generate()
        self.token = new_token(os.urandom(32))
        self._sock = socket.create_server(("127.0.0.1", 0))  # bound here: nobody takes it
        self.port = int(self._sock.getsockname()[1])
        self.http = f"http://127.0.0.1:{self.port}"
        self.opened = 0
        """Links that got their welcome."""
        self._after = after_welcome
        self._grant: GrantView | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),),
                                        daemon=True)
        self._thread.start()
        wait_for(lambda: port_open(self.port), 10, "the fake peer to listen")

    def grant_to(self, rt: Runtime) -> str:
        """Pair ``rt`` with this peer (its outbound grant, the link started); the device id."""
        me = rt.peers.identity
        self._grant = GrantView(me.device_id, me.public_key, secret_hash(self.token),
                                frozenset({"agent"}), "active")
        rt.peers.peers.save_outbound(self.identity.device_id, "fake", self.identity.public_key,
                                     self.http, me.seal(self.token, os.urandom(SEAL_NONCE_BYTES)),
                                     frozenset({"agent"}), rt.clock.now())
        rt.peers.link_for(self.identity.device_id)
        return self.identity.device_id

    def close(self) -> None:
        """Stop serving (open links are closed)."""
        self._stop.set()
        self._thread.join(10)

    async def _serve(self) -> None:
        async with websockets.serve(self._handle, sock=self._sock):
            await asyncio.to_thread(self._stop.wait)

    async def _handle(self, ws: ServerConnection) -> None:
        nonce = hs.new_nonce(os.urandom(32))
        await ws.send(f.encode(hs.challenge(self.identity, nonce)))
        hello = f.parse(await ws.recv())
        assert isinstance(hello, f.Hello)
        await ws.send(f.encode(hs.answer_hello(self.identity, nonce, hello, self._grant,
                                               self.token)))
        self.opened += 1
        with contextlib.suppress(websockets.ConnectionClosed):
            await self._after(ws)


def opened_link(sender: Runtime, rec: DeviceRecord, token: str,
                ws: ClientConnection) -> SenderLink:
    """``sender``'s link to the device of ``rec``, through its handshake on ``ws``."""
    link = SenderLink(sender.peers.identity, rec.device_id, rec.public_key, token, 1)
    link.connected(new_nonce(os.urandom(32)))
    while link.state is LinkState.HANDSHAKE:
        for text in link.frames_to_send():
            ws.send(text)
        link.receive(ws.recv(5))
    assert link.state is LinkState.OPEN
    return link


class Served:
    """A runtime whose HTTP app (with the peer endpoint) is served by uvicorn in a thread."""

    def __init__(self, rt: Runtime, handshakes: HandshakeLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``handshakes``: the peer endpoint's limits (its defaults when None); ``clock``:
        the app's monotonic seconds (lock-outs of wrong tokens and failed handshakes)."""
        self.rt = rt
        sock = socket.create_server(("127.0.0.1", 0))  # bound here: nobody takes it
        self.port = int(sock.getsockname()[1])
        self.http = f"http://127.0.0.1:{self.port}"
        app = app_for(rt, clock=clock, peer_handshakes=handshakes)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, args=([sock],), daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "uvicorn to start")

    def invite(self) -> str:
        return new_invite(self.rt.peers.identity, self.rt.peers.peers, frozenset({"agent"}),
                          600, self.rt.clock.now())

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
