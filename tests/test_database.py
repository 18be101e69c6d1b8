"""Opening databases, connection pragmas, and schema upgrades through peewee migrations."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from kinbox.persistence import (
    SQLITE_PAGE_SIZE,
    DatabaseOpenError,
    GroupCommitWriter,
    Journal,
    NewMessage,
    bind_tables,
    open_database,
    pending_changes,
    require_current,
    upgrade,
)
from kinbox.persistence.errors import SchemaError, redact_text, redact_url


def test_every_sqlite_connection_gets_wal_full_sync_busy_timeout_and_foreign_keys(
        db_url: str) -> None:
    db = open_database(db_url)
    seen: list[tuple[object, ...]] = []

    def read() -> None:
        seen.append(tuple(db.execute_sql(f"PRAGMA {p}").fetchone()[0] for p in
                          ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")))
        db.close()

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    read()
    assert seen == [("wal", 2, 10_000, 1)] * 5  # synchronous 2 == FULL


def test_a_sqlite_connection_keeps_more_statements_prepared_than_the_driver_default(
        db_url: str) -> None:
    # The writer's set-wise statements have a text per batch size: 166 in a 10,000-message
    # run, past sqlite3's default cache of 128 (then some are prepared again every batch).
    db = open_database(db_url)
    assert db.connect_params["cached_statements"] >= 512
    db.execute_sql("SELECT 1")


def test_a_new_sqlite_file_gets_small_pages_and_an_old_one_keeps_its_own(
        tmp_path: Path) -> None:
    # Small pages shrink what each group commit writes to the WAL (SQLITE_PAGE_SIZE).
    fresh = open_database(f"sqlite:///{tmp_path / 'new.db'}")
    upgrade(bind_tables(fresh))
    assert fresh.execute_sql("PRAGMA page_size").fetchone()[0] == SQLITE_PAGE_SIZE == 1024
    fresh.close()
    # A file made with SQLite's default before: the pragma cannot change it (WAL), and
    # the journal runs on it as before.
    old_path = tmp_path / "old.db"
    conn = sqlite3.connect(old_path)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("PRAGMA journal_mode = wal")
    conn.execute("CREATE TABLE made_before (x)")
    conn.close()
    old = open_database(f"sqlite:///{old_path}")
    upgrade(bind_tables(old))
    assert old.execute_sql("PRAGMA page_size").fetchone()[0] == 4096
    assert old.execute_sql("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert old.execute_sql("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_synchronous_normal_is_available_for_benchmarks(db_url: str) -> None:
    db = open_database(db_url, synchronous="NORMAL")
    assert db.execute_sql("PRAGMA synchronous").fetchone()[0] == 1


@pytest.mark.parametrize(("url", "reason"), [
    ("mysql://root@localhost/x", "unsupported scheme"),
    ("nonsense", "unsupported scheme"),
    ("sqlite:///:memory:", "give a file path"),
    ("sqlite://", "give a file path"),
    ("sqlite:////no/such/dir/x.db", "does not exist"),
    ("sqlite:///{tmp}/app.db?timeout=30", "no query parameters"),
    ("sqlite:///{tmp}/app.db#main", "no query parameters"),
])
def test_urls_that_cannot_be_opened_give_a_precise_error(url: str, reason: str,
                                                        tmp_path: Path) -> None:
    with pytest.raises(DatabaseOpenError, match=reason):
        open_database(url.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []  # no file made under another name


@pytest.mark.parametrize("options", [{}, {"must_exist": True}, {"read_only": True}])
def test_a_directory_where_the_file_should_be_is_named_as_such(
        tmp_path: Path, options: dict[str, bool]) -> None:
    """SQLite said only 'unable to open database file', and a command that only reads
    said there was no database file there and to run `kinbox db upgrade`, which then
    failed the same way."""
    (tmp_path / "k.db").mkdir()
    with pytest.raises(DatabaseOpenError) as refused:
        open_database(f"sqlite:///{tmp_path / 'k.db'}", **options)
    assert type(refused.value) is DatabaseOpenError  # something is there: not "missing"
    assert "is a directory" in refused.value.reason
    assert [p.name for p in tmp_path.iterdir()] == ["k.db"]
    assert list((tmp_path / "k.db").iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("options", [{}, {"must_exist": True}, {"read_only": True}])
@pytest.mark.parametrize("where", ["device", "pipe"])
def test_a_device_or_a_pipe_where_the_file_should_be_is_named_as_such(
        tmp_path: Path, options: dict[str, bool], where: str) -> None:
    """``sqlite:////dev/null`` opened: SQLite read the device as an empty database, so the
    runtime's first write failed with a bare 'disk I/O error' naming no database, and left
    a ``null-journal`` file beside the device (in ``/dev``, run as root). A named pipe was
    'disk I/O error' too. Neither can hold a database, and nothing is made beside them."""
    if where == "device":
        path = Path("/dev/null")
    else:
        path = tmp_path / "k.db"
        os.mkfifo(path)
    with pytest.raises(DatabaseOpenError) as refused:
        open_database(f"sqlite:///{path}", **options)
    assert type(refused.value) is DatabaseOpenError  # something is there: not "missing"
    assert "not a regular file" in refused.value.reason
    assert [p.name for p in tmp_path.iterdir()] == ([] if where == "device" else ["k.db"])


def test_an_unreachable_postgres_is_a_database_open_error() -> None:
    with pytest.raises(DatabaseOpenError, match="cannot open database"):
        open_database("postgresql://nobody@127.0.0.1:1/none")


def test_passwords_are_redacted_from_errors() -> None:
    assert redact_url("postgresql://me:secret@h/db") == "postgresql://me:***@h/db"
    assert (redact_url("postgresql://me@h/db?sslmode=require&Password=secret&x=1")
            == "postgresql://me@h/db?sslmode=require&Password=***&x=1")
    assert redact_url("postgresql:///db?password=secret") == "postgresql:///db?password=***"
    assert redact_url("postgresql://me@h/db?passwordless=1") == "postgresql://me@h/db?passwordless=1"
    # libpq's passphrase of the client key, as a URL parameter and in a key=value string
    assert (redact_url("postgresql://me@h/db?sslmode=verify-full&sslpassword=hunter2")
            == "postgresql://me@h/db?sslmode=verify-full&sslpassword=***")
    assert redact_url("host=h sslpassword=hunter2 dbname=db") == "host=h sslpassword=*** dbname=db"
    with pytest.raises(DatabaseOpenError) as info:
        open_database("postgresql://me@127.0.0.1:1/db?password=secret")
    assert "secret" not in str(info.value)
    with pytest.raises(DatabaseOpenError) as info:
        open_database("postgresql://me:secret@127.0.0.1:1/db")
    assert "secret" not in str(info.value)
    with pytest.raises(DatabaseOpenError) as info:
        open_database("postgresql://me@127.0.0.1:1/db?sslpassword=secret")
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(("url", "masked"), [
    ("host=h user=u password = secret dbname=d", "host=h user=u password = *** dbname=d"),
    ("host=h password= secret dbname=d", "host=h password= *** dbname=d"),
    ("host=h password =secret", "host=h password =***"),
    ("host=h\tpassword\t=\t'se cret' dbname=d", "host=h\tpassword\t=\t*** dbname=d"),
    ("host=h password='se\\'c ret' dbname=d", "host=h password=*** dbname=d"),
    ("password=se\\ cret dbname=d", "password=*** dbname=d"),
    ("postgresql://u@h/db?password=se cret&x=1", "postgresql://u@h/db?password=***&x=1"),
    ("postgresql://u@h/db?x=1&password=se cret", "postgresql://u@h/db?x=1&password=***"),
    ("postgresql://u:p@h/db?passwordless=1", "postgresql://u:***@h/db?passwordless=1"),
])
def test_passwords_are_redacted_however_libpq_lets_them_be_written(url: str,
                                                                   masked: str) -> None:
    """libpq allows blanks around a key=value string's '=', and a URL's query value runs
    to the next '&' whatever it holds: both left the password, or its second word, out."""
    assert redact_url(url) == masked


@pytest.mark.parametrize(("url", "said"), [
    ("host=h password='it\\'s x' dbname=d", "bad password it's x for u"),
    ("host=h password = pw\\ two dbname=d", "bad password pw two for u"),
    ("postgresql://u@h/db?password=a%20b", "bad password a b for u"),
])
def test_a_driver_echoing_the_password_as_libpq_read_it_is_masked(url: str, said: str) -> None:
    """The password as libpq reads it (quotes and backslash escapes undone) was not among
    the spellings redact_text looked for."""
    assert redact_text(said, url) == "bad password *** for u"


@pytest.mark.parametrize("password", ["Zq9/rest", "Zq9?rest", "Zq9#rest"])
def test_a_password_that_cuts_the_host_part_short_is_not_quoted_in_the_error(
        password: str) -> None:
    """A '/', '?' or '#' in the password ends the URL's host part, so the password's first
    part read as the port, and the parser's complaint quoted it ('Port could not be cast
    to integer value as 'Zq9'') in the error and its cause."""
    import traceback

    with pytest.raises(DatabaseOpenError) as info:
        open_database(f"postgresql://me:{password}@127.0.0.1:5432/db")
    shown = "".join(traceback.format_exception(info.value))
    assert "Zq9" not in shown, shown
    assert "percent-encoded" in info.value.reason


def test_a_driver_error_that_quotes_the_password_leaves_it_out_of_the_cause() -> None:
    """The error's text was masked, but it was raised ``from`` the driver's error, whose
    own text (libpq quoting a value it could not use, here the password given again as
    the connect timeout) every traceback printed below "The above exception was the
    direct cause"."""
    with pytest.raises(DatabaseOpenError) as info:
        open_database("postgresql://me:Zq9secret@127.0.0.1:1/db?connect_timeout=Zq9secret")
    error = info.value
    shown = [error.__cause__] + ([] if error.__suppress_context__ else [error.__context__])
    assert all("Zq9secret" not in str(e) for e in shown if e is not None), shown
    assert "Zq9secret" not in info.value.reason
    assert "connect_timeout" in info.value.reason  # what was wrong is still said


def test_a_file_made_through_a_symlink_to_it_is_readable_by_its_user_only(
        tmp_path: Path) -> None:
    """A database path that is a symlink to a file not made yet (a data directory linked
    to a larger disk before the first start): the exclusive create refused the link, and
    SQLite made the file with the umask's mode, readable by every user of the machine."""
    import os
    import stat

    link = tmp_path / "kinbox.db"
    link.symlink_to(tmp_path / "elsewhere.db")
    old = os.umask(0o022)
    try:
        upgrade(bind_tables(open_database(f"sqlite:///{link}")))
    finally:
        os.umask(old)
    assert oct(stat.S_IMODE((tmp_path / "elsewhere.db").stat().st_mode)) == "0o600"


def test_bad_synchronous_values_are_refused(db_url: str) -> None:
    with pytest.raises(DatabaseOpenError, match="synchronous must be FULL or NORMAL"):
        open_database(db_url, synchronous="OFF")  # type: ignore[arg-type]


def test_upgrade_creates_the_schema_then_has_nothing_left_to_do(any_db_url: str) -> None:
    tables = bind_tables(open_database(any_db_url))
    with pytest.raises(SchemaError, match="kinbox db upgrade"):
        require_current(tables)
    applied = upgrade(tables)
    assert "create table agent_inbox_messages" in applied
    assert pending_changes(tables) == []
    assert upgrade(tables) == []
    require_current(tables)


@pytest.mark.timeout(60)
def test_upgrade_gives_an_older_sqlite_database_the_seq_mark_a_prune_keeps(
        tmp_path: Path) -> None:
    """The mark that keeps a pruned row's ``seq`` from coming back (``seq_mark``) is a
    table an older database lacks: ``db status`` names it, the upgrade makes it, and rows
    already there keep their numbers and are numbered past."""
    db = open_database(f"sqlite:///{tmp_path / 'old.db'}")
    tables = bind_tables(db)
    upgrade(tables)
    db.execute_sql("DROP TABLE agent_inbox_seq_mark")
    tables.inbox.insert(message_id="old", seq=7, transport="local", target_chat_id="s",
                        kind="agent_message", content="kept", status="pending",
                        max_attempts=5, available_at=0, created_at=0, updated_at=0).execute()
    assert pending_changes(tables) == ["create table agent_inbox_seq_mark"]
    assert upgrade(tables) == ["create table agent_inbox_seq_mark"]
    writer = GroupCommitWriter(db)
    writer.start()
    try:
        Journal(tables, writer).enqueue(NewMessage("new", "s", "hello"), 1.0)
    finally:
        writer.stop()
    assert {r.message_id: r.seq for r in tables.inbox.select()} == {"old": 7, "new": 8}


def test_upgrade_adds_a_column_an_older_schema_lacks(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path / 'old.db'}")
    tables = bind_tables(db)
    upgrade(tables)
    tables.inbox.insert(message_id="old", seq=1, transport="local", target_chat_id="s",
                        kind="agent_message", content="kept", status="pending",
                        max_attempts=5, available_at=0, created_at=0, updated_at=0).execute()
    db.execute_sql("ALTER TABLE agent_inbox_messages DROP COLUMN last_error")
    assert pending_changes(tables) == ["add column agent_inbox_messages.last_error"]
    assert upgrade(tables) == ["add column agent_inbox_messages.last_error"]
    row = tables.inbox.get(tables.inbox.message_id == "old")
    assert (row.content, row.last_error) == ("kept", None)


def test_upgrade_widens_a_text_column_an_older_postgres_schema_made_narrower(
        pg_url: str) -> None:
    """The cron expression columns were 128 characters wide, narrower than what the rules
    take: an older database gets them widened, its rows kept."""
    db = open_database(pg_url)
    tables = bind_tables(db)
    upgrade(tables)
    tables.cron_job.insert(id="cj_old", name="old", cron="0 9 * * *", prompt="p",
                           created_at=0, updated_at=0).execute()
    for table in ("cron_jobs", "scheduled_jobs"):
        db.execute_sql(f"ALTER TABLE {table} ALTER COLUMN cron TYPE VARCHAR(128)")
    widened = ["widen column scheduled_jobs.cron to 512 characters",
               "widen column cron_jobs.cron to 512 characters"]
    assert sorted(pending_changes(tables)) == sorted(widened)
    with pytest.raises(SchemaError, match="widen column"):
        require_current(tables)
    assert sorted(upgrade(tables)) == sorted(widened)
    assert pending_changes(tables) == []
    tables.cron_job.update(cron="0 " * 200 + "x").execute()  # 401 characters fit now
    assert len(tables.cron_job.get(tables.cron_job.id == "cj_old").cron) == 401


@pytest.mark.timeout(10)
def test_a_sqlite_too_old_for_the_journal_is_refused_with_the_version_it_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.34.1")
    with pytest.raises(DatabaseOpenError) as refused:
        open_database(f"sqlite:///{tmp_path / 'k.db'}")
    assert "3.34.1" in refused.value.reason and "3.35" in refused.value.reason
    assert not (tmp_path / "k.db").exists()


@pytest.mark.parametrize("ending", ["/", "/k.db/"])
def test_a_sqlite_url_ending_in_a_slash_is_refused_before_anything_is_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    """``sqlite:///data/`` named the file ``data`` (a path's trailing slash is dropped), so
    a runtime made the folder around it and a database file where the user meant a
    folder. Refused by the open and by a runtime's start, with nothing made."""
    from kinbox.actors import Runtime

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///store{ending}"
    with pytest.raises(DatabaseOpenError, match="ends in '/'"):
        open_database(url)
    with pytest.raises(DatabaseOpenError, match="ends in '/'"):
        Runtime(db=url, brain=lambda turn: None).start()
    assert list(tmp_path.iterdir()) == []
