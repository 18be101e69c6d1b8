"""Operator commands that only read or change the journal create no files: no device key
(a credential) beside the database or in KINBOX_HOME, no folders. Each test failed on the
code before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kinbox.actors import ConfigError, Runtime
from kinbox.persistence import NewMessage

from .conftest import Stores
from .test_cli import kinbox

pytestmark = pytest.mark.timeout(180)

COMMANDS = [
    ("inbox", "list"),
    ("inbox", "show", "stuck"),
    ("inbox", "requeue", "stuck"),
    ("inbox", "requeue", "--all-failed"),
    ("inbox", "cancel", "waiting", "--reason", "operator test"),
    ("inbox", "prune", "--dry-run", "--older-than", "30d"),
    ("sessions", "list"),
    ("db", "status"),
    ("cron", "list"),
    ("cron", "runs"),
    ("peers", "list"),
    ("peers", "invites"),
]


def _files(*folders: Path) -> set[str]:
    """Every file and folder under ``folders``, but SQLite's own -wal and -shm beside the
    database (SQLite makes them for any reader of a WAL database; they hold no state of
    kinbox's)."""
    return {str(p) for f in folders for p in f.rglob("*") if not p.name.endswith(("-wal", "-shm"))}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_operator_command_creates_no_files_beside_the_database_or_in_kinbox_home(
    any_db_url: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """``kinbox inbox requeue`` and ``cancel`` started a runtime with a peer service, which
    made the device key ``kinbox-data/device_key.pem`` (beside a SQLite file, in
    KINBOX_HOME for PostgreSQL): a credential no one asked for, from a journal change."""
    s = Stores(any_db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    for mid in ("stuck", "waiting"):
        s.journal.enqueue(NewMessage(mid, "s1", f"body of {mid}"), 0)
    s.journal.claim("w", 0)
    s.journal.retry("w", "stuck", "boom", 0, permanent=True)
    s.close()
    home = tmp_path / "home"
    home.mkdir()
    before = _files(tmp_path)
    done = kinbox(*command, "--db", any_db_url, env={"KINBOX_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    assert _files(tmp_path) == before
    assert os.listdir(home) == []


def test_a_runtime_without_peers_makes_no_key_and_says_it_has_no_peer_service(
    db_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with (
        Runtime(db=db_url, peers=False, data_dir=data) as rt,
        pytest.raises(ConfigError) as refused,
    ):
        _ = rt.peers
    assert refused.value.field == "peers"
    assert not data.exists()
