"""The unauthenticated part of a peer connection is bounded, over a real uvicorn server on
127.0.0.1: a handshake has a deadline (the server closes it, ``1008 handshake timeout``)
and at most ``max_pending`` run at once (past that an upgrade is refused at once, 503
``busy`` with ``Retry-After``); a welcomed link holds no handshake slot."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from kinbox.actors import Runtime
from kinbox.actors.peers import new_invite
from kinbox.actors.serve import app_for
from kinbox.transport import HandshakeLimits
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.grants import new_token
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import parse_code
from kinbox.transport.peer_client import pair_with

from .helpers import quiet_brain, wait_for
from .test_http import Served

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def served(
    make_runtime: MakeRuntime, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Runtime, Served]]:
    limits: HandshakeLimits = request.param
    rt = make_runtime(brain=quiet_brain, data_dir=tmp_path / "data")
    srv = Served(app_for(rt, peer_handshakes=limits))
    try:
        yield rt, srv
    finally:
        srv.close()


def dial(port: int, path: str, token: str | None = None) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return connect(
        f"ws://127.0.0.1:{port}{path}", additional_headers=headers, open_timeout=10, proxy=None,
        legacy=True,
    )


def challenged(
    port: int, path: str, token: str | None = None
) -> tuple[ClientConnection, f.Challenge]:
    """A connection whose handshake is in progress: it has the challenge, says nothing."""
    ws = dial(port, path, token)
    challenge = f.parse(ws.recv(10))
    assert isinstance(challenge, f.Challenge)
    return ws, challenge


def pending(port: int, path: str, token: str | None = None) -> bool:
    """True when a new handshake is let in (its challenge came), False when refused busy."""
    try:
        challenged(port, path, token)[0].close()
    except InvalidStatus as exc:
        assert exc.response.status_code == 503
        return False
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("served", [HandshakeLimits(timeout=1.0, max_pending=1)], indirect=True)
@pytest.mark.parametrize("path", ["/peers/link", "/peers/pair"])
def test_a_handshake_that_never_ends_is_closed_at_its_deadline(
    served: tuple[Runtime, Served], path: str
) -> None:
    """A client that took the challenge and never sent its hello (or pair frame) was kept
    waiting for a constant 10 s, closed with no reason; the deadline is now the endpoint's
    setting, and the close says why: an ``error`` frame ``timeout``, then 1008 ``handshake
    timeout``. Its slot is free again: the next handshake is let in."""
    _, srv = served
    token = new_token(os.urandom(32)) if path == "/peers/link" else None
    ws, _ = challenged(srv.port, path, token)
    frames = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            frames.append(f.parse(ws.recv(20)))  # well past the deadline: the server ends it
    assert frames == [f.Error(None, "forbidden", "timeout")]
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1008, "handshake timeout")
    wait_for(lambda: pending(srv.port, path, token), 20, "the slot to be free again")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("served", [HandshakeLimits(timeout=60.0, max_pending=2)], indirect=True)
def test_handshakes_past_the_cap_are_refused_at_once_and_welcomed_links_do_not_count(
    served: tuple[Runtime, Served],
) -> None:
    """Anyone who reaches the port could open as many handshakes as it liked and leave each
    one waiting. Past ``max_pending`` of them an upgrade is refused at once: HTTP 503,
    ``{"error": "busy"}`` and a ``Retry-After`` (the earliest deadline), to either path.
    A device whose link was welcomed is no longer counted; a slot given back (a client
    that went away) lets the next handshake in."""
    rt, srv = served
    identity = DeviceIdentity.generate()
    code = new_invite(rt.peers.identity, rt.peers.peers, frozenset({"agent"}), 600, rt.clock.now())
    paired = pair_with(
        f"http://127.0.0.1:{srv.port}",
        identity,
        parse_code(code),
        "phone",
        hs.new_nonce(random.randbytes(32)),
    )
    with ExitStack() as stack:
        link, ch = challenged(srv.port, "/peers/link", paired.token)
        stack.callback(link.close)
        link.send(
            f.encode(
                hs.hello(
                    identity, ch, paired.token, hs.new_nonce(random.randbytes(32)), paired.device_id
                )
            )
        )
        assert isinstance(f.parse(link.recv(10)), f.Welcome)
        first = stack.enter_context(challenged(srv.port, "/peers/pair")[0])
        stack.enter_context(challenged(srv.port, "/peers/link", new_token(os.urandom(32)))[0])
        for path in ("/peers/pair", "/peers/link"):
            with pytest.raises(InvalidStatus) as refused:
                dial(srv.port, path, new_token(os.urandom(32)))
            answer = refused.value.response
            assert answer.status_code == 503
            assert json.loads(answer.body or b"{}") == {"error": "busy"}
            assert 1 <= int(answer.headers["Retry-After"]) <= 60
        link.send(f.encode(f.Ping("still-here")))  # the welcomed link carries on
        assert f.parse(link.recv(10)) == f.Pong("still-here")
        first.close()
        wait_for(lambda: pending(srv.port, "/peers/pair"), 20, "a slot to be free again")
