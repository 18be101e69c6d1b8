"""Peers between devices, end to end: two runtimes in two processes over 127.0.0.1.

The receiver is a real ``kinbox serve`` child process (it can be SIGKILLed);
the sender is a runtime in the test process; raw websockets clients play
misbehaving peers. Every check reads the databases the runtimes wrote.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from kinbox.actors import (
    ConfigError,
    KinboxError,
    ManualClock,
    PairingFailed,
    Runtime,
    SystemClock,
    ToolError,
    peer_link,
)
from kinbox.actors.cli import main
from kinbox.persistence.inbox_core import PEER, backoff_delay
from kinbox.persistence.peers import OUTBOUND
from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import new_code, parse_code
from kinbox.transport.peer_client import pair_with

from .helpers import quiet_brain, wait_for
from .peer_harness import CuttingProxy, Receiver, cli, free_port, port_open

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sender(tmp_path: Path) -> Iterator[Runtime]:
    rt = Runtime(db=f"sqlite:///{tmp_path / 'a' / 'sender.db'}",
                 brain=quiet_brain, clock=SystemClock())
    rt.start()
    yield rt
    rt.stop()


def caller(rt: Runtime) -> object:
    project = rt.project("default")
    assert project is not None
    return rt.tools_for(rt.create_session(project.id, "me").id)


def delivered(rt: Runtime, n: int) -> Callable[[], bool]:
    return lambda: len(rt.inbox(state="delivered")) >= n


# -- pairing, sending, reading -------------------------------------------------------------


def test_pair_send_read_and_list_across_two_processes(receiver: Receiver,
                                                      sender: Runtime) -> None:
    rec = sender.peers.pair(receiver.http, receiver.invite(), name="bee")
    me = sender.peers.identity.device_id
    assert rec.device_id == receiver.peers("whoami")["device_id"]
    [grant] = receiver.peers("list")["items"]
    assert (grant["device_id"], grant["direction"], grant["status"], grant["scopes"]) == (
        me, "inbound", "active", ["agent"])
    assert receiver.query("SELECT kind, project_id FROM sessions WHERE id = ?",
                          (f"suzent:{me}",)) == [("remote", "social")]

    tools = caller(sender)
    sent = [tools.agent_send(f"peer:{rec.device_id}", f"hello {i}")  # type: ignore[attr-defined]
            for i in range(3)]
    assert all(s["status"] == "pending" for s in sent)
    wait_for(delivered(sender, 3), 20, "three acks")
    assert receiver.peer_rows(me) == [f"peer-{me}-{s['message_id']}" for s in sent]
    assert receiver.query("SELECT DISTINCT target_chat_id, kind FROM agent_inbox_messages") == [
        (f"suzent:{me}", "remote_agent_message")]

    listed = tools.agent_list()  # type: ignore[attr-defined]
    assert listed["agents"][-1] == {**listed["agents"][-1], "agent_id": f"peer:{rec.device_id}",
                                    "kind": "remote", "status": "ready", "title": "bee"}
    assert listed["agents"][0]["kind"] == "interactive"  # local sessions first
    read = tools.agent_read(f"peer:{rec.device_id}")  # type: ignore[attr-defined]
    assert read["agent_id"] == f"peer:{rec.device_id}" and isinstance(read["transcript"], str)
    with pytest.raises(Exception, match="is not active"):
        tools.agent_stop(f"peer:{rec.device_id}")  # type: ignore[attr-defined]

    out = sender.peers.peers.row_counts()[rec.device_id]
    assert out == {"delivered": 3}


def test_a_device_that_is_not_paired_is_not_available(sender: Runtime) -> None:
    tools = caller(sender)
    with pytest.raises(Exception, match="not available"):
        tools.agent_send("peer:0123456789ab", "hi")  # type: ignore[attr-defined]
    assert sender.inbox() == []


# -- handshake matrix over a real socket ---------------------------------------------------


class Peer:
    """A test-side device: pairs for real, then speaks raw frames."""

    def __init__(self, receiver: Receiver) -> None:
        self.r = receiver
        self.identity = DeviceIdentity.generate()
        paired = pair_with(receiver.http, self.identity, parse_code(receiver.invite()), "raw",
                           hs.new_nonce(random.randbytes(32)))
        self.token = paired.token
        self.server_id = paired.device_id
        self.server_key = paired.public_key

    def open(self, *, token: str | None = None, header: str | None = None, query: str = "",
             identity: DeviceIdentity | None = None) -> ClientConnection:
        """Connect and run the handshake; raises on refusal."""
        token = token or self.token
        headers = {"Authorization": header if header is not None else f"Bearer {token}"}
        if header == "":
            headers = {}
        ws = connect(f"ws://127.0.0.1:{self.r.port}/peers/link{query}",
                     additional_headers=headers, proxy=None, open_timeout=20, legacy=True)
        me = identity or self.identity
        ch = f.parse(ws.recv(20))
        assert isinstance(ch, f.Challenge)
        hello = hs.hello(me, ch, token, hs.new_nonce(random.randbytes(32)), self.server_id)
        ws.send(f.encode(hello))
        welcome = f.parse(ws.recv(20))
        if isinstance(welcome, f.Refused):  # proved to be the paired device's refusal
            ws.close()
            raise PermissionError(hs.check_refused(me, ch, hello, token, welcome,
                                                   self.server_key).value)
        if not isinstance(welcome, f.Welcome):
            ws.close()
            raise PermissionError(f"unsigned {getattr(welcome, 'message', welcome.TYPE)}")
        hs.check_welcome(me, ch, hello, token, welcome, self.server_key)
        return ws


def refusal(fn: Callable[[], object]) -> str:
    try:
        ws = fn()
    except InvalidStatus as exc:
        return str(json.loads(exc.response.body)["error"])
    except PermissionError as exc:
        return str(exc)
    assert isinstance(ws, ClientConnection)
    ws.close()
    return "accepted"


def test_handshake_matrix_only_valid_is_accepted_before_any_state(receiver: Receiver) -> None:
    good, other, paused, revoked = (Peer(receiver) for _ in range(4))
    receiver.peers("pause", paused.identity.device_id)
    receiver.peers("revoke", revoked.identity.device_id)
    impostor = DeviceIdentity.generate()  # claims good's device id with the wrong key

    class Impostor(DeviceIdentity):
        def __init__(self) -> None:
            self.__dict__.update(impostor.__dict__)
            self.device_id = good.identity.device_id

    expired = receiver.invite(ttl="1s")
    cases = {
        "no token": lambda: good.open(header=""),
        "malformed": lambda: good.open(header="Bearer not-a-token"),
        "token in the query string": lambda: good.open(query=f"?token={good.token}"),
        "unknown token": lambda: good.open(token="kbt_" + "A" * 43),
        "paused": lambda: paused.open(),
        "revoked": lambda: revoked.open(),
        "another device's token": lambda: other.open(token=good.token),
        "wrong key signature": lambda: good.open(identity=Impostor()),
    }
    got = {name: refusal(fn) for name, fn in cases.items()}
    assert got == {
        "no token": "no_token", "malformed": "malformed",
        "token in the query string": "token_in_query", "unknown token": "unknown",
        "paused": "paused", "revoked": "revoked",
        "another device's token": "unsigned wrong_device",
        "wrong key signature": "unsigned bad_signature"}
    # Nothing was created by any refused attempt: no rows, no device seen.
    assert receiver.query("SELECT COUNT(*) FROM agent_inbox_messages") == [(0,)]
    assert receiver.query("SELECT COUNT(*) FROM peer_devices WHERE last_seen_at IS NOT NULL"
                          ) == [(0,)]
    wait_for(lambda: receiver.query("SELECT expires_at FROM peer_invites ORDER BY created_at "
                                    "DESC LIMIT 1")[0][0] < __import__("time").time(), 5,
             "the short invite to expire")
    with pytest.raises(Exception, match="expired_invite"):
        pair_with(receiver.http, DeviceIdentity.generate(), parse_code(expired), "late",
                  hs.new_nonce(random.randbytes(32)))
    ws = good.open()  # valid
    ws.send(f.encode(f.Ping("p1")))
    assert f.parse(ws.recv(20)) == f.Pong("p1")
    ws.close()
    assert receiver.query("SELECT COUNT(*) FROM peer_devices WHERE last_seen_at IS NOT NULL"
                          ) == [(1,)]


def test_browser_origins_and_foreign_hosts_are_refused(receiver: Receiver) -> None:
    good = Peer(receiver)
    url = f"ws://127.0.0.1:{receiver.port}/peers/link"
    auth = {"Authorization": f"Bearer {good.token}"}
    with pytest.raises(InvalidStatus) as info:
        connect(url, additional_headers=auth, origin="http://evil.example", proxy=None)  # type: ignore[arg-type]
    assert info.value.response.status_code in (400, 403)
    with pytest.raises(InvalidStatus):
        connect(url, additional_headers={**auth, "Host": "evil.example"}, proxy=None)


def fuzz_frames(rng: random.Random, n: int) -> list[str | bytes]:
    samples: list[str | bytes] = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            samples.append(rng.randbytes(rng.randint(0, 200)))
        elif kind == 1:
            samples.append("".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(0, 80))))
        elif kind == 2:
            t = rng.choice([*f.FRAME_TYPES, "x"])
            body = {"v": rng.choice([1, 2, "1"]), "type": t,
                    rng.choice(["id", "text", "req", "extra"]): rng.choice([None, 1, "a b", ""])}
            samples.append(json.dumps(body))
        elif kind == 3:
            samples.append(json.dumps({"v": 1, "type": "deliver", "id": "m", "text": "x",
                                       "session": None, "more": 1}))
        else:
            samples.append(json.dumps({"v": 1, "type": "deliver", "id": "m" * 300, "text": "x",
                                       "session": None}) if i % 2 else "x" * (70 * 1024))
    return samples


def test_a_thousand_fuzzed_frames_over_a_socket_write_nothing(receiver: Receiver) -> None:
    good = Peer(receiver)
    ws = good.open()
    refused = 0
    for sample in fuzz_frames(random.Random(15), 1000):
        try:
            ws.send(sample)
            answer = f.parse(ws.recv(20))
            assert isinstance(answer, f.Error) and answer.code == "bad_frame"
            refused += 1
        except ConnectionClosed:  # too many bad frames: the server hangs up; dial again
            ws = good.open()
    ws.close()
    assert refused >= 900
    ws = good.open()
    ws.send(f.encode(f.Ping("alive")))
    assert f.parse(ws.recv(20)) == f.Pong("alive")
    ws.close()
    assert receiver.query("SELECT COUNT(*) FROM agent_inbox_messages") == [(0,)]


def test_a_repeat_gets_the_same_ack_and_other_content_is_rejected(receiver: Receiver) -> None:
    good = Peer(receiver)
    me = good.identity.device_id
    ws = good.open()
    ws.send(f.encode(f.Deliver("m1", "first", None)))
    assert f.parse(ws.recv(20)) == f.Ack("m1")
    receiver.kill()  # the receiver dies after its commit: the sender never heard more
    receiver.start()
    ws = good.open()
    ws.send(f.encode(f.Deliver("m1", "first", None)))  # the sender retries with the same id
    assert f.parse(ws.recv(20)) == f.Ack("m1")
    ws.send(f.encode(f.Deliver("m1", "changed", None)))
    answer = f.parse(ws.recv(20))
    assert isinstance(answer, f.Error) and (answer.id, answer.code) == ("m1", "rejected")
    ws.send(f.encode(f.Deliver("m2", "named", "side_1")))
    assert f.parse(ws.recv(20)) == f.Ack("m2")
    ws.send(f.encode(f.Deliver("m3", "bad name", "no/slash")))
    assert f.parse(ws.recv(20)).code == "rejected"  # type: ignore[attr-defined]
    ws.close()
    assert receiver.query("SELECT message_id, target_chat_id FROM agent_inbox_messages "
                          "ORDER BY seq") == [(f"peer-{me}-m1", f"suzent:{me}"),
                                              (f"peer-{me}-m2", f"suzent:{me}:side_1")]


def test_a_receiver_killed_around_its_commit_ends_with_one_row_after_the_retry(
        receiver: Receiver) -> None:
    good = Peer(receiver)
    me = good.identity.device_id
    ws = good.open()
    ws.send(f.encode(f.Deliver("early", "x", None)))
    receiver.kill()  # races the commit: before it or after it, the retry must leave one row
    receiver.start()
    ws = good.open()
    ws.send(f.encode(f.Deliver("early", "x", None)))
    assert f.parse(ws.recv(20)) == f.Ack("early")
    ws.close()
    assert receiver.peer_rows(me) == [f"peer-{me}-early"]


@pytest.mark.parametrize(("name", "field"), [("L" * 129, "name"),
                                              ("evil\x1b[2J", "name"),
                                              (None, "code")])
def test_a_bad_name_is_refused_before_the_code_is_spent(
        receiver: Receiver, sender: Runtime, name: str | None, field: str) -> None:
    """The other device spends the code, and replaces our earlier grant, as it answers:
    a name the column cannot hold failed after that and ended a working pairing."""
    rec = sender.peers.pair(receiver.http, receiver.invite())
    code = receiver.invite()
    with pytest.raises(ConfigError) as info:  # None: the code mistyped, short by one
        sender.peers.pair(receiver.http, code[:-1] if name is None else code,
                          name=name or "")
    assert info.value.field == field
    tools = caller(sender)
    tools.agent_send(f"peer:{rec.device_id}", "still paired")  # type: ignore[attr-defined]
    wait_for(delivered(sender, 1), 20, "the ack over the first pairing")
    assert sender.peers.pair(receiver.http, code, name="laptop").name == "laptop"  # unspent


def test_an_address_with_a_password_is_refused_before_the_code_is_spent(
        receiver: Receiver, sender: Runtime) -> None:
    """It would be stored and listed as given (``peers list --json``), password and all."""
    code = receiver.invite()
    scheme, _, rest = receiver.http.partition("://")
    with pytest.raises(ConfigError) as info:
        sender.peers.pair(f"{scheme}://me:s3cret@{rest}", code)
    assert info.value.field == "url"
    assert sender.peers.pair(receiver.http, code).device_id  # the code is unspent


@pytest.mark.parametrize("shape", [
    "{http}#pw@elsewhere.example",  # a fragment another parser reads as user:pw@host
    "{http}/#",
    "{http}/x@elsewhere.example/",  # an '@' past the host: a login to a lax parser
    "{http}/\\elsewhere.example",  # a backslash: a '/' to WHATWG parsers
    " {http}",  # stripped to pair, stored and listed with the blank
    "{http}/ ",
    "{http}/?token=x",  # dropped when dialling, kept in what is stored and listed
    "{scheme}://127.0.0.1%3A{port}",  # percent-escapes in the host: decoded by some
])
def test_an_ambiguous_address_is_refused_before_the_code_is_spent(
        receiver: Receiver, sender: Runtime, shape: str) -> None:
    """``http://me:1234#pw@host`` dials me:1234 (the rest a fragment, dropped) and was
    stored and listed as given, where a reader or another parser takes ``me:1234#pw`` for
    a login to ``host``; a blank, a backslash, a query, an '@' past the host are read one
    way by urlsplit and another by others. Each paired (or spent the code on a refused
    dial); each is a ConfigError on ``url``, the address unquoted past its host."""
    scheme, _, rest = receiver.http.partition("://")
    url = shape.format(http=receiver.http, scheme=scheme, port=rest.rpartition(":")[2])
    code = receiver.invite()
    with pytest.raises(ConfigError) as info:
        sender.peers.pair(url, code)
    assert info.value.field == "url"
    assert "pw" not in str(info.value) and "token=" not in str(info.value)
    assert sender.peers.peers.devices() == []
    assert sender.peers.pair(receiver.http, code).device_id  # the code is unspent


@pytest.mark.timeout(60)
def test_an_idle_link_neither_polls_hard_nor_stays_open(receiver: Receiver,
                                                        sender: Runtime) -> None:
    """A claim that found nothing was followed at once by the next: about 450 claims a
    second, each a transaction, for every paired device, and the link never idled out."""
    import time

    rec = sender.peers.pair(receiver.http, receiver.invite())
    tools = caller(sender)
    outbox = sender.peers.outbox
    claims: list[float] = []
    submit = outbox.submit_claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        claims.append(time.monotonic())
        return submit(*args, **kwargs)

    outbox.submit_claim = counted  # type: ignore[method-assign]
    tools.agent_send(f"peer:{rec.device_id}", "hello")  # type: ignore[attr-defined]
    wait_for(delivered(sender, 1), 20, "the ack")
    link = sender.peers.links[rec.device_id]
    wait_for(lambda: link.ws is None, 30, "the idle link to close")
    seconds = claims[-1] - claims[0] if len(claims) > 1 else 0.0
    assert len(claims) <= 3 + 2 * seconds  # about one a second while dry, not hundreds
    tools.agent_send(f"peer:{rec.device_id}", "again")  # type: ignore[attr-defined]
    wait_for(delivered(sender, 2), 20, "the second ack, on a new link")


# -- revocation ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["revoked", "paused"])
def test_this_sides_own_revoke_or_pause_stops_a_live_link(
        receiver: Receiver, sender: Runtime, status: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The link read the grant only before it opened: sends after this side's own
    ``kinbox peers revoke --direction outbound`` were still delivered."""
    monkeypatch.setattr(peer_link, "LINGER_SECONDS", 60.0)  # live until the test is done
    rec = sender.peers.pair(receiver.http, receiver.invite())
    tools = caller(sender)
    tools.agent_send(f"peer:{rec.device_id}", "before")  # type: ignore[attr-defined]
    wait_for(delivered(sender, 1), 20, "the first ack")
    link = sender.peers.links[rec.device_id]
    assert link.ws is not None  # live (lingering)
    sender.peers.peers.set_status(rec.device_id, status, sender.clock.now(),
                                  direction=OUTBOUND)
    wait_for(lambda: link.ws is None, 20, "the live link to close")
    after = tools.agent_send(f"peer:{rec.device_id}", "after")  # type: ignore[attr-defined]
    wait_for(lambda: sender.context.journal.get(after["message_id"])["status"] == "failed",
             10, "the row to fail")
    me = sender.peers.identity.device_id
    assert receiver.peer_rows(me) == [f"peer-{me}-{sender.inbox()[0]['message_id']}"]


def test_a_live_link_opened_with_a_token_its_grant_no_longer_has_takes_nothing_more(
        receiver: Receiver) -> None:
    """Pairing the device again (a new code redeemed) replaces its grant and the token:
    the old token is refused on a new link (signed ``unknown``), but a link it opened
    before stayed open, its deliveries committed and acknowledged, for as long as it
    lived: the watcher and the commit asked only whether the device's grant was active."""
    good = Peer(receiver)
    me = good.identity.device_id
    old = good.open()
    old.send(f.encode(f.Deliver("before", "x", None)))
    assert f.parse(old.recv(20)) == f.Ack("before")
    again = pair_with(receiver.http, good.identity, parse_code(receiver.invite()), "raw",
                      hs.new_nonce(random.randbytes(32)))
    assert again.token != good.token
    with pytest.raises(PermissionError, match="unknown"):
        good.open()  # the old token, on a new link
    got: list[str] = []
    try:  # the old link is closed, with a signed refusal, and takes nothing more
        # Its grant's watcher may have closed it already (on a loaded machine, before this
        # send): the send then fails, and the refusal still waits to be read.
        with contextlib.suppress(ConnectionClosed):
            old.send(f.encode(f.Deliver("after", "x", None)))
        while True:
            frame = f.parse(old.recv(20))
            got.append(frame.TYPE + (f" {frame.reason}" if isinstance(frame, f.Refused)
                                     else ""))
    except ConnectionClosed:
        got.append("closed")
    except TimeoutError:
        got.append("still open")
    assert got == ["refused unknown", "closed"]
    assert receiver.peer_rows(me) == [f"peer-{me}-before"]
    good.token = again.token
    ws = good.open()  # the new pairing works
    ws.send(f.encode(f.Deliver("after", "x", None)))
    assert f.parse(ws.recv(20)) == f.Ack("after")
    ws.close()


@pytest.mark.parametrize("action", ["revoke", "pause"])
def test_revoke_or_pause_closes_the_live_link_within_a_second_and_fails_at_once(
        receiver: Receiver, sender: Runtime, action: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Live until it hears: a link idle for LINGER_SECONDS closes on its own, and on a
    # loaded machine it may do so before the revoke reaches it (nothing then tells it).
    monkeypatch.setattr(peer_link, "LINGER_SECONDS", 60.0)
    rec = sender.peers.pair(receiver.http, receiver.invite())
    tools = caller(sender)
    tools.agent_send(f"peer:{rec.device_id}", "before")  # type: ignore[attr-defined]
    wait_for(delivered(sender, 1), 20, "the first ack")
    assert sender.peers.links[rec.device_id].ws is not None  # the link is live (lingering)
    me = sender.peers.identity.device_id
    receiver.peers(action, me)
    status = "revoked" if action == "revoke" else "paused"
    # The live link hears of it, with no send of this side's to ask: the receiver's link
    # re-reads its grant every STATUS_POLL_SECONDS (a quarter of a second) and says so. A
    # wall-clock second was the bound here; a loaded machine takes longer to carry it.
    wait_for(lambda: sender.peers.peers.device(rec.device_id, OUTBOUND).status == status,  # type: ignore[union-attr]
             20, "the sender to hear of it")
    after = tools.agent_send(f"peer:{rec.device_id}", "after")  # type: ignore[attr-defined]
    wait_for(lambda: sender.inbox(state="failed") != [], 20, "the row to fail")
    row = sender.context.journal.get(after["message_id"])
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert status in row["last_error"]
    device = sender.peers.peers.device(rec.device_id, OUTBOUND)
    assert device is not None and status in (device.last_error or "")  # kept: acks touched it
    assert receiver.peer_rows(me) == [f"peer-{me}-{sender.inbox()[0]['message_id']}"]
    listed = {a["agent_id"]: a for a in tools.agent_list()["agents"]}  # type: ignore[attr-defined]
    active = {a["agent_id"] for a in tools.agent_list("active")["agents"]}  # type: ignore[attr-defined]
    if action == "pause":
        assert listed[f"peer:{rec.device_id}"]["status"] == "paused"
    else:
        assert f"peer:{rec.device_id}" not in listed
    assert f"peer:{rec.device_id}" not in active


# -- secrets -------------------------------------------------------------------------------


def test_no_plaintext_token_in_either_database_or_the_logs(
        receiver: Receiver, sender: Runtime, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="kinbox")
    rec = sender.peers.pair(receiver.http, receiver.invite())
    caller(sender).agent_send(f"peer:{rec.device_id}", "secret?")  # type: ignore[attr-defined]
    wait_for(delivered(sender, 1), 20, "the ack")
    token = sender.peers.identity.unseal(rec.token_sealed or "")
    assert token.startswith("kbt_")
    found = [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert found == []
    assert token not in caplog.text
    assert receiver.query("SELECT COUNT(*) FROM peer_devices WHERE token_hash IS NOT NULL"
                          ) == [(1,)]


# -- cuts mid-stream -----------------------------------------------------------------------


def send_many(rt: Runtime, device_id: str, n: int) -> list[str]:
    me = rt.create_session(None, "bulk sender").id
    sent = rt.peers.send_many(me, f"peer:{device_id}", [f"m {i}" for i in range(n)])
    return [s["message_id"] for s in sent]


def assert_exactly_once_in_order(receiver: Receiver, rt: Runtime, ids: list[str]) -> None:
    me = rt.peers.identity.device_id
    assert receiver.peer_rows(me) == [f"peer-{me}-{mid}" for mid in ids]
    assert {r["status"] for r in rt.inbox()} == {"delivered"}


def test_sigkill_of_the_receiver_mid_stream_loses_and_doubles_nothing(
        receiver: Receiver, sender: Runtime) -> None:
    rec = sender.peers.pair(receiver.http, receiver.invite())
    ids = send_many(sender, rec.device_id, 2000)
    for _ in range(2):
        before = len(sender.inbox(state="delivered"))
        wait_for(lambda b=before: len(sender.inbox(state="delivered")) > b + 300, 60,
                 "progress before the kill")
        receiver.kill()
        receiver.start()
    wait_for(delivered(sender, 2000), 120, "every ack")
    assert_exactly_once_in_order(receiver, sender, ids)
    assert any(sender.context.journal.history(mid) for mid in ids), "the kills cost attempts"


def test_a_proxy_dropping_the_link_mid_stream_loses_and_doubles_nothing(
        receiver: Receiver, tmp_path: Path) -> None:
    proxy = CuttingProxy(receiver.port)
    rt = Runtime(db=f"sqlite:///{tmp_path / 'p' / 'sender.db'}",
                 brain=quiet_brain, clock=SystemClock())
    rt.start()
    try:
        rec = rt.peers.pair(proxy.http, receiver.invite())
        ids = send_many(rt, rec.device_id, 2000)
        for _ in range(3):
            before = len(rt.inbox(state="delivered"))
            wait_for(lambda b=before: len(rt.inbox(state="delivered")) > b + 200, 60,
                     "progress before the cut")
            proxy.cut()
        wait_for(delivered(rt, 2000), 120, "every ack")
        assert_exactly_once_in_order(receiver, rt, ids)
        retried = [h for mid in ids for h in rt.context.journal.history(mid)]
        assert retried, "the cuts must have cost attempts"
    finally:
        rt.stop()
        proxy.close()


# -- an offline peer on the injected clock -------------------------------------------------


def retry_window() -> float:
    """Seconds from the first failed attempt to the 48th: 2 + 4 + ... + 2048 + 36 * 3600."""
    return sum(backoff_delay(k, PEER.cap) for k in range(1, PEER.max_attempts))


@pytest.mark.parametrize(("down_for", "outcome"), [(0.5, "delivered"), (1.5, "failed")])
def test_an_offline_peer_is_retried_on_the_peer_schedule(
        receiver: Receiver, tmp_path: Path, down_for: float, outcome: str) -> None:
    clock = ManualClock()
    rt = Runtime(db=f"sqlite:///{tmp_path / 'o' / 'sender.db'}",
                 brain=quiet_brain, clock=clock)
    rt.start()
    try:
        rec = rt.peers.pair(receiver.http, receiver.invite())
        receiver.kill()  # offline from now on
        [mid] = send_many(rt, rec.device_id, 1)
        journal = rt.context.journal
        waited, attempts, back = 0.0, 0, False
        while True:
            wait_for(lambda a=attempts: journal.get(mid)["attempts"] > a
                     or journal.get(mid)["status"] == "delivered", 20, "the next attempt")
            row = journal.get(mid)
            if row["status"] != "pending":
                break
            attempts = row["attempts"]
            if not back and waited >= down_for * retry_window():
                receiver.start()
                back = True
            delay = backoff_delay(attempts, PEER.cap)
            assert row["available_at"] == pytest.approx(clock.now() + delay)
            waited += delay
            clock.advance(delay)
        row = journal.get(mid)
        assert row["status"] == outcome
        if outcome == "failed":
            assert row["attempts"] == PEER.max_attempts == 48
            assert waited == pytest.approx(retry_window())
            assert [h["event"] for h in journal.history(mid)] == ["retry"] * 47 + ["failed"]
            clock.advance(7200)
            assert journal.get(mid)["attempts"] == 48
            receiver.start()
        else:
            assert row["attempts"] < 48 and back
            me = rt.peers.identity.device_id
            assert receiver.peer_rows(me) == [f"peer-{me}-{mid}"]
    finally:
        rt.stop()


def test_a_peer_that_never_finishes_the_handshake_gives_the_row_back_for_a_retry(
        receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that takes the upgrade and says nothing held the row, its lease renewed,
    forever (no retry, 0 attempts); the handshake now has a deadline."""
    import asyncio
    import threading

    import websockets

    from kinbox.actors import peer_link

    monkeypatch.setattr(peer_link, "HANDSHAKE_SECONDS", 0.5)
    rt = Runtime(db=f"sqlite:///{tmp_path / 's' / 'sender.db'}", brain=quiet_brain,
                 clock=SystemClock())
    rt.start()
    stop = threading.Event()
    try:
        rec = rt.peers.pair(receiver.http, receiver.invite())
        receiver.kill()

        async def silent(ws: websockets.ServerConnection) -> None:
            await ws.wait_closed()  # takes the upgrade, never sends its challenge

        async def serve() -> None:
            async with websockets.serve(silent, "127.0.0.1", receiver.port):
                await asyncio.to_thread(stop.wait)

        server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        server.start()
        wait_for(lambda: port_open(receiver.port), 10, "the silent server")
        [mid] = send_many(rt, rec.device_id, 1)
        wait_for(lambda: rt.context.journal.get(mid)["attempts"] == 1, 20, "the retry")
        row = rt.context.journal.get(mid)
        assert row["status"] == "pending" and "handshake" in row["last_error"]
    finally:
        stop.set()
        rt.stop()


def test_a_message_no_peer_frame_can_carry_is_refused_before_anything_is_written(
        receiver: Receiver, sender: Runtime) -> None:
    """17,000 emoji are within the 20,000-character limit and over the 64 KiB frame: the
    send was committed and then failed on its first attempt."""
    rec = sender.peers.pair(receiver.http, receiver.invite())
    tools: Any = caller(sender)
    for text in ("\U0001f600" * 17_000, "\x01" * 12_000):
        with pytest.raises(ToolError) as info:
            tools.agent_send(f"peer:{rec.device_id}", text)
        assert info.value.code == "invalid_argument" and "too_large" in info.value.message
    assert sender.inbox() == []
    tools.agent_send(f"peer:{rec.device_id}", "\U0001f600" * 10_000)  # 40 KB: fits
    wait_for(delivered(sender, 1), 30, "the message that fits")


# -- who may end a pairing -----------------------------------------------------------------


def test_a_revoke_is_heard_on_a_new_link_as_a_refusal_signed_by_the_peer(
        receiver: Receiver, sender: Runtime) -> None:
    """No live link to carry a ``revoked`` frame: the next link's handshake is refused, with
    the receiver's signature, and only that makes the sender give the pairing up."""
    rec = sender.peers.pair(receiver.http, receiver.invite())
    receiver.peers("revoke", sender.peers.identity.device_id)
    [mid] = send_many(sender, rec.device_id, 1)
    wait_for(lambda: sender.context.journal.get(mid)["status"] == "failed", 20, "the failure")
    row = sender.context.journal.get(mid)
    assert row["attempts"] == 1 and "revoked" in row["last_error"]
    assert sender.peers.peers.device(rec.device_id, OUTBOUND).status == "revoked"  # type: ignore[union-attr]


def test_a_pause_heard_from_the_device_and_both_resumes_let_messages_through_again(
        receiver: Receiver, sender: Runtime, tmp_path: Path) -> None:
    """The device pauses this one: the next link's refusal records it paused here and fails
    the row; its link then ends (nothing to carry while paused). Resumed there and here
    (`kinbox peers resume` on the sender's database, another command's write), the device
    scan starts the link again and the next message is delivered."""
    rec = sender.peers.pair(receiver.http, receiver.invite())
    me = sender.peers.identity.device_id
    receiver.peers("pause", me)
    [mid] = send_many(sender, rec.device_id, 1)
    wait_for(lambda: sender.context.journal.get(mid)["status"] == "failed", 30, "the failure")
    assert sender.peers.peers.device(rec.device_id, OUTBOUND).status == "paused"  # type: ignore[union-attr]
    wait_for(lambda: rec.device_id not in sender.peers.links, 30, "the paused link to end")

    receiver.peers("resume", me)
    cli("peers", "resume", rec.device_id, "--db", f"sqlite:///{tmp_path / 'a' / 'sender.db'}")
    wait_for(lambda: rec.device_id in sender.peers.links, 30, "the scan to start the link")
    [again] = send_many(sender, rec.device_id, 1)
    wait_for(lambda: sender.context.journal.get(again)["status"] == "delivered", 30,
             "the message after both resumes")
    assert receiver.peer_rows(me) == [f"peer-{me}-{again}"]


STRANGERS = ["http 403 revoked", "another device's challenge", "an unsigned refusal",
             "a refusal signed by another key"]


@pytest.mark.parametrize("stranger", STRANGERS)
def test_a_stranger_at_the_peers_address_cannot_end_the_pairing(
        receiver: Receiver, tmp_path: Path, stranger: str) -> None:
    """A stale URL or a stranger on it refused the link (an HTTP 403, a ``forbidden``
    frame, a challenge from another device) and the sender marked the pairing revoked and
    failed its rows for good. Now the rows wait for the real peer and the operator sees why."""
    import asyncio
    import threading

    import websockets
    from websockets.http11 import Request, Response

    clock = ManualClock()
    rt = Runtime(db=f"sqlite:///{tmp_path / 's' / 'sender.db'}", brain=quiet_brain,
                 clock=clock)
    rt.start()
    stop = threading.Event()
    try:
        rec = rt.peers.pair(receiver.http, receiver.invite())
        receiver.kill()
        other = DeviceIdentity.generate()

        def deny(conn: websockets.ServerConnection, _req: Request) -> Response | None:
            if stranger == "http 403 revoked":  # with a terminal escape for the operator
                return conn.respond(403, '{"error": "revoked\\u001b[2J"}')
            return None

        async def answer(ws: websockets.ServerConnection) -> None:
            me = other.device_id if stranger == "another device's challenge" else rec.device_id
            nonce = hs.new_nonce(random.randbytes(32))
            await ws.send(f.encode(f.Challenge(me, nonce)))
            hello = f.parse(await ws.recv())
            assert isinstance(hello, f.Hello)
            if stranger == "an unsigned refusal":
                await ws.send(f.encode(f.Error(None, "forbidden", "revoked")))
            else:  # signs like a real server, with its own key
                await ws.send(f.encode(hs.answer_hello(other, nonce, hello, None,
                                                       "kbt_" + "A" * 43)))
            await ws.wait_closed()

        async def serve() -> None:
            async with websockets.serve(answer, "127.0.0.1", receiver.port,
                                        process_request=deny):
                await asyncio.to_thread(stop.wait)

        server = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        server.start()
        wait_for(lambda: port_open(receiver.port), 10, "the stranger")
        [mid] = send_many(rt, rec.device_id, 1)
        journal = rt.context.journal
        wait_for(lambda: journal.get(mid)["attempts"] == 1, 20, "the retry")
        row = journal.get(mid)
        device = rt.peers.peers.device(rec.device_id, OUTBOUND)
        assert device is not None and (row["status"], device.status) == ("pending", "active")
        assert device.last_error == row["last_error"] and "\x1b" not in device.last_error
        if stranger == "http 403 revoked":
            assert "revoked\\x1b[2J" in device.last_error  # shown, not obeyed
        listed = io.StringIO()
        assert main(["peers", "list", "--db", f"sqlite:///{tmp_path / 's' / 'sender.db'}"],
                    out=listed) == 0
        assert f"! {row['last_error']}" in listed.getvalue()  # the operator sees why
        stop.set()
        server.join(10)
        receiver.start()  # the real peer is back at its address
        clock.advance(backoff_delay(1, PEER.cap))
        wait_for(lambda: journal.get(mid)["status"] == "delivered", 20, "the delivery")
        me = rt.peers.identity.device_id
        assert receiver.peer_rows(me) == [f"peer-{me}-{mid}"]
        wait_for(lambda: rt.peers.peers.device(rec.device_id, OUTBOUND).last_error is None,  # type: ignore[union-attr]
                 10, "the problem to clear")
    finally:
        stop.set()
        rt.stop()


def test_a_process_without_the_paired_key_leaves_the_rows_to_one_that_has_it(
        receiver: Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Processes sharing a database each load the device key of their data folder (named
    after the URL's spelling, or --data-dir, or on another machine another home): one
    without the key that paired could not unseal the token and failed every row for good."""
    db = f"sqlite:///{tmp_path / 's' / 'sender.db'}"
    first = Runtime(db=db, brain=quiet_brain, clock=SystemClock(),
                    data_dir=str(tmp_path / "key-a")).start()
    rec = first.peers.pair(receiver.http, first_invite := receiver.invite())
    assert first_invite
    first.stop()
    other = Runtime(db=db, brain=quiet_brain, clock=SystemClock(),
                    data_dir=str(tmp_path / "key-b")).start()
    try:
        with caplog.at_level("ERROR", logger="kinbox.peers"):
            [mid] = send_many(other, rec.device_id, 1)
            wait_for(lambda: any("device key" in r.message for r in caplog.records), 10,
                     "the process to say why it cannot carry the rows")
        row = other.context.journal.get(mid)
        assert (row["status"], row["attempts"]) == ("pending", 0)
    finally:
        other.stop()
    again = Runtime(db=db, brain=quiet_brain, clock=SystemClock(),
                    data_dir=str(tmp_path / "key-a")).start()
    try:
        wait_for(lambda: again.context.journal.get(mid)["status"] == "delivered", 20,
                 "the process with the key to deliver it")
    finally:
        again.stop()


@pytest.mark.parametrize("session", ["", "has space", "x" * 65, 5])
def test_a_session_name_the_receiver_refuses_is_refused_at_the_send(
        receiver: Receiver, sender: Runtime, session: Any) -> None:
    """An empty name got 'a frame holds at most 65,536 bytes'; one with a space was
    queued and failed after a round trip."""
    rec = sender.peers.pair(receiver.http, receiver.invite())
    me = caller(sender)._caller().id  # type: ignore[attr-defined]
    with pytest.raises(ToolError) as info:
        sender.peers.send(me, f"peer:{rec.device_id}", "hello", session=session)
    assert info.value.code == "invalid_argument" and "session must be" in info.value.message
    assert sender.inbox() == []


def test_a_refusal_of_an_earlier_pairing_leaves_the_new_one_standing(
        sender: Runtime, receiver: Receiver) -> None:
    """A link that spoke with the old token while the device was paired again gets the
    old token refused: that refusal must not mark the new pairing revoked, and the rows
    it carried go again (with the new token) instead of failing."""
    from kinbox.actors.peer_link import PeerLink
    from kinbox.transport.link import Terminal

    svc = sender.peers
    first = svc.pair(receiver.http, receiver.invite(), name="laptop")
    old = svc.peers.device(first.device_id, OUTBOUND)
    svc.pair(receiver.http, receiver.invite(), name="laptop")  # paired again meanwhile
    PeerLink(svc, first.device_id).effects.apply([Terminal((), "unknown token")], old)  # type: ignore[arg-type]
    now = svc.peers.device(first.device_id, OUTBOUND)
    assert now is not None and now.status == "active"
    PeerLink(svc, first.device_id).effects.apply([Terminal((), "revoked")], now)
    closed = svc.peers.device(first.device_id, OUTBOUND)
    assert closed is not None and closed.status == "revoked"


@pytest.mark.timeout(60)
def test_a_failed_pairing_is_a_kinbox_error_saying_whether_to_try_again(
        receiver: Receiver, sender: Runtime) -> None:
    """``rt.peers.pair`` let the transport's own errors out, outside the one tree a
    caller catches (``KinboxError``); a refusal and an unreachable device must be told
    apart by attributes, not by reading the text."""
    # Well formed and naming the device, which never issued it.
    unknown = new_code(receiver.peers("whoami")["public_key"], b"a" * 32)
    with pytest.raises(PairingFailed) as refused:
        sender.peers.pair(receiver.http, unknown)
    assert isinstance(refused.value, KinboxError)
    assert (refused.value.reason, refused.value.retry) == ("expired_invite", False)
    with pytest.raises(PairingFailed) as away:
        sender.peers.pair(f"http://127.0.0.1:{free_port()}", receiver.invite())
    assert (away.value.reason, away.value.retry) == ("unavailable", True)
    assert sender.peers.peers.devices() == []
