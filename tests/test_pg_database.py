"""PostgreSQL's database class (``persistence/pg_database``) on a real server.

A transaction's ``BEGIN``, its savepoints and its notifications travel with
its next statement, so a batch costs fewer round trips; what the server does
is unchanged: rows commit or roll back as before, an error surfaces on the
statement that caused it, a savepoint still undoes its part, a notification
still arrives at the commit and never after a rollback.
"""

from __future__ import annotations

import select
from collections.abc import Iterator
from typing import Any

import peewee as pw
import psycopg2
import pytest
from playhouse import db_url

from kinbox.persistence import DatabaseOpenError, open_database
from kinbox.persistence.pg_database import PostgresDatabase, defer
from kinbox.persistence.writer import Bulk, GroupCommitWriter

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


class Counting(PostgresDatabase):
    """Records every message it sends to the server (one entry per round trip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def _execute_cursor(self, sql: str, params: Any, **options: Any) -> Any:
        self.sent.append(sql)
        return super()._execute_cursor(sql, params, **options)


@pytest.fixture
def db(pg_url: str) -> Iterator[Counting]:
    database = Counting(**db_url.parse(pg_url))
    database.execute_sql("DROP TABLE IF EXISTS deferral_t")
    database.execute_sql("CREATE TABLE deferral_t (id integer PRIMARY KEY)")
    database.sent.clear()
    yield database
    database.execute_sql("DROP TABLE deferral_t")
    database.close()


def _ids(pg_url: str) -> list[int]:
    """The committed rows, read on a connection of its own."""
    conn = psycopg2.connect(pg_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM deferral_t ORDER BY id")
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def test_open_database_gives_the_deferring_class(pg_url: str) -> None:
    opened = open_database(pg_url)
    assert isinstance(opened, PostgresDatabase)
    with pytest.raises(DatabaseOpenError):
        open_database(pg_url.rsplit("/", 1)[0] + "/")


def test_begin_rides_with_the_first_statement_and_commits(db: Counting, pg_url: str) -> None:
    with db.atomic():
        db.execute_sql("INSERT INTO deferral_t VALUES (1)")
        assert _ids(pg_url) == []  # inside a transaction: not visible yet
    assert db.sent == ["BEGIN; INSERT INTO deferral_t VALUES (1)", "COMMIT"]
    assert _ids(pg_url) == [1]


def test_a_transaction_that_ran_nothing_sends_nothing(db: Counting) -> None:
    with db.atomic():
        db.defer("SAVEPOINT s")
    with pytest.raises(ZeroDivisionError), db.atomic():
        raise ZeroDivisionError
    assert db.sent == []
    assert db.waiting() == ()


def test_a_rollback_undoes_what_ran_and_drops_what_waits(db: Counting, pg_url: str) -> None:
    with pytest.raises(ZeroDivisionError), db.atomic():
        db.execute_sql("INSERT INTO deferral_t VALUES (1)")
        db.defer("SAVEPOINT s")
        raise ZeroDivisionError
    assert db.sent == ["BEGIN; INSERT INTO deferral_t VALUES (1)", "ROLLBACK"]
    assert _ids(pg_url) == []


def test_an_error_surfaces_on_its_statement_and_a_deferred_savepoint_undoes_it(
        db: Counting, pg_url: str) -> None:
    with db.atomic():
        db.execute_sql("INSERT INTO deferral_t VALUES (1)")
        db.defer("SAVEPOINT s")
        with pytest.raises(pw.IntegrityError):
            db.execute_sql("INSERT INTO deferral_t VALUES (1)")  # the savepoint in front
        db.execute_sql("ROLLBACK TO SAVEPOINT s")
        db.defer("RELEASE SAVEPOINT s")
        db.execute_sql("INSERT INTO deferral_t VALUES (2)")
    assert db.sent[1:] == ["SAVEPOINT s; INSERT INTO deferral_t VALUES (1)",
                           "ROLLBACK TO SAVEPOINT s",
                           "RELEASE SAVEPOINT s; INSERT INTO deferral_t VALUES (2)", "COMMIT"]
    assert _ids(pg_url) == [1, 2]


def _listener(pg_url: str) -> Any:
    conn = psycopg2.connect(pg_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("LISTEN kinbox_test_channel")
    return conn


def _heard(conn: Any, timeout: float) -> list[str]:
    if select.select([conn], [], [], timeout)[0]:
        conn.poll()
    heard = [n.channel for n in conn.notifies]
    conn.notifies.clear()
    return heard


def test_a_deferred_notification_arrives_with_the_commit_and_never_after_a_rollback(
        db: Counting, pg_url: str) -> None:
    listener = _listener(pg_url)
    try:
        with db.atomic():
            db.execute_sql("INSERT INTO deferral_t VALUES (1)")
            defer(db, "NOTIFY kinbox_test_channel")
            assert _heard(listener, 0.05) == []
        assert db.sent[-1] == "NOTIFY kinbox_test_channel; COMMIT"
        assert _heard(listener, 5.0) == ["kinbox_test_channel"]
        with pytest.raises(ZeroDivisionError), db.atomic():
            db.execute_sql("INSERT INTO deferral_t VALUES (2)")
            defer(db, "NOTIFY kinbox_test_channel")
            raise ZeroDivisionError
        # Bounded by the positive case above: a notification is heard within milliseconds.
        assert _heard(listener, 0.5) == []
    finally:
        listener.close()


def test_outside_a_transaction_a_deferred_statement_runs_at_once(db: Counting,
                                                                 pg_url: str) -> None:
    defer(db, "INSERT INTO deferral_t VALUES (3)")
    assert db.sent == ["INSERT INTO deferral_t VALUES (3)"]
    assert _ids(pg_url) == [3]


def _insert_all(db: pw.Database, ids: list[int]) -> list[int]:
    db.execute_sql("INSERT INTO deferral_t SELECT unnest(%s::integer[])", (ids,))
    return ids


def test_a_writer_batch_is_two_round_trips_and_a_failing_item_still_fails_alone(
        db: Counting, pg_url: str) -> None:
    kind: Bulk[int, int] = Bulk("insert", lambda i: _insert_all(db, [i])[0],
                                lambda items: _insert_all(db, items))
    writer = GroupCommitWriter(db, name="kinbox-test-writer")
    replies = [writer.submit_bulk(kind, i) for i in (1, 2, 3)]
    writer.start()
    try:
        assert [r.result(10) for r in replies] == [1, 2, 3]
        assert db.sent == ["BEGIN; SAVEPOINT kinbox_bulk; INSERT INTO deferral_t SELECT "
                           "unnest(%s::integer[])", "COMMIT"]
        # A repeated id: the set-wise run fails, is undone, and each item runs alone.
        replies = [writer.submit_bulk(kind, i) for i in (4, 1, 5)]
        assert replies[0].result(10) == 4 and replies[2].result(10) == 5
        with pytest.raises(pw.IntegrityError):
            replies[1].result(10)
    finally:
        writer.stop()
    assert _ids(pg_url) == [1, 2, 3, 4, 5]
