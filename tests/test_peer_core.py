"""The pure peer cores: device identity, grants, the handshake matrix and the sender link."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from kinbox.transport import frames as f
from kinbox.transport import handshake as hs
from kinbox.transport import key_file, receiver
from kinbox.transport.errors import FrameError, HandshakeRefused, IdentityError, LinkStateError
from kinbox.transport.grants import (
    GrantView,
    InviteView,
    Refusal,
    bearer_token,
    change_status,
    check_invite,
    new_token,
    parse_ttl,
    secret_hash,
)
from kinbox.transport.identity import DeviceIdentity, device_id_for, public_key_bytes
from kinbox.transport.invite_code import (
    invite_ref,
    is_code,
    is_old_code,
    new_code,
    parse_code,
)
from kinbox.transport.link import (
    BUSY_WAIT_LIMIT,
    Acked,
    LinkState,
    Outgoing,
    Postponed,
    Rejected,
    Released,
    Retry,
    SenderLink,
    Terminal,
    busy_wait,
)

SERVER = DeviceIdentity.generate()
CLIENT = DeviceIdentity.generate()
OTHER = DeviceIdentity.generate()
TOKEN = new_token(b"\x01" * 32)
NS, NC = hs.new_nonce(b"\x02" * 32), hs.new_nonce(b"\x03" * 32)


def grant(identity: DeviceIdentity = CLIENT, status: str = "active",
          token: str = TOKEN) -> GrantView:
    return GrantView(identity.device_id, identity.public_key, secret_hash(token),
                     frozenset({"agent"}), status)


# -- identity ------------------------------------------------------------------------------


def test_device_id_is_12_hex_of_the_public_key_hash() -> None:
    raw = public_key_bytes(CLIENT.public_key)
    assert CLIENT.device_id == device_id_for(raw)
    assert len(CLIENT.device_id) == 12 and int(CLIENT.device_id, 16) >= 0
    assert CLIENT.device_id != SERVER.device_id


def test_key_file_is_created_owner_only_and_loaded_again(tmp_path: Path) -> None:
    first = key_file.load_or_create(tmp_path / "d")
    mode = stat.S_IMODE(os.stat(tmp_path / "d" / key_file.KEY_FILE_NAME).st_mode)
    assert mode == 0o600
    assert key_file.load_or_create(tmp_path / "d").device_id == first.device_id


def test_a_partial_key_a_killed_process_of_the_same_pid_left_never_blocks_the_key(
        tmp_path: Path) -> None:
    """The partial file was named by process id and object address: a container's process
    restarts with the same pid (and, running the same code, often the same address), so
    the partial a kill left behind made every later start fail on O_EXCL."""
    identity = DeviceIdentity.generate()
    tmp_path.mkdir(exist_ok=True)
    stale = tmp_path / f".{key_file.KEY_FILE_NAME}.{os.getpid()}.{id(identity):x}"
    stale.write_bytes(b"-----BEGIN PRIV")  # cut off by the kill
    assert key_file.install(tmp_path, identity) is identity
    assert key_file.load_or_create(tmp_path).device_id == identity.device_id


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    key_file.load_or_create(tmp_path)
    os.chmod(tmp_path / key_file.KEY_FILE_NAME, 0o644)
    with pytest.raises(IdentityError):
        key_file.load_or_create(tmp_path)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720], ids=oct)
@pytest.mark.parametrize("has_key", [True, False], ids=["existing_key", "new_key"])
def test_a_key_folder_other_users_can_write_is_refused(
    tmp_path: Path, mode: int, has_key: bool
) -> None:
    """Whoever may write the folder may swap the key file for theirs, or delete it (a new
    key is then made in silence, and every pairing is lost): refused like ssh's StrictModes,
    before a key is read from it or written into it."""
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    if has_key:
        key_file.load_or_create(folder)
    before = sorted(p.name for p in folder.iterdir())
    folder.chmod(mode)
    with pytest.raises(IdentityError) as caught:
        key_file.load_or_create(folder)
    assert caught.value.what == str(folder)
    assert "chmod 700" in caught.value.reason
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written
    folder.chmod(0o700)
    key_file.load_or_create(folder)


@pytest.mark.timeout(30)
@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
@pytest.mark.parametrize("whose", ["key", "folder"])
def test_a_key_file_or_folder_of_another_user_is_refused(tmp_path: Path, whose: str) -> None:
    """Another user's key file (planted before this device made its own; root reads any
    0600 file) would make this device sign as them; their folder lets them swap it."""
    folder = tmp_path / "d"
    planted = key_file.load_or_create(folder)
    os.chown(folder / key_file.KEY_FILE_NAME if whose == "key" else folder, 65534, 65534)
    with pytest.raises(IdentityError) as caught:
        key_file.load_or_create(folder)
    assert "uid 65534" in caught.value.reason
    os.chown(folder / key_file.KEY_FILE_NAME if whose == "key" else folder, 0, 0)
    assert key_file.load_or_create(folder).device_id == planted.device_id


def test_sealed_tokens_open_only_with_the_same_device_key() -> None:
    sealed = CLIENT.seal(TOKEN, b"\x00" * 12)
    assert TOKEN not in sealed
    assert CLIENT.unseal(sealed) == TOKEN
    with pytest.raises(IdentityError):
        OTHER.unseal(sealed)


# -- grants --------------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "query", "refusal"), [
    (None, "", Refusal.NO_TOKEN),
    ("Basic abc", "", Refusal.MALFORMED),
    ("Bearer short", "", Refusal.MALFORMED),
    (f"Bearer {TOKEN}", f"token={TOKEN}", Refusal.TOKEN_IN_QUERY),
    (None, f"t={TOKEN}", Refusal.TOKEN_IN_QUERY),
    (f"Bearer {TOKEN}", "", None),
])
def test_bearer_token_comes_only_from_the_authorization_header(
        header: str | None, query: str, refusal: Refusal | None) -> None:
    token, why = bearer_token(header, query)
    assert why == refusal
    assert token == (TOKEN if refusal is None else None)


def test_status_changes_follow_the_table() -> None:
    assert change_status("active", "pause") == "paused"
    assert change_status("paused", "resume") == "active"
    assert change_status("paused", "revoke") == "revoked"
    with pytest.raises(ValueError):
        change_status("revoked", "resume")


def test_invites_expire_and_are_used_once_except_by_the_device_that_used_them() -> None:
    inv = InviteView("h", frozenset({"agent"}), expires_at=100.0, used=False)
    assert check_invite(inv, 99.0, "dev") is None
    assert check_invite(inv, 100.0, "dev") == Refusal.EXPIRED_INVITE
    used = InviteView("h", inv.scopes, 100.0, True, "dev")
    assert check_invite(used, 1.0, "other") == Refusal.EXPIRED_INVITE
    # its own retry (its answer was lost) goes on to the store, even past the expiry
    assert check_invite(used, 1.0, "dev") is None
    assert check_invite(used, 200.0, "dev") is None
    assert check_invite(InviteView("h", inv.scopes, 100.0, True), 1.0, "dev") == (
        Refusal.EXPIRED_INVITE)
    assert check_invite(None, 1.0, "dev") == Refusal.EXPIRED_INVITE
    assert parse_ttl("10m") == 600.0
    for bad in ("8d", "\u0661\u0660m", "1_0m", ""):  # Arabic-Indic digits read as ten
        with pytest.raises(ValueError):
            parse_ttl(bad)


# -- handshake matrix (pure) ---------------------------------------------------------------


def run_handshake(client: DeviceIdentity, token: str, g: GrantView | None,
                  pinned: str = SERVER.public_key,
                  server: DeviceIdentity = SERVER) -> Refusal | None:
    """None when the handshake opens; the refusal the client proved came from the server;
    HandshakeRefused when the client cannot tell who answered."""
    ch = hs.challenge(server, NS)
    hello = hs.hello(client, ch, token, NC, server.device_id)
    answer = hs.answer_hello(server, NS, hello, g, token)
    if isinstance(answer, f.Refused):
        return hs.check_refused(client, ch, hello, token, answer, pinned)
    hs.check_welcome(client, ch, hello, token, answer, pinned)
    return None


@pytest.mark.parametrize(("case", "refusal"), [
    ("unknown token", Refusal.UNKNOWN),
    ("revoked", Refusal.REVOKED),
    ("paused", Refusal.PAUSED),
    ("another device's token", HandshakeRefused(Refusal.WRONG_DEVICE)),
    ("token with the wrong key signature", HandshakeRefused(Refusal.BAD_SIGNATURE)),
    ("valid", None),
])
def test_handshake_matrix_accepts_only_the_valid_case(
        case: str, refusal: Refusal | HandshakeRefused | None) -> None:
    """The grant's refusals come signed; a failed proof is refused unsigned (the server
    raises, and answers with a plain error)."""
    args: dict[str, object] = {"client": CLIENT, "token": TOKEN, "g": grant()}
    if case == "unknown token":
        args["g"] = None
    elif case in ("revoked", "paused"):
        args["g"] = grant(status=case)
    elif case == "another device's token":
        args["client"] = OTHER  # OTHER presents CLIENT's token
    elif case == "token with the wrong key signature":
        args["g"] = GrantView(CLIENT.device_id, OTHER.public_key, secret_hash(TOKEN),
                              frozenset({"agent"}), "active")
    if isinstance(refusal, HandshakeRefused):
        with pytest.raises(HandshakeRefused) as info:
            run_handshake(**args)  # type: ignore[arg-type]
        assert info.value.reason == refusal.reason
        return
    assert run_handshake(**args) == refusal  # type: ignore[arg-type]


def test_a_relay_that_tampers_with_the_hello_gets_nothing_signed() -> None:
    """Whoever stands between the devices can pass the server's challenge through and
    spoil the client's hello: a signed ``bad_signature`` would have ended the pairing."""
    ch = hs.challenge(SERVER, NS)
    hello = hs.hello(CLIENT, ch, TOKEN, NC, SERVER.device_id)
    spoiled = f.Hello(hello.device_id, hello.nonce, "B" * 86)
    with pytest.raises(HandshakeRefused):
        hs.answer_hello(SERVER, NS, spoiled, grant(), TOKEN)
    with pytest.raises(ValueError):
        hs.refused(SERVER, NS, hello, TOKEN, Refusal.BAD_SIGNATURE)


@pytest.mark.parametrize("status", [None, "revoked", "active"])
def test_an_answer_not_signed_by_the_pinned_key_proves_nothing(status: str | None) -> None:
    """Welcome or refusal, from a server holding another key: the client cannot accept
    either, and (in the link) gives nothing up for it."""
    g = None if status is None else grant(status=status)
    with pytest.raises(HandshakeRefused) as info:
        run_handshake(CLIENT, TOKEN, g, pinned=OTHER.public_key)
    assert info.value.reason == Refusal.BAD_SIGNATURE


def test_a_signed_refusal_is_bound_to_its_handshake_and_its_reason() -> None:
    ch = hs.challenge(SERVER, NS)
    hello = hs.hello(CLIENT, ch, TOKEN, NC, SERVER.device_id)
    answer = hs.answer_hello(SERVER, NS, hello, grant(status="paused"), TOKEN)
    assert isinstance(answer, f.Refused) and answer.reason == "paused"
    assert hs.check_refused(CLIENT, ch, hello, TOKEN, answer, SERVER.public_key) is Refusal.PAUSED
    replays = {
        "another reason": (ch, hello, TOKEN, f.Refused("revoked", answer.signature)),
        "another handshake": (hs.challenge(SERVER, hs.new_nonce(b"\x09" * 32)), hello, TOKEN,
                              answer),
        "another token": (ch, hello, new_token(b"\x07" * 32), answer),
    }
    for name, (c, h, token, frame) in replays.items():
        with pytest.raises(HandshakeRefused):
            hs.check_refused(CLIENT, c, h, token, frame, SERVER.public_key)
            pytest.fail(name)


def test_client_refuses_a_challenge_from_another_device() -> None:
    with pytest.raises(HandshakeRefused) as info:
        hs.hello(CLIENT, hs.challenge(OTHER, NS), TOKEN, NC, SERVER.device_id)
    assert info.value.reason == Refusal.WRONG_DEVICE


CODE = new_code(SERVER.public_key, b"\x04" * 32)
"""A pairing code the SERVER device issued."""


def test_pairing_proves_both_keys_and_the_code_without_sending_it() -> None:
    code = parse_code(CODE)
    ch = hs.challenge(SERVER, NS)
    req = hs.pair(CLIENT, ch, code, NC, "laptop")
    assert CODE not in f.encode(req) and CODE.rsplit("_", 1)[1] not in f.encode(req)
    proof = hs.accept_pair(SERVER, NS, req)
    assert (proof.device_id, proof.public_key) == (CLIENT.device_id, CLIENT.public_key)
    assert proof.invite_hash == code.invite_hash == invite_ref(CODE)  # what the invite stores
    answer = hs.paired(SERVER, NS, proof, req, TOKEN)
    hs.check_paired(CLIENT, ch, code, req, answer)


def _forged(req: f.Pair, **changes: str) -> f.Pair:
    return dataclasses.replace(req, **changes)


OTHER_CODE = parse_code(new_code(SERVER.public_key, b"\x05" * 32))
_REQ = hs.pair(CLIENT, hs.challenge(SERVER, NS), parse_code(CODE), NC, "laptop")
_MINE = hs.pair(OTHER, hs.challenge(SERVER, NS), parse_code(CODE), NC, "laptop")

FORGED_REQUESTS = {
    # A relay that read the request puts its own key in, signed by itself: the code's
    # signature covered the client's key.
    "another key, re-signed by it": (_forged(_MINE, invite_signature=_REQ.invite_signature),
                                     Refusal.BAD_SIGNATURE),
    "another key, the client's signature": (
        _forged(_REQ, device_id=OTHER.device_id, public_key=OTHER.public_key),
        Refusal.BAD_SIGNATURE),
    "another name": (_forged(_REQ, name="evil"), Refusal.BAD_SIGNATURE),
    "another invite key, its own signature missing": (
        _forged(_REQ, invite_key=OTHER_CODE.invite_key), Refusal.BAD_SIGNATURE),
    "another nonce (a replay on another connection)": (_forged(_REQ, nonce=NS),
                                                        Refusal.BAD_SIGNATURE),
    "a device id not of the key": (_forged(_REQ, device_id=OTHER.device_id),
                                   Refusal.WRONG_DEVICE),
    "a malformed invite key": (_forged(_REQ, invite_key="A" * 40), Refusal.MALFORMED),
}


@pytest.mark.parametrize("name", FORGED_REQUESTS)
def test_a_pairing_request_changed_on_the_way_is_refused(name: str) -> None:
    frame, reason = FORGED_REQUESTS[name]
    with pytest.raises(HandshakeRefused) as info:
        hs.accept_pair(SERVER, NS, frame)
    assert info.value.reason == reason


def test_the_same_request_at_another_server_nonce_is_refused() -> None:
    """A relay replaying a request it read on a connection of its own to the device."""
    with pytest.raises(HandshakeRefused) as info:
        hs.accept_pair(SERVER, hs.new_nonce(b"\x09" * 32), _REQ)
    assert info.value.reason == Refusal.BAD_SIGNATURE


def test_a_code_for_another_device_is_refused_at_the_challenge_before_any_proof() -> None:
    """The code names SERVER; OTHER challenges: nothing is made to send."""
    with pytest.raises(HandshakeRefused) as info:
        hs.pair(CLIENT, hs.challenge(OTHER, NS), parse_code(CODE), NC, "laptop")
    assert info.value.reason == Refusal.WRONG_DEVICE
    assert SERVER.device_id in str(info.value) and OTHER.device_id in str(info.value)


def _answers() -> dict[str, tuple[f.Challenge, f.Paired, Refusal]]:
    ch = hs.challenge(SERVER, NS)
    proof = hs.accept_pair(SERVER, NS, _REQ)
    good = hs.paired(SERVER, NS, proof, _REQ, TOKEN)
    # OTHER answers in SERVER's place with its own key, over a challenge it relayed.
    theirs = hs.paired(OTHER, NS, proof, _REQ, TOKEN)
    other_ch = hs.challenge(OTHER, NS)
    return {
        "another device's key and signature": (ch, theirs, Refusal.WRONG_DEVICE),
        "another device throughout": (other_ch, theirs, Refusal.WRONG_DEVICE),
        "the server's key, another's signature": (
            ch, dataclasses.replace(good, signature=theirs.signature), Refusal.BAD_SIGNATURE),
        "another token than the server signed": (
            ch, dataclasses.replace(good, token=new_token(b"\x07" * 32)),
            Refusal.BAD_SIGNATURE),
        "a malformed key": (ch, dataclasses.replace(good, public_key="A" * 40),
                            Refusal.MALFORMED),
    }


@pytest.mark.parametrize("name", list(_answers()))
def test_a_paired_answer_not_signed_by_the_codes_device_is_refused(name: str) -> None:
    ch, frame, reason = _answers()[name]
    with pytest.raises(HandshakeRefused) as info:
        hs.check_paired(CLIENT, ch, parse_code(CODE), _REQ, frame)
    assert info.value.reason == reason


def test_a_code_names_its_device_by_a_fingerprint_that_begins_with_its_id() -> None:
    code = parse_code(CODE)
    assert code.device_id == SERVER.device_id and len(code.fingerprint) == 32
    assert code.names(SERVER.public_key) and not code.names(OTHER.public_key)
    assert not code.names("not a key")
    assert is_code(CODE) and not is_old_code(CODE)
    assert is_old_code("kbp_" + "z" * 43) and not is_code("kbp_" + "z" * 43)
    assert parse_code(CODE).invite_key != OTHER_CODE.invite_key  # the secret seeds the key
    assert CODE.rsplit("_", 1)[1] not in repr(code)
    with pytest.raises(ValueError):
        parse_code("kbp_" + "z" * 43)


def test_a_pairing_key_is_kept_in_its_one_canonical_spelling() -> None:
    """The key was stored as the device spelled it: with base64's padding it was another
    string for the same key, which the pairing retry (same key, same code) compares."""
    padded = dataclasses.replace(_REQ, public_key=CLIENT.public_key + "=")
    assert padded.public_key != CLIENT.public_key
    ch = hs.challenge(SERVER, NS)
    data = hs._transcript("pair", ch.device_id, CLIENT.device_id, NS, NC, hs._pairing(padded))
    signed = dataclasses.replace(padded, signature=CLIENT.sign(data),
                                 invite_signature=parse_code(CODE).sign(data))
    assert hs.accept_pair(SERVER, NS, signed).public_key == CLIENT.public_key


# -- the sender link -----------------------------------------------------------------------


def open_link(window: int = 2, link: SenderLink | None = None) -> SenderLink:
    """A link (new, or ``link`` again after it was lost) open with m0..m2 offered."""
    link = link or SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN, window)
    link.offer([Outgoing(f"m{i}", f"text {i}") for i in range(3)])
    assert link.frames_to_send() == []  # nothing goes out before the handshake
    link.connected(NC)
    link.receive(f.encode(hs.challenge(SERVER, NS)))
    hello = f.parse(link.frames_to_send()[0])
    assert isinstance(hello, f.Hello)
    link.receive(f.encode(hs.answer_hello(SERVER, NS, hello, grant(), TOKEN)))
    assert link.state is LinkState.OPEN
    link.hello = hello  # type: ignore[attr-defined]  (for a test that signs for it)
    return link


def test_window_bounds_unacknowledged_frames_and_acks_refill_it() -> None:
    link = open_link(window=2)
    sent = [f.parse(x) for x in link.frames_to_send()]
    assert [s.id for s in sent] == ["m0", "m1"]  # type: ignore[attr-defined]
    link.receive(f.encode(f.Ack("m0")))
    assert link.effects() == [Acked(("m0",))]
    assert [f.parse(x).id for x in link.frames_to_send()] == ["m2"]  # type: ignore[attr-defined]
    link.receive(f.encode(f.Ack("nope")))  # an ack for nothing we sent changes nothing
    assert link.effects() == [] and link.held() == ["m1", "m2"]


def test_a_draining_link_sends_nothing_more_and_waits_for_what_is_in_flight() -> None:
    link = open_link(window=2)
    assert len(link.frames_to_send()) == 2
    link.drain()
    assert link.capacity() == 0 and not link.drained()
    link.receive(f.encode(f.Ack("m0")))  # the window frees: m2 stays unsent
    assert link.effects() == [Acked(("m0",))] and link.frames_to_send() == []
    link.receive(f.encode(f.Ack("m1")))
    assert link.effects() == [Acked(("m1",))] and link.drained()
    assert link.held() == ["m2"]  # for the adapter to hand back


def test_a_dropped_link_hands_every_unacknowledged_row_back_for_retry() -> None:
    link = open_link(window=2)
    link.frames_to_send()
    link.receive(f.encode(f.Ack("m0")))
    link.connection_lost("reset")
    assert link.effects() == [Acked(("m0",)), Retry(("m1", "m2"), "reset")]
    assert link.state is LinkState.IDLE and link.held() == []


def test_a_stopped_link_releases_what_it_holds_and_a_lost_one_retries_it() -> None:
    """The adapter's own stop is no failure of the rows or the peer: sent or queued, they
    go back unrun (the socket it closed for the stop is not a lost link)."""
    for window, lost in ((2, False), (2, True), (3, False)):
        link = open_link(window=window)
        link.frames_to_send()
        link.receive(f.encode(f.Ack("m0")))
        if lost:
            link.connection_lost("reset")
        else:
            link.stopped()
        rest = ("m1", "m2")
        assert link.effects() == [Acked(("m0",)), Retry(rest, "reset") if lost
                                  else Released(rest)]
        assert link.state is LinkState.IDLE and link.held() == []
        assert link.frames_to_send() == []
    link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN)
    link.stopped()  # holding nothing: nothing to do
    assert link.effects() == [] and link.state is LinkState.IDLE


@pytest.mark.timeout(10)
def test_a_busy_answer_postpones_what_the_link_holds_uncounted_by_the_wait_asked() -> None:
    """``503 busy`` at the upgrade: the receiver is up, out of handshake slots. No attempt
    (no Retry), no unproven flag: the rows wait what it asked, bounded both ways."""
    link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN, 2)
    link.offer([Outgoing("m0", "a"), Outgoing("m1", "b")])
    link.busy(7.0)
    [effect] = link.effects()
    assert isinstance(effect, Postponed)
    assert (effect.ids, effect.wait) == (("m0", "m1"), 7.0)
    assert link.state is LinkState.IDLE and link.held() == [] and link.frames_to_send() == []
    assert busy_wait(0.0) == 1.0  # never at once: that would dial it in a loop
    assert busy_wait(10**9) == BUSY_WAIT_LIMIT  # whatever answers busy cannot hold rows a day
    assert busy_wait(None) > 1.0  # no usable Retry-After: a handshake's deadline


def test_rejected_payload_is_terminal_for_that_row_only() -> None:
    link = open_link(window=3)
    link.frames_to_send()
    link.receive(f.encode(f.Error("m1", "rejected", "bad session")))
    assert link.effects() == [Rejected("m1", "bad session")]
    assert link.held() == ["m0", "m2"]


def test_a_signed_refusal_on_the_live_link_closes_it_and_fails_everything_held() -> None:
    link = open_link(window=3)
    forged = hs.refused(OTHER, NS, link.hello, TOKEN, Refusal.REVOKED)  # type: ignore[attr-defined]
    link.receive(f.encode(forged))  # a relay's own "revoked": not the pinned key's
    [effect] = link.effects()
    assert isinstance(effect, Retry) and effect.unproven and link.state is LinkState.IDLE
    link = open_link(link=link)
    link.receive(f.encode(hs.refused(SERVER, NS, link.hello, TOKEN,  # type: ignore[attr-defined]
                                     Refusal.PAUSED)))
    [effect] = link.effects()
    assert effect == Terminal(("m0", "m1", "m2"), effect.reason, "paused")
    assert link.state is LinkState.CLOSED
    with pytest.raises(LinkStateError):
        link.offer([Outgoing("m9", "x")])


def test_a_refusal_at_the_upgrade_is_retried_whatever_it_says() -> None:
    """An HTTP answer can come from anyone at the peer's address: the pairing stands."""
    for reason in ("revoked", "unknown", "paused", "503", "token_in_query"):
        link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN)
        link.offer([Outgoing("m0", "x")])
        link.refused(reason)
        [effect] = link.effects()
        assert isinstance(effect, Retry) and effect.ids == ("m0",) and effect.unproven, reason
        assert link.state is LinkState.IDLE


def test_illegal_inputs_raise_and_leave_the_state_alone() -> None:
    link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN)
    with pytest.raises(LinkStateError):
        link.receive(f.encode(f.Ack("m0")))
    with pytest.raises(LinkStateError):
        link.request(f.Ping("p"))
    assert link.state is LinkState.IDLE


def handshaking_link() -> tuple[SenderLink, f.Challenge, f.Hello]:
    link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN)
    link.offer([Outgoing("m0", "x"), Outgoing("m1", "y")])
    link.connected(NC)
    ch = hs.challenge(SERVER, NS)
    link.receive(f.encode(ch))
    hello = f.parse(link.frames_to_send()[0])
    assert isinstance(hello, f.Hello)
    return link, ch, hello


def test_only_a_refusal_signed_by_the_pinned_key_ends_the_pairing() -> None:
    unsigned = {
        "a forged welcome": f.Welcome("A" * 86),
        "a forbidden error": f.Error(None, "forbidden", "revoked"),
        "a refusal signed by another key": hs.answer_hello(OTHER, NS, handshaking_link()[2],
                                                           None, TOKEN),
    }
    for name, frame in unsigned.items():
        link, _, _ = handshaking_link()
        link.receive(f.encode(frame))
        [effect] = link.effects()
        assert isinstance(effect, Retry) and effect.ids == ("m0", "m1"), name
        assert effect.unproven and link.state is LinkState.IDLE, name
    for grant_status, status in (("revoked", "revoked"), ("paused", "paused"),
                                 (None, "revoked")):
        link, _, hello = handshaking_link()
        g = None if grant_status is None else grant(status=grant_status)
        link.receive(f.encode(hs.answer_hello(SERVER, NS, hello, g, TOKEN)))
        [effect] = link.effects()
        assert effect == Terminal(("m0", "m1"), effect.reason, status), grant_status
        assert link.state is LinkState.CLOSED


def test_a_refusal_acknowledges_the_named_rows_it_says_the_peer_committed() -> None:
    """A link lost before its acks arrived, then refused: the rows the refusal says (signed)
    the peer committed are delivered, the rest fail; a ``committed`` frame dropped, changed
    or added on the way, or naming a row the upgrade did not, settles nothing for good."""
    def refused_after(committed: list[str] | None, sent: list[str] | None,
                      named: tuple[str, ...] = ("m0", "m1")) -> SenderLink:
        link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN)
        link.offer([Outgoing("m0", "x"), Outgoing("m1", "y")])
        assert link.in_flight() == ("m0", "m1")
        link.connected(NC, named)
        link.receive(f.encode(hs.challenge(SERVER, NS)))
        hello = f.parse(link.frames_to_send()[0])
        assert isinstance(hello, f.Hello)
        signed = None if committed is None else f.Committed(committed)
        if sent is not None:
            link.receive(f.encode(f.Committed(sent)))
        if link.state is LinkState.HANDSHAKE:  # else the committed frame already ended it
            link.receive(f.encode(hs.refused(SERVER, NS, hello, TOKEN, Refusal.REVOKED,
                                             signed)))
        return link

    acked, terminal = refused_after(["m1"], ["m1"]).effects()
    assert acked == Acked(("m1",)) and terminal == Terminal(("m0",), terminal.reason)
    [terminal] = refused_after([], []).effects()
    assert terminal == Terminal(("m0", "m1"), terminal.reason)
    for signed, sent in ((["m1"], None), (["m1"], []), ([], ["m1"]), (None, ["m1"])):
        [effect] = refused_after(signed, sent).effects()
        assert isinstance(effect, Retry) and effect.ids == ("m0", "m1"), (signed, sent)
        assert effect.unproven, (signed, sent)
    [effect] = refused_after(["m1"], ["m1"], named=("m0",)).effects()
    assert isinstance(effect, Retry) and effect.ids == ("m0", "m1")


def test_the_upgrade_names_the_held_rows_within_its_bounds() -> None:
    ids = [f"msg-{i:0>60}" for i in range(100)]
    named = f.in_flight_header(ids)
    assert named == tuple(ids[:len(named)]) and 0 < len(named) <= f.IN_FLIGHT_LIMIT
    assert len(" ".join(named)) <= f.IN_FLIGHT_BYTES
    assert f.parse_in_flight(" ".join(named)) == named
    assert f.parse_in_flight("") == ()
    for bad in ("m0 m0", "m0  m1", "m0,m1", " ".join(f"m{i}" for i in range(65)),
                "m" * 201, "m\u00e9"):
        with pytest.raises(FrameError):
            f.parse_in_flight(bad)


def test_a_challenge_from_another_device_is_retried_not_final() -> None:
    """A stale URL now pointing at another kinbox device: its rows wait for the real one."""
    link = SenderLink(CLIENT, SERVER.device_id, SERVER.public_key, TOKEN)
    link.offer([Outgoing("m0", "x")])
    link.connected(NC)
    link.receive(f.encode(hs.challenge(OTHER, NS)))
    assert link.frames_to_send() == []  # nothing signed for a stranger
    [effect] = link.effects()
    assert isinstance(effect, Retry) and effect.unproven and "wrong_device" in effect.reason


# -- the receiver core ---------------------------------------------------------------------


def test_receiver_maps_sessions_and_refuses_bad_names() -> None:
    core = receiver.ReceiverLink("0123456789ab", frozenset({"agent"}))
    [commit] = core.receive(f.encode(f.Deliver("m1", "hi", None)), 0.0)
    assert isinstance(commit, receiver.Commit)
    assert commit.session == "suzent:0123456789ab"
    assert commit.inbox_id == "peer-0123456789ab-m1"
    [named] = core.receive(f.encode(f.Deliver("m2", "hi", "side_1")), 0.0)
    assert isinstance(named, receiver.Commit) and named.session == "suzent:0123456789ab:side_1"
    [refused] = core.receive(f.encode(f.Deliver("m3", "hi", "../etc")), 0.0)
    assert isinstance(refused, receiver.Send)
    assert f.parse(refused.text) == f.Error("m3", "rejected",
                                            "session names are [A-Za-z0-9_-]{1,64}")


def test_receiver_rate_limit_closes_a_flooding_connection() -> None:
    core = receiver.ReceiverLink("0123456789ab", frozenset({"agent"}),
                                 receiver.RateLimit(rate=1.0, burst=3.0))
    ping = f.encode(f.Ping("p"))
    assert all(isinstance(a, receiver.Send) for t in range(3) for a in core.receive(ping, 0.0))
    actions = core.receive(ping, 0.0)
    assert isinstance(actions[-1], receiver.Close) and core.closed


def test_a_handshake_error_is_retried_and_flagged_only_when_it_is_a_refusal() -> None:
    for code, unproven in (("forbidden", True), ("unavailable", False)):
        link, _, _ = handshaking_link()
        link.receive(f.encode(f.Error(None, code, "malformed")))
        [effect] = link.effects()
        assert isinstance(effect, Retry) and effect.unproven is unproven, code


@pytest.mark.parametrize("text", [" ", "\n\t ", "\u3000\u2003"])
def test_receiver_rejects_a_message_with_nothing_but_whitespace(text: str) -> None:
    # agent_send and rt.post refuse such a message; a peer's is refused by the same rule,
    # named by its id so the sender fails that row instead of waiting for an ack.
    core = receiver.ReceiverLink("0123456789ab", frozenset({"agent"}))
    [refused] = core.receive(f.encode(f.Deliver("m1", text, None)), 0.0)
    assert isinstance(refused, receiver.Send)
    answer = f.parse(refused.text)
    assert isinstance(answer, f.Error) and (answer.id, answer.code) == ("m1", "rejected")
    [commit] = core.receive(f.encode(f.Deliver("m2", " hi ", None)), 0.0)
    assert isinstance(commit, receiver.Commit)


def test_receiver_closes_a_link_that_keeps_sending_frames_it_does_not_expect() -> None:
    # Well-formed frames of a type the receiver takes no action on (a handshake frame on
    # the open link) count as bad frames like malformed ones, and close it the same way.
    core = receiver.ReceiverLink("0123456789ab", frozenset({"agent"}))
    welcome = f.encode(f.Welcome("s" * 86))
    for _ in range(receiver.BAD_FRAME_LIMIT):
        [answer] = core.receive(welcome, 0.0)
        assert isinstance(answer, receiver.Send) and not core.closed
    actions = core.receive(welcome, 0.0)
    assert isinstance(actions[-1], receiver.Close) and core.closed
    assert core.receive(f.encode(f.Deliver("m1", "hi", None)), 0.0) == []


def test_a_new_device_key_is_synced_into_its_folder(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The key's bytes were synced, but not the folder entry that names it: a power cut
    # could lose the name after pairings sealed with the key were committed, and the next
    # start would make a new key that opens none of them.
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    folder = tmp_path / "d"
    key_file.load_or_create(folder)
    assert (folder / key_file.KEY_FILE_NAME).exists()
    assert str(folder) in synced


@pytest.mark.parametrize("text", ["", " ", "\n\t ", "\u3000\u2003", "\u200b", "x", " x ",
                                  "\x0b\x0c\x1c"])
def test_a_peer_message_is_blank_exactly_when_a_local_send_refuses_it(text: str) -> None:
    from kinbox.actors import ToolError
    from kinbox.actors.validation import SEND_LIMIT, require_message

    try:
        require_message(text, SEND_LIMIT)
        refused = False
    except ToolError:
        refused = True
    assert refused is f.is_blank(text)
    assert SEND_LIMIT == f.TEXT_LIMIT
