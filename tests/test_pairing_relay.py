"""Pairing over plain ``ws://`` with an attacker relaying between the two devices.

The phone (``a``) pairs with the laptop (``b``, served by uvicorn on 127.0.0.1)
through a relay on 127.0.0.1 that reads every frame and tries what it can with
them. Before codes named their device and stayed off the wire, a relay that
answered with its own challenge read the code from the ``pair`` frame, redeemed
it at the laptop with its own key and answered the phone with its own key:
the phone pinned the relay (it accepted ``paired`` from whatever key had
challenged it) and the laptop held an active grant for the relay. Now each try
fails with a clear error, the relay holds no grant, and the same code still
pairs the phone with the laptop afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import ServerConnection, serve

from kinbox.actors import ConfigError, PairingFailed, Runtime, SystemClock
from kinbox.persistence.peers import INBOUND
from kinbox.transport import HandshakeLimits
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.errors import HandshakeRefused
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import parse_code
from kinbox.transport.peer_client import pair_with

from .helpers import quiet_brain
from .peer_harness import Served

pytestmark = pytest.mark.timeout(60)

ATTACKER = DeviceIdentity.generate()


def nonce() -> str:
    return hs.new_nonce(os.urandom(hs.NONCE_BYTES))


class Relay:
    """A websocket server between the phone and the laptop's ``/peers/pair``: each
    connection is handed to ``strategy`` with the laptop's challenge; every frame it
    reads is kept in ``seen``."""

    def __init__(self, laptop_port: int, strategy: Strategy) -> None:
        self.laptop = f"ws://127.0.0.1:{laptop_port}/peers/pair"
        self.strategy = strategy
        self.seen: list[str] = []
        self.failure: BaseException | None = None
        """What went wrong in the strategy (an assertion of its, in the relay's thread)."""
        self.done = threading.Event()
        self.server = serve(self._handle, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def dial_laptop(self) -> tuple[ClientConnection, f.Challenge]:
        """A connection of the relay's own to the laptop, and its challenge."""
        ws = connect(self.laptop, proxy=None, open_timeout=20, legacy=True)
        ch = self.read(ws)
        assert isinstance(ch, f.Challenge)
        return ws, ch

    def read(self, ws: ClientConnection | ServerConnection) -> f.Frame:
        text = ws.recv(20)
        assert isinstance(text, str)
        self.seen.append(text)
        return f.parse(text)

    def _handle(self, phone: ServerConnection) -> None:
        try:
            laptop, ch = self.dial_laptop()
            with laptop:
                self.strategy(self, phone, laptop, ch)
        except BaseException as exc:  # reported by the test, not by the server
            self.failure = exc
        finally:
            self.done.set()

    def close(self) -> None:
        self.server.shutdown()


Strategy = Callable[[Relay, ServerConnection, ClientConnection, f.Challenge], None]


def own_challenge(
    relay: Relay, phone: ServerConnection, laptop: ClientConnection, ch: f.Challenge
) -> None:
    """Stand in for the laptop from the first frame: the relay's own device id."""
    phone.send(f.encode(hs.challenge(ATTACKER, nonce())))
    with pytest.raises(ConnectionClosed):  # the phone hangs up, sending nothing
        relay.read(phone)


def own_key_in_the_request(
    relay: Relay, phone: ServerConnection, laptop: ClientConnection, ch: f.Challenge
) -> None:
    """Pass the challenge on, read the request, and try it at the laptop: replayed on a
    connection of its own, and with the relay's own key put in (signed by that key)."""
    phone.send(f.encode(ch))
    request = relay.read(phone)
    assert isinstance(request, f.Pair)
    again, _ = relay.dial_laptop()
    with again:
        again.send(f.encode(request))
        assert isinstance(relay.read(again), f.Error)
    mine = dataclasses.replace(
        request, device_id=ATTACKER.device_id, public_key=ATTACKER.public_key
    )
    data = hs._transcript(
        "pair", ch.device_id, ATTACKER.device_id, ch.nonce, mine.nonce, hs._pairing(mine)
    )
    laptop.send(f.encode(dataclasses.replace(mine, signature=ATTACKER.sign(data))))
    answer = relay.read(laptop)
    assert isinstance(answer, f.Error)
    phone.send(f.encode(answer))  # the laptop's refusal, passed on


def own_answer(
    relay: Relay, phone: ServerConnection, laptop: ClientConnection, ch: f.Challenge
) -> None:
    """Pass the request on faithfully, and answer the phone with the relay's own key."""
    phone.send(f.encode(ch))
    request = relay.read(phone)
    assert isinstance(request, f.Pair)
    laptop.send(f.encode(request))
    paired = relay.read(laptop)
    assert isinstance(paired, f.Paired)
    proof = hs.PairingProof(request.device_id, request.public_key, request.name, "")
    phone.send(f.encode(hs.paired(ATTACKER, ch.nonce, proof, request, paired.token)))


@pytest.fixture
def devices(tmp_path: Path) -> Iterator[tuple[Runtime, Runtime, Served]]:
    """``a``, the phone, and ``b``, the laptop, served."""
    b = Runtime(
        db=f"sqlite:///{tmp_path / 'b' / 'b.db'}", brain=quiet_brain, clock=SystemClock()
    ).start()
    a = Runtime(
        db=f"sqlite:///{tmp_path / 'a' / 'a.db'}", brain=quiet_brain, clock=SystemClock()
    ).start()
    # The relay holds the laptop's first connection open across its own second one: on a
    # loaded machine that outlasted the default 10 s handshake deadline, and the phone
    # read the laptop's "timeout" where the test waits for the relay's tampering found out.
    served = Served(b, HandshakeLimits(timeout=60.0))
    yield a, b, served
    served.close()
    a.stop()
    b.stop()


@pytest.mark.parametrize(
    ("strategy", "reason"),
    [
        (own_challenge, "wrong_device"),
        (own_key_in_the_request, "bad_signature"),
        (own_answer, "wrong_device"),
    ],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_a_relay_reading_every_frame_cannot_pair_and_the_code_still_pairs_the_phone(
    devices: tuple[Runtime, Runtime, Served], strategy: Strategy, reason: str
) -> None:
    a, b, served = devices
    code = served.invite()
    relay = Relay(served.port, strategy)
    try:
        # pair_with, as rt.peers.pair dials, with room for a loaded machine: the relay
        # makes two round trips to the laptop (and a commit there) per phone's frame.
        with pytest.raises(HandshakeRefused) as failed:
            pair_with(
                f"http://127.0.0.1:{relay.port}",
                a.peers.identity,
                parse_code(code),
                "laptop",
                nonce(),
                timeout=30,
            )
        assert relay.done.wait(30)
        assert relay.failure is None, relay.failure
    finally:
        relay.close()
    assert failed.value.reason == reason, failed.value
    assert a.peers.peers.devices() == []  # the phone pinned nothing
    assert b.peers.peers.device(ATTACKER.device_id, INBOUND) is None
    secret = code.split("_", 2)[2]  # base64url has "_" too: the secret is all after the second
    assert not any(secret in text for text in relay.seen)
    assert not any(parse_code(code).invite_hash in text for text in relay.seen)
    rec = a.peers.pair(served.http, code, name="laptop")  # the same code, directly
    assert rec.device_id == b.peers.identity.device_id
    assert rec.public_key == b.peers.identity.public_key
    grant = b.peers.peers.device(a.peers.identity.device_id, INBOUND)
    assert grant is not None and grant.public_key == a.peers.identity.public_key


def test_a_pairing_a_relay_spoiled_says_so_and_that_the_code_is_still_good(
    devices: tuple[Runtime, Runtime, Served],
) -> None:
    """What ``rt.peers.pair`` (and ``kinbox peers pair``) tells the operator: a reason to
    branch on, ``retry`` true, and words saying what happened and what to do."""
    a, _, served = devices
    relay = Relay(served.port, own_challenge)
    try:
        with pytest.raises(PairingFailed) as failed:
            a.peers.pair(f"http://127.0.0.1:{relay.port}", served.invite(), name="laptop")
        assert relay.done.wait(30)
        assert relay.failure is None, relay.failure
    finally:
        relay.close()
    assert (failed.value.reason, failed.value.retry) == ("wrong_device", True)
    assert "code is still good for this device" in str(failed.value)
    assert ATTACKER.device_id in str(failed.value)  # who answered, and whom the code names


def test_a_code_of_the_first_format_is_refused_before_anything_is_dialled(
    devices: tuple[Runtime, Runtime, Served],
) -> None:
    """``kbp_`` and 43 characters named no device and were sent as they were: the phone
    says to make a new one, and dials nothing (a server here would have been called)."""
    a, _, _ = devices
    dialled: list[ServerConnection] = []
    with serve(dialled.append, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        try:
            with pytest.raises(ConfigError) as refused:
                a.peers.pair(f"http://127.0.0.1:{port}", "kbp_" + "x" * 43)
        finally:
            server.shutdown()
    assert refused.value.field == "code"
    assert "earlier kinbox" in str(refused.value)
    assert "kinbox peers invite" in str(refused.value)
    assert dialled == [] and a.peers.peers.devices() == []
