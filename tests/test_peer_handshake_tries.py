"""Failed peer handshakes are limited per client address, as wrong operator tokens are.

Each handshake with an unknown or wrong device token cost the receiver a database read
and a signed refusal, at any rate a client liked (64 at once): one client kept a server
signing. Now, over a real uvicorn server on 127.0.0.1, an address past its failed
handshakes (or pairings with codes no open invite matches) is refused at the upgrade of
either route (429, ``Retry-After``), before a challenge, a read or a signature, and logged
once; other addresses, and paired devices that prove their
key, are not held back; and a sender told 429 waits as for a busy receiver."""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from kinbox.actors import ManualClock, Runtime, SystemClock
from kinbox.actors.errors import PairingFailed, ToolError
from kinbox.persistence.peers import INBOUND, OUTBOUND
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.grants import new_token
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import new_code, parse_code
from kinbox.transport.token_tries import LOCKOUT, MAX_FAILURES

from .helpers import quiet_brain, wait_for
from .peer_harness import Served

pytestmark = pytest.mark.timeout(120)

OTHER = "127.0.0.2"
"""A second client address on the loopback network (Linux routes all of 127/8 there)."""


def handshake(port: int, token: str, identity: DeviceIdentity,
              source: str = "127.0.0.1") -> f.Frame:
    """One link handshake from ``source`` presenting ``token`` and proving ``identity``:
    the server's answer (welcome, refused, error); InvalidStatus when the upgrade is
    refused."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    with connect(f"ws://127.0.0.1:{port}/peers/link", sock=sock, open_timeout=10,
                 additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        ch = f.parse(ws.recv(10))
        assert isinstance(ch, f.Challenge)
        ws.send(f.encode(hs.hello(identity, ch, token, hs.new_nonce(os.urandom(32)),
                                  ch.device_id)))
        return f.parse(ws.recv(10))


def fail(port: int, source: str = "127.0.0.1", times: int = MAX_FAILURES) -> str:
    """``times`` handshakes from ``source`` with a token no grant has, each refused
    ``unknown`` (signed); the token."""
    stranger, token = DeviceIdentity.generate(), new_token(os.urandom(32))
    for _ in range(times):
        answer = handshake(port, token, stranger, source)
        assert isinstance(answer, f.Refused) and answer.reason == "unknown", answer
    return token


def locked_out(port: int, source: str = "127.0.0.1") -> InvalidStatus:
    """The refused upgrade of a handshake from ``source`` (fails the test if it is not)."""
    with pytest.raises(InvalidStatus) as refused:
        handshake(port, new_token(os.urandom(32)), DeviceIdentity.generate(), source)
    return refused.value


Pair = tuple[Runtime, Runtime, Served, str, ManualClock]


@pytest.fixture
def paired(make_runtime: Any, tmp_path: Path) -> Iterator[Pair]:
    """A sender on the test's clock paired with a receiver whose app's monotonic clock is
    its own manual one; the device id the sender addresses."""
    receiver = Runtime(db=f"sqlite:///{tmp_path / 'b' / 'b.db'}", brain=quiet_brain,
                       clock=SystemClock(), data_dir=tmp_path / "b").start()
    app_clock = ManualClock(start=1000.0)
    served = Served(receiver, clock=app_clock.now)
    sender = make_runtime(brain=quiet_brain, data_dir=tmp_path / "a")
    try:
        device = sender.peers.pair(served.http, served.invite(), name="b").device_id
        yield sender, receiver, served, device, app_clock
    finally:
        served.close()
        receiver.stop()


def _token_of(sender: Runtime, device: str) -> str:
    rec = sender.peers.peers.device(device, OUTBOUND)
    assert rec is not None
    return sender.peers.identity.unseal(rec.token_sealed or "")


def test_an_address_past_its_failed_handshakes_is_refused_at_the_upgrade(
        paired: Pair) -> None:
    _, _, served, _, app_clock = paired
    fail(served.port)
    refused = locked_out(served.port)  # no challenge: no read, no signature
    assert refused.response.status_code == 429
    assert refused.response.headers["Retry-After"] == str(int(LOCKOUT))
    assert json.loads(refused.response.body) == {"error": "too_many_tries"}
    app_clock.advance(LOCKOUT / 2)
    assert locked_out(served.port).response.headers["Retry-After"] == str(int(LOCKOUT / 2))
    app_clock.advance(LOCKOUT / 2)  # the lock-out is over: handshakes are answered again
    fail(served.port, times=1)


def test_the_lock_out_is_logged_once_above_debug_without_the_token(
        paired: Pair, caplog: pytest.LogCaptureFixture) -> None:
    _, _, served, _, _ = paired
    caplog.set_level(logging.DEBUG, logger="kinbox.peers")
    token = fail(served.port)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "127.0.0.1" in warned[0], warned
    said = [r.getMessage() for r in caplog.records]
    caplog.clear()
    for _ in range(3):
        locked_out(served.port)
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG] == []
    assert caplog.records  # each refusal is still there at DEBUG
    assert all(token not in line for line in said + [r.getMessage() for r in caplog.records])


def test_a_paired_device_is_answered_while_another_address_is_locked_out(
        paired: Pair) -> None:
    sender, _, served, device, _ = paired
    fail(served.port, OTHER)
    assert locked_out(served.port, OTHER).response.status_code == 429
    result = sender.peers.request(f"peer:{device}", "read")  # from 127.0.0.1
    assert result.status in ("idle", "running"), result
    answer = handshake(served.port, _token_of(sender, device), sender.peers.identity)
    assert isinstance(answer, f.Welcome)


def test_a_paired_device_proving_its_key_is_never_counted(paired: Pair) -> None:
    """Welcomed, or refused because its grant is paused: the device proved its key, so
    however often it dials it is not locked out (nor is its address)."""
    sender, receiver, served, device, _ = paired
    token = _token_of(sender, device)
    me = sender.peers.identity
    for _ in range(MAX_FAILURES + 2):
        assert isinstance(handshake(served.port, token, me), f.Welcome)
    assert receiver.peers.peers.set_status(me.device_id, "paused", receiver.clock.now(),
                                           direction=INBOUND)
    for _ in range(MAX_FAILURES + 2):
        answer = handshake(served.port, token, me)
        assert isinstance(answer, f.Refused) and answer.reason == "paused", answer
    fail(served.port, times=1)  # a stranger from the address is answered, not locked out


def test_a_sender_its_receiver_locked_out_waits_uncounted_as_for_a_busy_one(
        paired: Pair, clock: ManualClock) -> None:
    sender, _, served, device, app_clock = paired
    fail(served.port)  # from 127.0.0.1, the sender's address too
    me = sender.create_session(None, "sender").id
    [sent] = sender.peers.send_many(me, f"peer:{device}", ["hello"])

    def row() -> dict[str, Any]:
        return sender.context.journal.get(sent["message_id"])

    wait_for(lambda: row()["status"] == "pending" and row()["available_at"] > clock.now(),
             30, "the link to hear 429 and hand the row back")
    back = row()
    assert back["attempts"] == 0, back["last_error"]  # no failed attempt
    assert back["available_at"] >= clock.now() + LOCKOUT - 15  # its Retry-After
    rec = sender.peers.peers.device(device, OUTBOUND)
    assert rec is not None and rec.status == "active"

    def note() -> str:
        found = sender.peers.peers.device(device, OUTBOUND)
        return (found.last_error if found is not None else None) or ""

    # Shown as a receiver refusing this address for a while, not as a stranger's refusal.
    wait_for(lambda: "refusing this address" in note(), 30, "the device's note")
    assert "refused the connection" not in note()

    with pytest.raises(ToolError) as refused:
        sender.peers.request(f"peer:{device}", "read")
    assert refused.value.code == "execution_failed"
    assert refused.value.retry_after is not None and 1 <= refused.value.retry_after <= LOCKOUT

    app_clock.advance(LOCKOUT)

    def delivered_once_due() -> bool:
        now, r = clock.now(), row()
        if r["status"] == "pending" and r["available_at"] > now:
            clock.advance(r["available_at"] - now)
        return bool(r["status"] == "delivered")

    wait_for(delivered_once_due, 30, "the row delivered once the lock-out is over")
    assert row()["attempts"] == 0


def test_a_welcome_does_not_forget_the_failures_of_others_at_its_address(
        paired: Pair) -> None:
    """A device and a client trying tokens behind one NAT: were the device's welcomes to
    forget the address's failures, that client would never be locked out."""
    sender, _, served, device, _ = paired
    fail(served.port, times=MAX_FAILURES - 1)
    welcome = handshake(served.port, _token_of(sender, device), sender.peers.identity)
    assert isinstance(welcome, f.Welcome)
    fail(served.port, times=1)
    assert locked_out(served.port).response.status_code == 429


def pair_attempt(port: int, code: str, source: str = "127.0.0.1") -> f.Frame:
    """One pairing handshake from ``source`` redeeming ``code`` for a new device: the
    server's answer (``paired``, or an ``error``); InvalidStatus when the upgrade is
    refused."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    with connect(f"ws://127.0.0.1:{port}/peers/pair", sock=sock, open_timeout=10) as ws:
        ch = f.parse(ws.recv(10))
        assert isinstance(ch, f.Challenge)
        ws.send(f.encode(hs.pair(DeviceIdentity.generate(), ch, parse_code(code),
                                 hs.new_nonce(os.urandom(32)), "newcomer")))
        return f.parse(ws.recv(10))


def fail_pairing(port: int, receiver: Runtime, times: int = MAX_FAILURES) -> None:
    """``times`` pairings with codes that name ``receiver`` but no open invite, each
    refused ``forbidden``."""
    for _ in range(times):
        wrong = new_code(receiver.peers.identity.public_key, os.urandom(32))
        answer = pair_attempt(port, wrong)
        assert isinstance(answer, f.Error) and answer.code == "forbidden", answer


def test_an_address_past_its_failed_pairings_is_refused_at_the_upgrade(
        paired: Pair) -> None:
    """Each pairing code no open invite matches cost the receiver an invite's read and a
    signature check, at any rate a client liked. Past its failures an address is refused
    at the upgrade, a right code too (else the lock-out would tell which guess was right);
    another address pairs, and the address pairs again once its lock-out is over."""
    _, receiver, served, _, app_clock = paired
    fail_pairing(served.port, receiver)
    with pytest.raises(InvalidStatus) as refused:
        pair_attempt(served.port, served.invite())
    assert refused.value.response.status_code == 429
    assert refused.value.response.headers["Retry-After"] == str(int(LOCKOUT))
    assert json.loads(refused.value.response.body) == {"error": "too_many_tries"}
    assert isinstance(pair_attempt(served.port, served.invite(), source=OTHER), f.Paired)
    app_clock.advance(LOCKOUT)
    assert isinstance(pair_attempt(served.port, served.invite()), f.Paired)


def test_failed_pairings_and_failed_links_count_together(paired: Pair) -> None:
    """One address, one count: a client cannot double its tries by splitting them
    between the two routes."""
    _, receiver, served, _, _ = paired
    fail(served.port, times=MAX_FAILURES // 2)
    fail_pairing(served.port, receiver, times=MAX_FAILURES - MAX_FAILURES // 2)
    assert locked_out(served.port).response.status_code == 429


def test_pairing_from_a_locked_out_address_says_so_and_what_it_means_for_the_code(
        paired: Pair) -> None:
    """The operator is told the device refuses this address for a while and that its
    code was not read (not that it is good: the failed tries may have been this code)."""
    sender, receiver, served, _, _ = paired
    fail_pairing(served.port, receiver)
    with pytest.raises(PairingFailed) as failed:
        sender.peers.pair(served.http, served.invite(), name="again")
    assert (failed.value.reason, failed.value.retry, failed.value.status) == (
        "unavailable", True, 429)
    assert "refusing this address's handshakes for a while" in str(failed.value)
    assert "the code was not read" in str(failed.value)
    assert "still good" not in str(failed.value)
