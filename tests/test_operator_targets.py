"""The operator's commands act on the database and rows they name, or refuse: a URL as
libpq and SQLite paths read it, filters that are never ignored, a first start beside
another process. Each test failed on the code before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from kinbox.actors import Runtime
from kinbox.persistence import DuplicateError, NewMessage, SessionRecord, open_database
from kinbox.persistence.database import _pg_settings
from kinbox.persistence.peers import PeerStore

from .conftest import Stores
from .helpers import lock_waits, wait_for
from .scale_harness import require_faketime
from .test_cli import kinbox

pytestmark = pytest.mark.timeout(120)


def kinbox_in(cwd: Path, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    """The CLI run from ``cwd`` (a user's own directory), as a shell runs it."""
    return subprocess.run([sys.executable, "-m", "kinbox.actors", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})}, cwd=cwd)


def test_a_sqlite_url_under_the_home_folder_opens_that_file_and_no_other(
        tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    (work / "~").mkdir(parents=True)  # a folder literally named '~' where the user stands
    env = {"HOME": str(home)}
    made = kinbox_in(work, "db", "upgrade", "--db", "sqlite:///~/kinbox.db", env=env)
    assert made.returncode == 0, made.stderr
    assert (home / "kinbox.db").is_file()
    assert not (work / "~" / "kinbox.db").exists()
    status = kinbox_in(work, "db", "status", "--db", "sqlite:///~/kinbox.db", env=env)
    assert status.returncode == 0, status.stderr
    assert "schema: up to date" in status.stdout


def test_requeue_of_one_id_refuses_filters_it_would_ignore(db_url: str) -> None:
    s = Stores(db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("stuck", "s1", "body"), 0)
    s.journal.claim("w", 0)
    s.journal.retry("w", "stuck", "boom", 0, permanent=True)
    s.close()
    for flags in (("--target", "someone-else"), ("--kind", "subagent_result")):
        done = kinbox("inbox", "requeue", "stuck", *flags, "--db", db_url)
        assert done.returncode == 2, done.stdout  # a usage error
        assert "Traceback" not in done.stderr
        assert "--all-failed" in done.stderr
    shown = kinbox("inbox", "show", "stuck", "--db", db_url)
    assert "status: failed" in shown.stdout  # nothing was requeued


def test_cancel_from_the_cli_checks_who_and_why_as_the_api_does(db_url: str) -> None:
    """``rt.cancel`` refuses an empty or overlong ``by`` and reason; the CLI stored an
    empty ``--by`` and a reason of any length in the row's history."""
    s = Stores(db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("waiting", "s1", "body"), 0)
    s.close()
    for flags, field in ((("--reason", "stale", "--by", " "), "by"),
                         (("--reason", "x" * 2001), "reason")):
        done = kinbox("inbox", "cancel", "waiting", *flags, "--db", db_url)
        assert done.returncode == 2, done.stdout  # a usage error
        assert "Traceback" not in done.stderr and field in done.stderr
    assert "status: pending" in kinbox("inbox", "show", "waiting", "--db", db_url).stdout
    done = kinbox("inbox", "cancel", "waiting", "--reason", " stale ", "--by", "ops",
                  "--json", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "cancelled"


def _encoded(url: str) -> str:
    """``url`` with its user and database name percent-encoded, every character (as a
    URL must write an '@', ':' or '/' in them, and as libpq reads them)."""
    parts = urlsplit(url)
    every = "".join(f"%{b:02X}" for b in parts.path.lstrip("/").encode())
    user = parts.username or ""
    creds = "".join(f"%{b:02X}" for b in user.encode())
    if parts.password is not None:
        creds += ":" + quote(parts.password, safe="")
    host = parts.hostname or ""
    netloc = (f"{creds}@" if creds else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc, path=f"/{every}"))


def test_a_postgresql_url_with_percent_encoded_user_and_database_opens_them(
        pg_url: str) -> None:
    url = _encoded(pg_url)
    assert "%" in url
    made = kinbox("db", "upgrade", "--db", url)
    assert made.returncode == 0, made.stderr
    plain = kinbox("db", "status", "--db", pg_url)  # the same database, written plainly
    assert "schema: up to date" in plain.stdout, plain.stderr


def test_a_percent_encoded_password_reaches_the_driver_decoded() -> None:
    settings = _pg_settings("postgresql://u%40corp:p%40ss%3Aw%2Frd%25@db.example:5433/"
                            "kin%2Fbox?sslmode=disable")
    assert settings["user"] == "u@corp"
    assert settings["password"] == "p@ss:w/rd%"
    assert settings["database"] == "kin/box"
    assert settings["port"] == 5433
    assert settings["sslmode"] == "disable"


def test_a_runtime_starts_while_another_process_creates_the_system_projects(
        pg_url: str, tmp_path: Path) -> None:
    import psycopg2

    Stores(pg_url).close()  # the schema, and no project yet: a first start
    other = psycopg2.connect(pg_url)  # another process, its first start half done
    try:
        with other.cursor() as cur:
            cur.execute("INSERT INTO projects (id, slug, name, archived, hidden, created_at) "
                        "VALUES ('default', 'default', 'Default', false, false, 0)")
        waiting_before = lock_waits(pg_url)
        errors: list[BaseException] = []
        started = threading.Event()

        def start() -> None:
            try:
                rt = Runtime(db=pg_url, data_dir=tmp_path / "data").start()
                started.set()
                rt.stop()
            except BaseException as exc:  # reported below
                errors.append(exc)

        starter = threading.Thread(target=start)
        starter.start()
        wait_for(lambda: lock_waits(pg_url) > waiting_before, what="the start to wait on "
                 "the other process's project row")
        other.commit()
        starter.join(60)
    finally:
        other.close()
    assert not errors, errors
    assert started.is_set()
    db = open_database(pg_url)
    try:
        assert db.execute_sql("SELECT count(*) FROM projects WHERE slug = 'default'"
                              ).fetchone()[0] == 1
    finally:
        db.close()


def test_db_upgrade_makes_the_database_the_missing_database_error_asks_for(
        tmp_path: Path) -> None:
    env = {"KINBOX_HOME": str(tmp_path / "fresh"), "KINBOX_DB": ""}
    missing = kinbox_in(tmp_path, "inbox", "list", env=env)
    assert missing.returncode == 1
    assert "kinbox db upgrade" in missing.stderr
    made = kinbox_in(tmp_path, "db", "upgrade", env=env)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700  # as a runtime makes it
    listed = kinbox_in(tmp_path, "inbox", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "no rows" in listed.stdout


def _hold_uncommitted(pg_url: str, sql: str) -> tuple[Any, int]:
    """Another process's transaction, begun and not committed: it ran ``sql`` (its connection,
    and how many lock requests waited on the server before)."""
    import psycopg2

    other = psycopg2.connect(pg_url)
    with other.cursor() as cur:
        cur.execute(sql)
    return other, lock_waits(pg_url)


def _run_beside(pg_url: str, other: Any, waiting_before: int, work: Callable[[], object],
                what: str) -> list[object]:
    """Run ``work`` on a thread until it waits on ``other``'s uncommitted row, then commit
    ``other``; what ``work`` returned or raised."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # reported by the caller
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait_for(lambda: lock_waits(pg_url) > waiting_before, what=what)
        other.commit()
    finally:
        other.close()
        worker.join(60)
    assert not worker.is_alive()
    return outcome


SESSION_ROW = ("INSERT INTO sessions (id, project_id, title, kind, status, config, created_at, "
               "updated_at) VALUES ('{id}', {project}, '{title}', '{kind}', 'idle', '{{}}', 0, 0)")


def test_a_session_another_process_creates_at_once_is_a_duplicate(pg_url: str) -> None:
    s = Stores(pg_url)
    try:
        other, waiting = _hold_uncommitted(pg_url, SESSION_ROW.format(
            id="cron-digest", project="'default'", title="Cron: digest", kind="cron"))
        outcome = _run_beside(pg_url, other, waiting, lambda: s.store.create_session(
            "cron-digest", "default", "Cron: digest", "cron", 0),
            "the create to wait on the other process's session row")
    finally:
        s.close()
    assert len(outcome) == 1 and isinstance(outcome[0], DuplicateError), outcome
    assert (outcome[0].kind, outcome[0].field, outcome[0].value) == ("session", "id",
                                                                     "cron-digest")


def test_the_focal_chat_another_process_creates_at_once_is_the_one_returned(
        pg_url: str, tmp_path: Path) -> None:
    with Runtime(db=pg_url, data_dir=tmp_path / "data") as rt:
        rt.context.store.ensure_project("suzent-focal", "suzent-focal", "SUZENT", 0,
                                        hidden=True)
        other, waiting = _hold_uncommitted(pg_url, SESSION_ROW.format(
            id="focal-suzent", project="'suzent-focal'", title="SUZENT", kind="focal"))
        outcome = _run_beside(pg_url, other, waiting, rt.get_or_create_focal_chat,
                              "Focal's creation to wait on the other process's chat row")
    assert len(outcome) == 1 and isinstance(outcome[0], SessionRecord), outcome
    assert (outcome[0].id, outcome[0].title) == ("focal-suzent", "SUZENT")


def _server_time(pg_url: str) -> float:
    db = open_database(pg_url)
    try:
        return float(db.execute_sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"
                                    ).fetchone()[0])
    finally:
        db.close()


def test_requeue_and_cancel_on_postgresql_stamp_the_database_clock_not_a_fast_cli_clock(
        pg_url: str) -> None:
    s = Stores(pg_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    for mid in ("stuck", "waiting"):
        s.journal.enqueue(NewMessage(mid, "s1", f"body of {mid}"), 0)
    s.journal.claim("w", 0)
    s.journal.retry("w", "stuck", "boom", 0, permanent=True)
    s.close()
    # The operator's machine runs an hour ahead of the database server (and of the
    # runtimes, which tell the time by the server's clock).
    ahead = {"LD_PRELOAD": str(require_faketime()), "FAKETIME": "+1h",
             "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    before = _server_time(pg_url)
    requeued = kinbox("inbox", "requeue", "stuck", "--json", "--db", pg_url, env=ahead)
    assert requeued.returncode == 0, requeued.stderr
    cancelled = kinbox("inbox", "cancel", "waiting", "--reason", "stale", "--json",
                       "--db", pg_url, env=ahead)
    assert cancelled.returncode == 0, cancelled.stderr
    after = _server_time(pg_url)
    row = json.loads(requeued.stdout)
    # Due now, as a runtime's clock reads it: not an hour from now.
    assert before <= row["available_at"] <= after
    assert before <= row["updated_at"] <= after
    assert before <= json.loads(cancelled.stdout)["updated_at"] <= after


def test_peer_invites_on_postgresql_expire_by_the_database_clock_not_a_slow_cli_clock(
        pg_url: str, tmp_path: Path) -> None:
    """The runtimes check a pairing code's expiry by the server's clock; the CLI stamped
    it by its own. From a machine an hour behind, a 10-minute code was born expired: no
    device could pair with it, and ``peers invites`` listed it as open all the same."""
    behind = {"LD_PRELOAD": str(require_faketime()), "FAKETIME": "-1h",
              "FAKETIME_DONT_FAKE_MONOTONIC": "1", "KINBOX_HOME": str(tmp_path / "home")}
    before = _server_time(pg_url)
    made = kinbox("peers", "invite", "--ttl", "10m", "--json", "--db", pg_url, env=behind)
    assert made.returncode == 0, made.stderr
    after = _server_time(pg_url)
    assert before + 600 <= json.loads(made.stdout)["expires_at"] <= after + 600
    s = Stores(pg_url)
    try:  # open by the database's clock, as a runtime pairing with it reads it
        open_now = PeerStore(s.tables, s.writer).open_invites(_server_time(pg_url))
    finally:
        s.close()
    assert [i.expires_at for i in open_now] == [json.loads(made.stdout)["expires_at"]]
    listed = kinbox("peers", "invites", "--json", "--db", pg_url, env=behind)
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["items"]) == 1


def _spellings(pg_url: str) -> list[str]:
    """``pg_url`` (which gives the default port) and other ways of writing one database:
    the other scheme, no port, the user and database name percent-encoded."""
    parts = urlsplit(pg_url)
    assert parts.port == 5432 and "PGPORT" not in os.environ
    return [pg_url, urlunsplit(parts._replace(scheme="postgres")),
            urlunsplit(parts._replace(netloc=parts.netloc.removesuffix(":5432"))),
            _encoded(pg_url)]


def test_every_spelling_of_one_postgresql_database_is_one_device(pg_url: str,
                                                                 tmp_path: Path) -> None:
    home = {"KINBOX_HOME": str(tmp_path / "home")}
    ids = set()
    for url in _spellings(pg_url):
        shown = kinbox("peers", "whoami", "--json", "--db", url, env=home)
        assert shown.returncode == 0, shown.stderr
        ids.add(json.loads(shown.stdout)["device_id"])
    assert len(ids) == 1
    assert len(list((tmp_path / "home" / "databases").iterdir())) == 1


def test_a_device_folder_named_after_the_url_as_written_is_still_found(
        pg_url: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    plain, *others = _spellings(pg_url)
    made = kinbox("peers", "whoami", "--json", "--db", plain, env={"KINBOX_HOME": str(home)})
    assert made.returncode == 0, made.stderr
    device = json.loads(made.stdout)["device_id"]
    # As an older kinbox named it for the URL written without its port.
    (folder,) = (home / "databases").iterdir()
    parts = urlsplit(pg_url)
    folder.rename(folder.with_name(f"{parts.hostname}_{parts.path.lstrip('/')}"))
    for url in (plain, *others):
        shown = kinbox("peers", "whoami", "--json", "--db", url,
                       env={"KINBOX_HOME": str(home)})
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["device_id"] == device, url
    assert len(list((home / "databases").iterdir())) == 1


@pytest.fixture
def five_rows_db(db_url: str) -> str:
    """A database with five pending rows, m0 (the oldest) to m4, to one session."""
    s = Stores(db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    for i in range(5):
        s.journal.enqueue(NewMessage(f"m{i}", "s1", "body"), i)
    s.close()
    return db_url


def test_inbox_list_refuses_an_empty_target_instead_of_listing_every_row(
        five_rows_db: str) -> None:
    for command in (("inbox", "list"), ("inbox", "requeue", "--all-failed")):
        done = kinbox(*command, "--target", "", "--json", "--db", five_rows_db)
        assert done.returncode == 2, done.stdout
        assert "--target" in done.stderr and "Traceback" not in done.stderr
        assert not done.stdout


def test_inbox_list_limit_shows_the_newest_rows_in_journal_order(five_rows_db: str) -> None:
    done = kinbox("inbox", "list", "--limit", "2", "--json", "--db", five_rows_db)
    assert done.returncode == 0, done.stderr
    assert [r["message_id"] for r in json.loads(done.stdout)["items"]] == ["m3", "m4"]
    done = kinbox("inbox", "list", "--json", "--db", five_rows_db)
    listed = json.loads(done.stdout)["items"]
    assert [r["message_id"] for r in listed] == [f"m{i}" for i in range(5)]


def test_a_postgres_connection_gives_up_on_a_silent_server_unless_its_url_says_otherwise(
        ) -> None:
    """No connect timeout and no TCP keepalive: a connect to an unreachable server, and a
    connection whose server vanished without a word, waited for the kernel (minutes to
    hours), holding the life lock's or the listener's thread."""
    from kinbox.persistence.database import _pg_settings

    settings = _pg_settings("postgresql://u@db.example:5432/kin")
    assert (settings["connect_timeout"], settings["keepalives"],
            settings["keepalives_idle"]) == (10, 1, 30)
    mine = _pg_settings("postgresql://u@db.example/kin?connect_timeout=3&keepalives_idle=5")
    assert (mine["connect_timeout"], mine["keepalives_idle"]) == (3, 5)


@pytest.mark.timeout(60)
def test_kinbox_connects_to_postgres_with_its_connection_defaults(pg_url: str) -> None:
    from kinbox.persistence import open_database

    db = open_database(pg_url)
    try:
        db.connect(reuse_if_open=True)
        params = db.connection().get_dsn_parameters()
        assert (params["connect_timeout"], params["keepalives_idle"]) == ("10", "30")
        # Keepalives probe an idle connection only: a statement sent to a server that
        # vanished was retransmitted for about 15 minutes, the thread held all that time.
        assert params["tcp_user_timeout"] == "60000"
    finally:
        db.close()


def test_a_kinbox_home_written_with_a_tilde_is_under_the_home_folder_for_every_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``KINBOX_HOME=~/kb`` as an env file writes it (systemd's and docker's do not expand
    the '~'): the default SQLite file went under the home folder, but a PostgreSQL
    database's folder (its device key) under a folder literally named '~' in whatever
    folder the command ran from, so each folder made another device."""
    from kinbox.actors.data_dirs import data_dir_for
    from kinbox.persistence import default_url, sqlite_path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KINBOX_HOME", "~/kb")
    monkeypatch.delenv("KINBOX_DB", raising=False)
    assert sqlite_path(default_url()) == tmp_path / "kb" / "kinbox.db"
    folder = data_dir_for("postgresql://app@db.example:5432/app")
    assert folder.is_absolute() and folder.parent == tmp_path / "kb" / "databases"
