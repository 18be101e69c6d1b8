"""The peer websockets (``/peers/link``, ``/peers/pair``) under generated input
(Hypothesis), over a real uvicorn server on 127.0.0.1 and a real SQLite file.

Whatever a client sends (a malformed upgrade, a wrong or forged credential, garbage or an
oversized frame in the handshake or on an open link, frames after its close), the server
refuses it with a precise reason (a JSON ``{"error": <refusal>}`` at the upgrade, an
``error`` frame naming the reason and close 1008 in the handshake, an ``error`` frame on a
link), stays up and serves the next good client, and commits nothing from a refused
frame: no row of any table changes, no file is written.
"""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from kinbox.actors.peers import new_invite
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.grants import HTTP_STATUS, Refusal
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import parse_code
from kinbox.transport.peer_client import pair_with
from kinbox.transport.token_tries import LOCKOUT

from .fuzz_harness import Fuzzed, ServerErrors, serving
from .helpers import wait_for

pytestmark = pytest.mark.timeout(120)
WAIT = 30.0
"""Seconds to wait for the server's next frame: its answers take milliseconds, but a
handshake on a loaded machine (the suite's four workers on two cores) took over 5 s."""

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
FRAME_REASONS = {"bad_field", "bad_json", "bad_keys", "bad_type", "bad_version", "bad_utf8",
                 "duplicate_key", "not_object", "too_large", "unknown_type"}
"""Every :class:`~kinbox.transport.errors.FrameError` reason."""
REFUSALS = {r.value for r in Refusal}


class Device:
    """A device paired for real with the served runtime, speaking raw frames."""

    def __init__(self, fuzzed: Fuzzed) -> None:
        self.port = fuzzed.open.port
        self.identity = DeviceIdentity.generate()
        code = new_invite(fuzzed.rt.peers.identity, fuzzed.rt.peers.peers,
                          frozenset({"agent"}), 600, fuzzed.rt.clock.now())
        paired = pair_with(f"http://127.0.0.1:{self.port}", self.identity, parse_code(code),
                           "fuzz",
                           hs.new_nonce(random.randbytes(32)))
        self.token, self.server_id = paired.token, paired.device_id

    def dial(self, path: str = "/peers/link", headers: dict[str, str] | None = None,
             query: str = "", host: str = "127.0.0.1") -> ClientConnection:
        """A connection to ``path``; the request names ``host`` (the socket is this
        machine's whatever it names)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT)
        return connect(f"ws://{host}:{self.port}{path}{query}", sock=sock, proxy=None,
                       additional_headers=({"Authorization": f"Bearer {self.token}"}
                                           if headers is None else headers),
                       open_timeout=WAIT, max_size=None, legacy=True)

    def open(self) -> ClientConnection:
        """A link past its handshake, once the server noted the device seen (a ping
        answered: the reader starts after that write)."""
        ws = self.dial()
        ch = f.parse(ws.recv(WAIT))
        assert isinstance(ch, f.Challenge)
        ws.send(f.encode(hs.hello(self.identity, ch, self.token,
                                  hs.new_nonce(random.randbytes(32)), self.server_id)))
        assert isinstance(f.parse(ws.recv(WAIT)), f.Welcome)
        ws.send(f.encode(f.Ping("ready")))
        assert f.parse(ws.recv(WAIT)) == f.Pong("ready")
        return ws


@pytest.fixture
def device(make_runtime: Any, tmp_path: Path, db_url: str) -> Iterator[tuple[Fuzzed, Device]]:
    with serving(make_runtime, tmp_path, db_url) as fuzzed:
        dev = Device(fuzzed)
        dev.open().close()  # its first link notes it seen: later ones change no row
        yield fuzzed, dev


def closed_with(ws: ClientConnection) -> tuple[list[Any], int | None]:
    """Every frame the server sends until it closes, and its close code."""
    got: list[Any] = []
    try:
        while True:
            got.append(f.parse(ws.recv(WAIT)))
    except ConnectionClosed as exc:
        return got, exc.rcvd.code if exc.rcvd else None


def still_serves(dev: Device) -> None:
    ws = dev.open()
    ws.send(f.encode(f.Ping("next")))
    assert f.parse(ws.recv(WAIT)) == f.Pong("next")
    ws.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.sampled_from(["\ud800", "a\x00", "x" * 300, "kbt_" + "A" * 43, "kbp_" + "B" * 43]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=3),
    max_leaves=8)
frame_like = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 2, "1", None, 1.0, True]),
     "type": st.sampled_from([*f.FRAME_TYPES, "x", ""])},
    optional={k: json_values for k in ("id", "text", "session", "req", "code", "message",
                                       "nonce", "sig", "device_id", "key", "name", "token")})
messages = st.one_of(
    st.binary(max_size=120), st.text(max_size=120),
    frame_like.map(json.dumps),
    frame_like.map(lambda d: json.dumps(d).encode()),
    st.sampled_from(["[" * 100_000, "x" * (70 * 1024), "{}", "null", '{"v":1,"v":1}']))
"""What a client might send as one websocket message: a frame, nearly one, or garbage."""


@FUZZ
@given(path=st.sampled_from(["/peers/link", "/peers/pair"]), first=messages)
@example(path="/peers/link", first=b"\xff" * (2 * 1024 * 1024))
@example(path="/peers/pair", first="x" * (2 * 1024 * 1024))
def test_garbage_in_the_handshake_is_refused_by_reason_and_the_next_device_served(
        device: tuple[Fuzzed, Device], path: str, first: str | bytes) -> None:
    fuzzed, dev = device
    # Each example a client no failed handshake of an earlier one locked out (token_tries).
    fuzzed.token_clock.advance(LOCKOUT)
    before = fuzzed.changes.snapshot()
    ws = dev.dial(path, None if path == "/peers/link" else {})
    assert isinstance(f.parse(ws.recv(WAIT)), f.Challenge)
    ws.send(first)
    got, code = closed_with(ws)
    assert code == 1008 and len(got) == 1, (got, code)
    assert isinstance(got[0], f.Error) and got[0].code == "forbidden", got
    assert got[0].message in FRAME_REASONS | REFUSALS, got
    assert fuzzed.changes.snapshot() == before
    still_serves(dev)


@FUZZ
@given(authorization=st.one_of(
           st.none(), st.just("Bearer"), st.just("Basic abc"), st.just("Bearer kbt_short"),
           st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60)
           .map(lambda t: "Bearer " + t)),
       query=st.sampled_from(["", "?token=x", "?access_token=kbt_" + "A" * 43, "?a=%FF"]),
       origin=st.sampled_from([None, None, "http://evil.example", "null"]),
       host=st.sampled_from([None, None, "evil.example", "127.0.0.1.evil"]))
def test_an_upgrade_without_a_usable_token_is_refused_in_json_before_any_state(
        device: tuple[Fuzzed, Device], authorization: str | None, query: str,
        origin: str | None, host: str | None) -> None:
    fuzzed, dev = device
    headers = {k: v for k, v in (("Authorization", authorization), ("Origin", origin))
               if v is not None}
    before = fuzzed.changes.snapshot()
    with pytest.raises(InvalidStatus) as info:
        dev.dial("/peers/link", headers, query, host or "127.0.0.1").close()
    response = info.value.response
    reason = json.loads(response.body)["error"]
    assert reason in REFUSALS and response.status_code == HTTP_STATUS[Refusal(reason)]
    expected = ("bad_origin" if origin or host else
                "token_in_query" if query.startswith("?token") or "access_token" in query
                else None)
    assert expected is None or reason == expected, (reason, headers, query)
    assert fuzzed.changes.snapshot() == before
    still_serves(dev)


@FUZZ
@given(path=st.one_of(
    st.sampled_from(["/peers", "/peers/link/", "/peers/pair/x", "/focal", "/cron/jobs", "/",
                     "/healthz", "/social/slack/events", "/peers/LINK"]),
    st.binary(max_size=60).map(lambda b: "/" + quote_from_bytes(b, safe="/"))))
def test_an_upgrade_to_a_path_that_is_no_peer_endpoint_is_a_json_404(
        device: tuple[Fuzzed, Device], path: str) -> None:
    fuzzed, dev = device
    if path in ("/peers/link", "/peers/pair"):
        return
    before = fuzzed.changes.snapshot()
    with pytest.raises(InvalidStatus) as info:
        dev.dial(path, {}).close()
    response = info.value.response
    assert response.status_code == 404, (path, response.status_code, response.body)
    assert json.loads(response.body)["error"] == "not_found"
    assert fuzzed.changes.snapshot() == before


@FUZZ
@given(token=st.binary(min_size=32, max_size=32).map(
    lambda b: "kbt_" + base64.urlsafe_b64encode(b).rstrip(b"=").decode()),
       stranger=st.booleans())
def test_a_token_no_grant_was_issued_with_gets_a_signed_refusal_and_changes_nothing(
        device: tuple[Fuzzed, Device], token: str, stranger: bool) -> None:
    fuzzed, dev = device
    fuzzed.token_clock.advance(LOCKOUT)  # as above
    me = DeviceIdentity.generate() if stranger else dev.identity
    before = fuzzed.changes.snapshot()
    ws = dev.dial("/peers/link", {"Authorization": f"Bearer {token}"})
    ch = f.parse(ws.recv(WAIT))
    assert isinstance(ch, f.Challenge)
    hello = hs.hello(me, ch, token, hs.new_nonce(random.randbytes(32)), dev.server_id)
    ws.send(f.encode(hello))
    got, code = closed_with(ws)
    assert code == 1008 and len(got) == 1 and isinstance(got[0], f.Refused), got
    assert got[0].reason == "unknown"
    assert fuzzed.changes.snapshot() == before
    still_serves(dev)


@FUZZ
@given(sent=st.lists(messages, min_size=1, max_size=5))
def test_garbage_on_an_open_link_is_answered_as_a_bad_frame_and_commits_nothing(
        device: tuple[Fuzzed, Device], sent: list[str | bytes]) -> None:
    fuzzed, dev = device
    ws = dev.open()
    for message in sent:
        before = fuzzed.changes.snapshot()
        ws.send(message)
        answer = f.parse(ws.recv(WAIT))
        if isinstance(answer, f.Error):
            assert answer.code in ("bad_frame", "rejected", "forbidden"), answer
            assert answer.code != "bad_frame" or answer.message in FRAME_REASONS or (
                answer.message.startswith("unexpected ")), answer
            assert fuzzed.changes.snapshot() == before, (message, answer)
        else:  # a frame the link takes: a ping, or a read or a stop of its session
            assert isinstance(answer, f.Pong | f.Result | f.Ack), (message, answer)
    ws.send(f.encode(f.Ping("alive")))
    assert f.parse(ws.recv(WAIT)) == f.Pong("alive")
    ws.close()


# -- frames after the close, on a socket of its own (a client library will not send them) --

def ws_frame(opcode: int, payload: bytes) -> bytes:
    """One masked client frame."""
    mask = os.urandom(4)
    n = len(payload)
    head = struct.pack("!B", 0x80 | opcode)
    head += (struct.pack("!B", 0x80 | n) if n < 126 else struct.pack("!BH", 0x80 | 126, n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawSocket:
    """A websocket client written by hand: it sends whatever it is told to."""

    def __init__(self, port: int, path: str, token: str | None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                          f"Sec-WebSocket-Version: 13\r\n{auth}\r\n".encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.sock.recv(4096)
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.buffer += data
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def read(self) -> tuple[int, bytes]:
        """The next server frame: (opcode, payload)."""
        b0, b1 = self._take(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", self._take(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", self._take(8))
        return b0 & 0x0F, self._take(n)

    def text(self, frame: f.Frame) -> None:
        self.sock.sendall(ws_frame(0x1, f.encode(frame).encode()))

    def close(self) -> None:
        self.sock.close()


def test_frames_sent_after_the_close_are_not_read(device: tuple[Fuzzed, Device]) -> None:
    """A client closes, then sends a delivery (and, on the pairing route, a pairing) in
    the same write: the server answers the close and commits neither."""
    fuzzed, dev = device
    raw = RawSocket(dev.port, "/peers/link", dev.token)
    ch = f.parse(raw.read()[1])
    assert isinstance(ch, f.Challenge)
    raw.text(hs.hello(dev.identity, ch, dev.token, hs.new_nonce(random.randbytes(32)),
                      dev.server_id))
    assert isinstance(f.parse(raw.read()[1]), f.Welcome)
    raw.text(f.Ping("p"))
    assert raw.read() == (0x1, f.encode(f.Pong("p")).encode())
    before = fuzzed.changes.snapshot()
    raw.sock.sendall(ws_frame(0x8, struct.pack("!H", 1000))
                     + ws_frame(0x1, f.encode(f.Deliver("after-close", "hi", None)).encode()))
    opcode, payload = raw.read()
    assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1000
    raw.close()
    pairing = RawSocket(dev.port, "/peers/pair", None)
    ch = f.parse(pairing.read()[1])
    assert isinstance(ch, f.Challenge)
    code = new_invite(fuzzed.rt.peers.identity, fuzzed.rt.peers.peers, frozenset({"agent"}),
                      600, fuzzed.rt.clock.now())
    before = fuzzed.changes.snapshot()  # the invite is the test's own row
    request = hs.pair(DeviceIdentity.generate(), ch, parse_code(code),
                      hs.new_nonce(random.randbytes(32)),
                      "late")
    pairing.sock.sendall(ws_frame(0x8, struct.pack("!H", 1000))
                         + ws_frame(0x1, f.encode(request).encode()))
    opcode, _ = pairing.read()
    assert opcode == 0x8
    pairing.close()
    still_serves(dev)
    assert fuzzed.changes.snapshot() == before
    assert fuzzed.rt.inbox() == []


def test_a_device_that_closes_right_after_its_hello_is_no_server_error(
        device: tuple[Fuzzed, Device]) -> None:
    """It closed before the welcome went out: the failed send escaped the handler, and
    uvicorn logged "Exception in ASGI application" with a traceback at ERROR, once for
    every device that went away at that moment."""
    fuzzed, dev = device
    with ServerErrors() as errors:
        before = fuzzed.changes.snapshot()
        for _ in range(3):
            raw = RawSocket(dev.port, "/peers/link", dev.token)
            ch = f.parse(raw.read()[1])
            assert isinstance(ch, f.Challenge)
            hello = hs.hello(dev.identity, ch, dev.token, hs.new_nonce(random.randbytes(32)),
                             dev.server_id)
            raw.sock.sendall(ws_frame(0x1, f.encode(hello).encode())
                             + ws_frame(0x8, struct.pack("!H", 1000)))
            assert raw.read()[0] == 0x8  # the server answered the close
            raw.close()
        wait_for(lambda: not fuzzed.open.server.server_state.tasks, 10,
                 "the server's handlers to end")
        assert errors.lines == []
        assert fuzzed.changes.snapshot() == before
    still_serves(dev)
