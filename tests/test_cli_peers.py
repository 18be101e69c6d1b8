"""``kinbox peers``: identity, invites, pairing and grant changes from the command line."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors.cli import main
from kinbox.transport.identity import DeviceIdentity
from kinbox.transport.invite_code import is_code, new_code

from .peer_harness import Receiver, cli
from .test_cli import ROOT, kinbox

pytestmark = pytest.mark.timeout(120)

UNISSUED = new_code(DeviceIdentity.generate().public_key, b"x" * 32)
"""A well-formed pairing code no device issued (for a pairing refused before it dials)."""


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_whoami_creates_the_device_key_owner_only_and_keeps_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'k.db'}"
    first = cli("peers", "whoami", "--db", url)
    assert len(first["device_id"]) == 12
    key = tmp_path / "new" / "kinbox-data" / "device_key.pem"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert cli("peers", "whoami", "--db", url) == first


def test_invite_prints_a_code_and_stores_only_its_hash(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    invite = cli("peers", "invite", "--db", url, "--ttl", "2h")
    assert is_code(invite["code"]) and invite["scopes"] == ["agent"]
    assert invite["code"].encode() not in (tmp_path / "k.db").read_bytes()


@pytest.mark.parametrize(("ttl", "says"), [("9d", "1 s to 7 days"), ("10x", "like 10m or 2h")])
def test_a_bad_ttl_is_a_usage_error_before_anything_is_made(
        tmp_path: Path, ttl: str, says: str) -> None:
    """As a --limit out of range: status 2 with the subcommand's usage line, no database."""
    url = f"sqlite:///{tmp_path / 'new' / 'k.db'}"
    result = kinbox("peers", "invite", "--db", url, "--ttl", ttl)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: kinbox peers invite") and says in result.stderr
    assert not (tmp_path / "new").exists()


def test_pair_list_pause_resume_revoke(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path / "b").start()
    try:
        url = f"sqlite:///{tmp_path / 'a' / 'a.db'}"
        paired = cli("peers", "pair", receiver.http, receiver.invite(), "--name", "laptop",
                     "--db", url)
        assert paired["name"] == "laptop" and paired["direction"] == "outbound"
        [mine] = cli("peers", "list", "--db", url)["items"]
        assert (mine["device_id"], mine["status"], mine["queued"], mine["failed"]) == (
            paired["device_id"], "active", 0, 0)
        assert "token" not in json.dumps(mine)
        me = cli("peers", "whoami", "--db", url)["device_id"]
        assert [g["status"] for g in receiver.peers("pause", me)["grants"]] == ["paused"]
        assert [g["status"] for g in receiver.peers("resume", me)["grants"]] == ["active"]
        assert [g["status"] for g in receiver.peers("revoke", me)["grants"]] == ["revoked"]
        assert run("peers", "resume", me, "--db", receiver.url)[0] == 1  # revoked stays revoked
        assert run("peers", "pause", "ffffffffffff", "--db", receiver.url)[0] == 1
        [theirs] = receiver.peers("list")["items"]
        assert (theirs["device_id"], theirs["status"]) == (me, "revoked")
    finally:
        receiver.stop()


def test_an_open_pairing_code_is_listed_by_id_and_can_be_withdrawn(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A code lives up to a week; one that leaked is withdrawn by its invite id (or by the
    code itself) and can pair nothing after; a used or withdrawn code is not listed."""
    receiver = Receiver(tmp_path / "b").start()
    try:
        url = f"sqlite:///{tmp_path / 'a' / 'a.db'}"
        leaked = cli("peers", "invite", "--db", receiver.url, "--ttl", "7d")
        used = cli("peers", "invite", "--db", receiver.url)
        also = cli("peers", "invite", "--db", receiver.url)
        listed = cli("peers", "invites", "--db", receiver.url)["items"]
        assert [i["invite_id"] for i in listed] == [used["invite_id"], also["invite_id"],
                                                    leaked["invite_id"]]  # soonest first
        assert all(i["invite_id"] not in (used["code"], leaked["code"]) for i in listed)
        cli("peers", "pair", receiver.http, used["code"], "--db", url)
        gone = cli("peers", "withdraw", leaked["invite_id"], "--db", receiver.url)
        assert gone == {"invite_id": leaked["invite_id"], "withdrawn": True}
        assert cli("peers", "withdraw", also["code"], "--db", receiver.url)["withdrawn"]
        assert cli("peers", "invites", "--db", receiver.url)["items"] == []
        capsys.readouterr()
        assert run("peers", "pair", receiver.http, leaked["code"], "--db", url)[0] == 1
        assert "refused" in capsys.readouterr().err
        assert run("peers", "withdraw", leaked["invite_id"], "--db", receiver.url)[0] == 1
        assert f"no open pairing invite with id '{leaked['invite_id']}'" in (
            capsys.readouterr().err)
        assert run("peers", "withdraw", "not-an-invite", "--db", receiver.url)[0] == 1
        assert "12 hex characters" in capsys.readouterr().err
        assert run("peers", "invites", "--db", receiver.url)[1].strip() == (
            "no open pairing invites")
    finally:
        receiver.stop()


@pytest.mark.parametrize("given", [(), ("-",)], ids=["left_out", "dash"])
def test_pair_reads_the_code_from_standard_input_so_ps_never_shows_it(
    tmp_path: Path, given: tuple[str, ...]
) -> None:
    """A code in the command line is in /proc/<pid>/cmdline, which every user of the
    machine may read, for as long as ``pair`` runs (a second of imports before it dials):
    one of them could redeem it first. Left out (or ``-``), it is read from stdin."""
    receiver = Receiver(tmp_path / "b").start()
    try:
        code = receiver.invite()
        url = f"sqlite:///{tmp_path / 'a' / 'a.db'}"
        argv = ["peers", "pair", receiver.http, *given, "--db", url, "--json"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "kinbox.actors", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            shown = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            out, err = proc.communicate(code + "\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert code.encode() not in shown
        assert proc.returncode == 0, err
        paired = json.loads(out)
        [grant] = receiver.peers("list")["items"]
        assert paired["device_id"] == receiver.peers("whoami")["device_id"]
        assert (grant["direction"], grant["status"]) == ("inbound", "active")
        assert code not in out + err
    finally:
        receiver.stop()


def test_a_spent_code_is_refused_saying_what_may_have_spent_it_and_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A code typed again a minute after it paired another device was refused as
    "expired_invite", which its ten minutes said it was not. The device does not say
    whether a code was used, withdrawn, expired or never issued (no oracle for whoever
    tries codes), so the message names them all and the way out."""
    receiver = Receiver(tmp_path / "b").start()
    try:
        code = receiver.invite("10m")
        cli("peers", "pair", receiver.http, code, "--db", f"sqlite:///{tmp_path / 'a' / 'a.db'}")
        capsys.readouterr()
        other = f"sqlite:///{tmp_path / 'c' / 'c.db'}"
        assert run("peers", "pair", receiver.http, code, "--db", other)[0] == 1
        said = capsys.readouterr().err
        for words in ("refused", "used", "withdrawn", "expired", "kinbox peers invite"):
            assert words in said, said
        assert code not in said
        assert len(receiver.peers("list")["items"]) == 1  # the second device got nothing
    finally:
        receiver.stop()


def test_pairing_with_nobody_listening_is_a_clear_error(tmp_path: Path) -> None:
    code, _ = run("peers", "pair", "http://127.0.0.1:9", UNISSUED,
                  "--db", f"sqlite:///{tmp_path / 'a.db'}")
    assert code == 1


def test_pairing_with_nobody_listening_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first ``kinbox peers pair`` before the other device's ``kinbox serve`` was up (or
    at a wrong port) said only "peer unavailable (cannot connect: ConnectionRefusedError)":
    it now says what must answer there and that the same command may be run again, as the
    code is still good (``retry`` True)."""
    code, _ = run("peers", "pair", "http://127.0.0.1:9", UNISSUED,
                  "--db", f"sqlite:///{tmp_path / 'a.db'}")
    said = capsys.readouterr().err
    assert code == 1
    for words in ("ConnectionRefusedError", "kinbox serve", "same command"):
        assert words in said, said


@pytest.mark.parametrize("url", ["http://me:Sup3rSecret@127.0.0.1:99999",
                                 "ftp://me:Sup3rSecret@127.0.0.1:8765",
                                 "http://me:Sup3rSecret@[not-an-ip]:8765",
                                 "http://me:Sup3rSecret#1@127.0.0.1:99999",
                                 "http://me:Sup3rSecret?1@127.0.0.1:99999",
                                 "http://me:Sup3rSecret/1@127.0.0.1:99999"])
def test_a_peer_address_refused_as_malformed_is_not_quoted_with_its_password(
        tmp_path: Path, url: str) -> None:
    """An address with a user and password is refused (the pairing would store and list
    it), but one that was malformed besides (a port past 65535, a scheme that is not
    http(s) or ws(s)) was refused first, with an error quoting it whole."""
    result = kinbox("peers", "pair", url, UNISSUED,
                    "--db", f"sqlite:///{tmp_path / 'a.db'}")
    assert result.returncode == 1
    assert "peer URL" in result.stderr or "address" in result.stderr, result.stderr
    assert "Sup3rSecret" not in result.stderr + result.stdout, result.stderr


def _paired_inbound(url: str, device: str) -> tuple[Any, Any, Any]:
    """A database at ``url`` where ``device`` redeemed a pairing code (an inbound grant):
    its database, started writer and peer store."""
    import time

    from kinbox.persistence import GroupCommitWriter, bind_tables, open_database, upgrade
    from kinbox.persistence.peers import PeerStore

    db = open_database(url)
    tables = bind_tables(db)
    upgrade(tables)
    writer = GroupCommitWriter(db)
    writer.start()
    store = PeerStore(tables, writer)
    now = time.time()
    store.add_invite("a" * 64, frozenset({"agent"}), now, now + 600)
    assert store.redeem("a" * 64, now, device, "laptop", "K" * 43, "t" * 64)
    return db, writer, store


def _paired_both_ways_revoked_outbound(url: str, device: str) -> tuple[Any, Any, Any, float]:
    """:func:`_paired_inbound`, and ``device`` paired outbound too (its seal ``sealed``),
    that grant revoked here; and the time it was made."""
    import time

    from kinbox.persistence.peers import OUTBOUND

    db, writer, store = _paired_inbound(url, device)
    now = time.time()
    store.save_outbound(device, "laptop", "K" * 43, "http://127.0.0.1:1", "sealed",
                        frozenset({"agent"}), now)
    store.set_status(device, "revoked", now, direction=OUTBOUND)
    return db, writer, store, now


def test_pause_and_resume_act_on_each_direction_they_apply_to_or_the_one_named(
        tmp_path: Path) -> None:
    """A device paired both ways: its outbound record revoked (its URL refused us) made
    `pause` fail as a whole, leaving its inbound grant active; `resume` could only act on
    both directions at once."""
    from kinbox.persistence.peers import INBOUND, OUTBOUND

    url, device = f"sqlite:///{tmp_path / 'k.db'}", "0123456789ab"
    db, writer, store, now = _paired_both_ways_revoked_outbound(url, device)

    def statuses() -> dict[str, str]:
        return {r.direction: r.status for r in store.devices()}

    code, said = run("peers", "pause", device, "--db", url)
    assert code == 0 and "left as is" in said
    assert statuses() == {INBOUND: "paused", OUTBOUND: "revoked"}
    store.set_status(device, "paused", now, direction=OUTBOUND)  # the laptop paused us
    assert cli("peers", "resume", device, "--direction", "outbound", "--db", url)["grants"] == [
        {"device_id": device, "direction": OUTBOUND, "status": "active", "changed": True}]
    assert statuses() == {INBOUND: "paused", OUTBOUND: "active"}
    assert run("peers", "revoke", device, "--direction", "inbound", "--db", url)[0] == 0
    assert run("peers", "resume", device, "--direction", "inbound", "--db", url)[0] == 1
    writer.stop()
    db.close()


def test_a_direction_the_device_is_not_paired_in_is_named_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It said "no paired device", as for a device never paired."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    db, writer, _ = _paired_inbound(url, "0123456789ab")
    writer.stop()
    db.close()
    assert run("peers", "pause", "0123456789ab", "--direction", "outbound", "--db", url)[0] == 1
    assert "has no outbound grant: it is paired inbound only" in capsys.readouterr().err


def test_a_stored_name_with_escape_sequences_is_listed_escaped(tmp_path: Path) -> None:
    """Names paired before the pair frame refused them reach the operator's terminal."""
    import time

    from kinbox.persistence import GroupCommitWriter, bind_tables, open_database, upgrade
    from kinbox.persistence.peers import PeerStore

    url = f"sqlite:///{tmp_path / 'k.db'}"
    db = open_database(url)
    tables = bind_tables(db)
    upgrade(tables)
    writer = GroupCommitWriter(db)
    writer.start()
    now = time.time()
    store = PeerStore(tables, writer)
    store.add_invite("a" * 64, frozenset({"agent"}), now, now + 600)
    assert store.redeem("a" * 64, now, "0123456789ab", "evil\x1b[2J\nFAKE", "K" * 43, "t" * 64)
    writer.stop()
    db.close()
    out = io.StringIO()
    assert main(["peers", "list", "--db", url], out=out) == 0
    assert "\x1b" not in out.getvalue() and "evil\\x1b[2J\\nFAKE" in out.getvalue()
    assert len(out.getvalue().splitlines()) == 2  # the header and one device: no forged line


def test_a_stranger_at_the_pairing_address_cannot_write_escape_sequences_to_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever answers at the address refuses the pairing with a message of its own: it
    reaches the operator escaped (no clearing the screen, no fake 'paired' line)."""
    import random
    import threading

    from websockets.sync.server import ServerConnection, serve

    from kinbox.transport import frames as f
    from kinbox.transport import handshake as hs
    from kinbox.transport.identity import DeviceIdentity

    stranger = DeviceIdentity.generate()

    def handler(ws: ServerConnection) -> None:
        ws.send(f.encode(hs.challenge(stranger, hs.new_nonce(random.randbytes(32)))))
        ws.recv(5)
        ws.send(f.encode(f.Error(None, "forbidden", "\x1b]0;pwned\x07\x1b[2J\rkinbox: paired")))

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        # A code naming the stranger: it is the device the code is for, and answers.
        code = main(["peers", "pair", f"http://127.0.0.1:{port}",
                     new_code(stranger.public_key, b"A" * 32),
                     "--db", f"sqlite:///{tmp_path / 'phone.db'}"])
        server.shutdown()
    err = capsys.readouterr().err
    assert code == 1
    assert "pwned" in err and "\x1b" not in err and "\x07" not in err and "\r" not in err


def test_a_resume_that_meets_a_revoke_committed_after_its_read_leaves_the_grant_revoked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`peers resume` read the grant paused, then wrote `active` whatever it was by then: a
    revoke committed in between (another operator, another terminal) was undone, and the
    device the operator had just cut off could link again."""
    import time

    from kinbox.persistence.peers import INBOUND, PeerStore

    url = f"sqlite:///{tmp_path / 'k.db'}"
    device = "0123456789ab"
    db, writer, store = _paired_inbound(url, device)
    store.set_status(device, "paused", time.time())
    real_devices = PeerStore.devices

    def read_then_revoked(self: PeerStore, direction: str | None = None) -> Any:
        records = real_devices(self, direction)
        monkeypatch.setattr(PeerStore, "devices", real_devices)
        store.set_status(device, "revoked", time.time())  # committed right after the read
        return records
    monkeypatch.setattr(PeerStore, "devices", read_then_revoked)
    code, _ = run("peers", "resume", device, "--db", url)
    assert code == 1  # nothing to resume: a revoked grant stays revoked
    assert {r.direction: r.status for r in store.devices()} == {INBOUND: "revoked"}
    writer.stop()
    db.close()


def test_a_devices_refusal_never_turns_a_grant_revoked_here_into_a_paused_one(
        tmp_path: Path) -> None:
    """A device's signed "paused" heard on a link already under way when the operator
    revoked the grant here wrote `paused` over `revoked`, and a later `resume` then
    re-enabled a grant the operator had revoked."""
    from kinbox.persistence.peers import OUTBOUND

    url, device = f"sqlite:///{tmp_path / 'k.db'}", "0123456789ab"
    db, writer, store, now = _paired_both_ways_revoked_outbound(url, device)
    # Closed all the same: the link fails the rows, not "retry: an earlier pairing".
    assert store.close_outbound(device, "sealed", "paused", "the device paused this", now)
    assert [r.status for r in store.devices(OUTBOUND)] == ["revoked"]
    assert not store.close_outbound(device, "an older seal", "paused", "paused there", now)
    store.set_status(device, "active", now, direction=OUTBOUND)
    assert store.close_outbound(device, "sealed", "paused", "paused there", now)
    assert [r.status for r in store.devices(OUTBOUND)] == ["paused"]
    writer.stop()
    db.close()


@pytest.mark.timeout(120)
def test_a_devices_refusal_never_undoes_a_revoke_committed_under_it_on_postgres(
        pg_url: str) -> None:
    """On PostgreSQL another process commits between two statements of a transaction: a
    device's signed "paused" read the grant as not revoked, the operator's revoke (another
    terminal) committed, and the refusal then wrote `paused` over it; a later `resume`
    re-enabled a grant the operator had revoked. The refusal writes only where the grant
    is not revoked, decided by the write itself."""
    import threading
    import time

    import psycopg2

    from kinbox.persistence.peers import OUTBOUND

    from .helpers import wait_for

    device = "0123456789ab"
    db, writer, store = _paired_inbound(pg_url, device)
    now = time.time()
    store.save_outbound(device, "laptop", "K" * 43, "http://127.0.0.1:1", "sealed",
                        frozenset({"agent"}), now)
    operator, watcher = psycopg2.connect(pg_url), psycopg2.connect(pg_url)
    watcher.autocommit = True
    try:
        with operator.cursor() as cur:  # the revoke, its row locked until it commits
            cur.execute("UPDATE peer_devices SET status = 'revoked' WHERE id = %s",
                        (f"{OUTBOUND}:{device}",))
        closed: list[bool] = []
        refusal = threading.Thread(target=lambda: closed.append(store.close_outbound(
            device, "sealed", "paused", "the device paused this", now)))
        refusal.start()

        def refusal_waits_for_the_revoke() -> bool:
            with watcher.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'")
                return bool(cur.fetchone()[0])

        wait_for(refusal_waits_for_the_revoke, 30, "the refusal to wait for the revoke")
        operator.commit()
        refusal.join(30)
        assert closed == [True]  # closed all the same: the link fails the rows
        assert [r.status for r in store.devices(OUTBOUND)] == ["revoked"]
    finally:
        operator.close()
        watcher.close()
        writer.stop()
        db.close()


@pytest.mark.timeout(120)
def test_a_withdraw_never_reports_a_code_redeemed_under_it_as_withdrawn_on_postgres(
        pg_url: str) -> None:
    """A withdraw read the invite as open, a device's redemption (another process)
    committed, and the withdraw then deleted the spent invite and said its code pairs
    nothing any more: the operator withdrawing a code shown to the wrong person was told
    all was well while that device stayed paired. The delete takes only an open invite."""
    import threading
    import time

    import psycopg2

    from kinbox.persistence import GroupCommitWriter, bind_tables, open_database, upgrade
    from kinbox.persistence.peers import PeerStore

    from .helpers import wait_for

    db = open_database(pg_url)
    tables = bind_tables(db)
    upgrade(tables)
    writer = GroupCommitWriter(db)
    writer.start()
    store = PeerStore(tables, writer)
    now = time.time()
    store.add_invite("a" * 64, frozenset({"agent"}), now, now + 600)
    device, watcher = psycopg2.connect(pg_url), psycopg2.connect(pg_url)
    watcher.autocommit = True
    try:
        with device.cursor() as cur:  # a redemption, its row locked until it commits
            cur.execute("UPDATE peer_invites SET used_at = %s, used_by = %s "
                        "WHERE code_hash = %s", (now, "0123456789ab", "a" * 64))
        withdrawn: list[object] = []
        withdraw = threading.Thread(target=lambda: withdrawn.append(
            store.withdraw_invite("a" * 12, now)))
        withdraw.start()

        def withdraw_waits_for_the_redemption() -> bool:
            with watcher.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'")
                return bool(cur.fetchone()[0])

        wait_for(withdraw_waits_for_the_redemption, 30, "the withdraw to wait")
        device.commit()
        withdraw.join(30)
        assert withdrawn == [None]  # not withdrawn: it was spent first
        spent = store.invite("a" * 64)
        assert spent is not None and spent.used_by == "0123456789ab"
    finally:
        device.close()
        watcher.close()
        writer.stop()
        db.close()


def test_peers_json_is_an_object_as_every_other_commands(tmp_path: Path) -> None:
    """``peers list``, ``invites`` and ``pause``/``resume``/``revoke`` printed a bare JSON
    list, every other command an object (the listings ``{"items", "more", "next_offset"}``):
    a script walking listings by ``items`` failed on these, and a bare list can take no
    field beside its rows without breaking every script that read it."""
    url, device = f"sqlite:///{tmp_path / 'k.db'}", "0123456789ab"
    db, writer, _ = _paired_inbound(url, device)
    writer.stop()
    db.close()
    listed = cli("peers", "list", "--db", url)
    assert (listed["more"], listed["next_offset"]) == (False, None)
    assert [d["device_id"] for d in listed["items"]] == [device]
    made = cli("peers", "invite", "--db", url)
    assert cli("peers", "invites", "--db", url) == {
        "items": [{"invite_id": made["invite_id"], "scopes": ["agent"],
                   "expires_at": made["expires_at"]}], "more": False, "next_offset": None}
    assert cli("peers", "pause", device, "--db", url) == {
        "device_id": device,
        "grants": [{"device_id": device, "direction": "inbound", "status": "paused",
                    "changed": True}]}


@pytest.mark.parametrize("action", ["pause", "resume", "revoke", "withdraw"])
def test_a_grant_change_refuses_an_old_schema_and_leaves_its_upgrade_to_db_upgrade(
        tmp_path: Path, action: str) -> None:
    """``peers pause``, ``resume``, ``revoke`` and ``withdraw`` upgraded an old schema
    on the way, unasked, where every other command that changes an existing database
    (``inbox requeue``, ``cron add``) refuses it: an operator revoking a device during a
    deploy migrated the shared database under the runtimes of the old version, past the
    ``db status`` gate (exit 3) the deploy waits on. They refuse it now, changing nothing."""
    url, device = f"sqlite:///{tmp_path / 'k.db'}", "0123456789ab"
    db, writer, _ = _paired_inbound(url, device)
    writer.stop()
    db.execute_sql("DROP TABLE agent_inbox_seq_mark")
    db.close()
    target = "0" * 12 if action == "withdraw" else device
    done = kinbox("peers", action, target, "--db", url)
    assert done.returncode == 1 and "kinbox db upgrade" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert kinbox("db", "status", "--db", url).returncode == 3  # still pending
