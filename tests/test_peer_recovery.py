"""Peer links when something goes wrong between the two devices: an answer lost on the
way, a refusal heard on a one-shot link, a database that fails a receiver's commit.

Two runtimes in this process, the receiver's HTTP app served by uvicorn on 127.0.0.1;
every check reads what the runtimes wrote.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from kinbox.actors import Runtime, SystemClock, ToolError
from kinbox.persistence import RowNotFound
from kinbox.persistence.driver_errors import OperationalError
from kinbox.persistence.peers import INBOUND, OUTBOUND
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.errors import HandshakeRefused
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import parse_code
from kinbox.transport.link import Acked, Effect, LinkState, Outgoing, Retry, SenderLink
from kinbox.transport.peer_client import connect_link, pair_with

from .helpers import quiet_brain, wait_for
from .peer_harness import Served, opened_link

pytestmark = pytest.mark.timeout(60)

Pair = tuple[Runtime, Runtime, Served]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    """``a`` (the sending device) and ``b`` (the receiving one, served)."""
    b = Runtime(db=f"sqlite:///{tmp_path / 'b' / 'b.db'}", brain=quiet_brain,
                clock=SystemClock()).start()
    a = Runtime(db=f"sqlite:///{tmp_path / 'a' / 'a.db'}", brain=quiet_brain,
                clock=SystemClock()).start()
    served = Served(b)
    yield a, b, served
    served.close()
    a.stop()
    b.stop()


def failing_once(real: Callable[..., object], failed: threading.Event) -> Callable[..., object]:
    """``real``, but its first call fails as a database does (a lock wait past its time)."""
    def call(*args: object, **kwargs: object) -> object:
        if not failed.is_set():
            failed.set()
            raise OperationalError("database is locked")
        return real(*args, **kwargs)
    return call


def nonce() -> str:
    return hs.new_nonce(os.urandom(hs.NONCE_BYTES))


# -- a pairing answer lost on the way -----------------------------------------------------


def test_a_pairing_whose_answer_was_lost_is_answered_again_for_the_same_device_key(
        pair: Pair) -> None:
    """The redemption committed, the ``paired`` frame never arrived (the connection
    dropped): the device's retry with the same code was refused as a used code, and it
    could never learn the token of the grant the other device held for it."""
    a, b, served = pair
    code, me = _pair_and_vanish(a, b, served)

    with pytest.raises(HandshakeRefused):  # another key with the same code gets nothing
        pair_with(served.http, DeviceIdentity.generate(), parse_code(code), "x", nonce())
    rec = a.peers.pair(served.http, code, name="b")  # the same key is answered again
    grant = b.peers.peers.device(me.device_id, INBOUND)
    assert grant is not None and grant.status == "active"
    assert [d.device_id for d in b.peers.peers.devices(INBOUND)] == [me.device_id]
    token = me.unseal(rec.token_sealed or "")
    with connect_link(served.http, token) as ws:  # the token it got is the grant's
        opened_link(a, rec, token, ws)
    wait_for(lambda: (b.peers.peers.device(me.device_id, INBOUND) or grant).last_seen_at,
             10, "the link to be seen")
    # Once the device has used its grant it holds the answer: the code is spent for good.
    used = b.peers.peers.device(me.device_id, INBOUND)
    with pytest.raises(HandshakeRefused):
        pair_with(served.http, me, parse_code(code), "a", nonce())
    assert b.peers.peers.device(me.device_id, INBOUND) == used


def test_a_lost_pairing_answer_is_not_given_again_once_the_grant_was_revoked(
        pair: Pair) -> None:
    a, b, served = pair
    code, me = _pair_and_vanish(a, b, served)
    b.peers.peers.set_status(me.device_id, "revoked", b.clock.now(), direction=INBOUND)
    with pytest.raises(HandshakeRefused):  # a revoke is not undone by the code
        pair_with(served.http, me, parse_code(code), "a", nonce())
    grant = b.peers.peers.device(me.device_id, INBOUND)
    assert grant is not None and grant.status == "revoked"


# -- a signed refusal on a one-shot link ---------------------------------------------------


def test_a_signed_refusal_on_a_one_shot_link_closes_the_device_as_on_a_live_link(
        pair: Pair) -> None:
    """``agent_read``/``agent_stop`` run on one-shot links; a ``refused`` frame the paired
    key signed there left the device active here, so every later call dialled it again."""
    a, b, served = pair
    rec = a.peers.pair(served.http, served.invite(), name="b")
    me, peer = a.peers.identity.device_id, f"peer:{rec.device_id}"
    for status in ("paused", "revoked"):
        b.peers.peers.set_status(me, status, b.clock.now(), direction=INBOUND)
        with pytest.raises(ToolError, match=status):
            a.peers.request(peer, "read")
        here = a.peers.peers.device(rec.device_id, OUTBOUND)
        assert here is not None and here.status == status, status
        assert here.last_error and status in here.last_error
        with pytest.raises(ToolError, match=f"is {status}"):  # not dialled again
            a.peers.request(peer, "stop")
        b.peers.peers.set_status(me, "active", b.clock.now(), direction=INBOUND)
        a.peers.peers.set_status(rec.device_id, "active", a.clock.now(), direction=OUTBOUND)


# -- a receiver's commit the database fails -------------------------------------------------


def _deliver(a: Runtime, served: Served, token: str, message_id: str) -> tuple[
        list[Effect], int | None]:
    """Offer one row on a fresh link; its effects and the close code (None while open)."""
    rec = a.peers.peers.device(served.rt.peers.identity.device_id, OUTBOUND)
    assert rec is not None
    link = SenderLink(a.peers.identity, rec.device_id, rec.public_key, token, 1)
    link.offer([Outgoing(message_id, "hello")])
    effects: list[Effect] = []
    code = None
    with connect_link(served.http, token) as ws:
        link.connected(nonce())
        while link.state is not LinkState.IDLE and not effects:
            for text in link.frames_to_send():
                ws.send(text)
            try:
                link.receive(ws.recv(5))
            except ConnectionClosed as exc:
                link.connection_lost("closed")
                code = exc.rcvd.code if exc.rcvd else None
            effects += link.effects()
        if link.state is LinkState.IDLE and code is None:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(5)
            code = closed.value.rcvd.code if closed.value.rcvd else None
    return effects, code


@pytest.mark.parametrize("failing", ["the commit", "the read before it"])
def test_a_delivery_the_database_cannot_commit_is_answered_unavailable(
        pair: Pair, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """The receiver's committer ended the link on a database error with no frame: the
    sender saw a dropped connection, not the ``unavailable`` the protocol has for it."""
    a, b, served = pair
    rec = a.peers.pair(served.http, served.invite(), name="b")
    token = a.peers.identity.unseal(rec.token_sealed or "")
    failed = threading.Event()
    store, name = ((b.peers.peers, "ensure_session_now") if failing == "the commit"
                   else (b.context.store, "project_by_slug"))
    monkeypatch.setattr(store, name, failing_once(getattr(store, name), failed))
    effects, code = _deliver(a, served, token, "m1")
    assert failed.is_set()
    [retry] = effects
    assert isinstance(retry, Retry) and retry.ids == ("m1",) and "unavailable" in retry.reason
    assert code == 1013
    me = a.peers.identity.device_id
    with pytest.raises(RowNotFound):  # nothing of it committed
        b.context.journal.get(f"peer-{me}-m1")
    effects, _ = _deliver(a, served, token, "m1")  # and the retry goes through
    assert effects == [Acked(("m1",))]
    assert b.context.journal.get(f"peer-{me}-m1")["content"] == "hello"


def _pair_and_vanish(a: Runtime, b: Runtime, served: Served) -> tuple[str, DeviceIdentity]:
    """``a``'s device asks ``b`` to pair with a fresh code and is gone before the answer;
    ``b`` commits the pairing all the same. The code, and ``a``'s identity."""
    code = served.invite()
    me = a.peers.identity
    with connect(f"ws://127.0.0.1:{served.port}/peers/pair", proxy=None,
                 open_timeout=5) as ws:
        ch = f.parse(ws.recv(5))
        assert isinstance(ch, f.Challenge)
        ws.send(f.encode(hs.pair(me, ch, parse_code(code), nonce(), "a")))
    wait_for(lambda: b.peers.peers.device(me.device_id, INBOUND) is not None, 10,
             "the redemption to commit")
    return code, me
