"""``kinbox peers``: identity, invites, pairing and grant changes from the command line."""

from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path

import pytest

from kinbox.actors.cli import main
from kinbox.transport.grants import is_code

from .peer_harness import Receiver, cli

pytestmark = pytest.mark.timeout(120)


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
    code, _ = run("peers", "invite", "--db", url, "--ttl", "9d")
    assert code == 1


def test_pair_list_pause_resume_revoke(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path / "b").start()
    try:
        url = f"sqlite:///{tmp_path / 'a' / 'a.db'}"
        paired = cli("peers", "pair", receiver.http, receiver.invite(), "--name", "laptop",
                     "--db", url)
        assert paired["name"] == "laptop" and paired["direction"] == "outbound"
        [mine] = cli("peers", "list", "--db", url)
        assert (mine["device_id"], mine["status"], mine["queued"], mine["failed"]) == (
            paired["device_id"], "active", 0, 0)
        assert "token" not in json.dumps(mine)
        me = cli("peers", "whoami", "--db", url)["device_id"]
        assert [g["status"] for g in receiver.peers("pause", me)] == ["paused"]
        assert [g["status"] for g in receiver.peers("resume", me)] == ["active"]
        assert [g["status"] for g in receiver.peers("revoke", me)] == ["revoked"]
        assert run("peers", "resume", me, "--db", receiver.url)[0] == 1  # revoked stays revoked
        assert run("peers", "pause", "ffffffffffff", "--db", receiver.url)[0] == 1
        [theirs] = receiver.peers("list")
        assert (theirs["device_id"], theirs["status"]) == (me, "revoked")
    finally:
        receiver.stop()


def test_pairing_with_nobody_listening_is_a_clear_error(tmp_path: Path) -> None:
    code, _ = run("peers", "pair", "http://127.0.0.1:9", "kbp_" + "x" * 43,
                  "--db", f"sqlite:///{tmp_path / 'a.db'}")
    assert code == 1
