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

    def _log_query(self, sql: str | bytes, params: Any) -> None:
        self.sent.append(sql.decode() if isinstance(sql, bytes) else sql)
        super()._log_query(sql, params)


def msg(*statements: str) -> str:
    """One message to the server: statements deferred in front of the last, one a line."""
    return "\n;".join(statements)


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


@pytest.mark.timeout(30)
def test_every_connection_uses_generic_plans_for_its_prepared_statements(db: Counting) -> None:
    assert db.execute_sql("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
    db.close()
    db.connect()  # a new server session gets it too
    assert db.execute_sql("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)


def test_begin_rides_with_the_first_statement_and_commits(db: Counting, pg_url: str) -> None:
    with db.atomic():
        db.execute_sql("INSERT INTO deferral_t VALUES (1)")
        assert _ids(pg_url) == []  # inside a transaction: not visible yet
    assert db.sent == [msg("BEGIN", "INSERT INTO deferral_t VALUES (1)"), "COMMIT"]
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
    assert db.sent == [msg("BEGIN", "INSERT INTO deferral_t VALUES (1)"), "ROLLBACK"]
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
    assert db.sent[1:] == [msg("SAVEPOINT s", "INSERT INTO deferral_t VALUES (1)"),
                           "ROLLBACK TO SAVEPOINT s",
                           msg("RELEASE SAVEPOINT s", "INSERT INTO deferral_t VALUES (2)"),
                           "COMMIT"]
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
        assert db.sent[-1] == msg("NOTIFY kinbox_test_channel", "COMMIT")
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
        assert db.sent == [msg("BEGIN", "SAVEPOINT kinbox_bulk_1", "INSERT INTO deferral_t "
                               "SELECT unnest(ARRAY[1,2,3]::integer[])"), "COMMIT"]
        # A repeated id: the set-wise run fails, is undone, and each item runs alone.
        replies = [writer.submit_bulk(kind, i) for i in (4, 1, 5)]
        assert replies[0].result(10) == 4 and replies[2].result(10) == 5
        with pytest.raises(pw.IntegrityError):
            replies[1].result(10)
    finally:
        writer.stop()
    assert _ids(pg_url) == [1, 2, 3, 4, 5]


REFUSED = ("INSERT INTO deferral_t VALUES (%s)", (object(),))
"""A statement the driver cannot format (it cannot adapt the value): nothing is sent."""

UNPARSABLE = "INSERT INTO deferral_t VALUE (1)"
"""A statement the server cannot parse: no statement of its message runs."""


def test_a_statement_the_driver_refuses_loses_nothing_deferred(db: Counting,
                                                               pg_url: str) -> None:
    with db.atomic():
        db.defer("SAVEPOINT s")
        with pytest.raises(pw.ProgrammingError):
            db.execute_sql(*REFUSED)
        assert db.waiting() == ("BEGIN", "SAVEPOINT s")
        db.execute_sql("INSERT INTO deferral_t VALUES (1)")
        assert _ids(pg_url) == []  # still inside the transaction
    assert _ids(pg_url) == [1]
    with pytest.raises(ZeroDivisionError), db.atomic():  # and a rollback still undoes all
        with pytest.raises(pw.ProgrammingError):
            db.execute_sql(*REFUSED)
        db.execute_sql("INSERT INTO deferral_t VALUES (2)")
        raise ZeroDivisionError
    assert _ids(pg_url) == [1]


def test_an_unparsable_first_statement_leaves_the_transaction_to_begin(db: Counting,
                                                                       pg_url: str) -> None:
    with db.atomic():
        with pytest.raises(pw.ProgrammingError):
            db.execute_sql(UNPARSABLE)
        assert db.waiting() == ("BEGIN",)
        db.execute_sql("INSERT INTO deferral_t VALUES (2)")
        assert _ids(pg_url) == []
    assert _ids(pg_url) == [2]


def test_a_deferred_statement_s_comment_ends_with_its_line(db: Counting, pg_url: str) -> None:
    with db.atomic():
        db.defer("SAVEPOINT s -- the writer's")
        db.execute_sql("INSERT INTO deferral_t VALUES (4)")
    assert _ids(pg_url) == [4]


def test_a_transaction_of_only_a_notification_still_sends_it(db: Counting,
                                                             pg_url: str) -> None:
    listener = _listener(pg_url)
    try:
        with db.atomic():
            defer(db, "NOTIFY kinbox_test_channel")
        assert db.sent == [msg("BEGIN", "NOTIFY kinbox_test_channel", "COMMIT")]
        assert _heard(listener, 5.0) == ["kinbox_test_channel"]
    finally:
        listener.close()


def _insert(db: pw.Database, value: int) -> int:
    return _insert_all(db, [value])[0]


def test_a_writer_op_the_driver_refuses_fails_alone(db: Counting, pg_url: str) -> None:
    writer = GroupCommitWriter(db, name="kinbox-test-writer")
    replies = [writer.submit(lambda: _insert(db, 1)), writer.submit(lambda: db.execute_sql(
        *REFUSED)), writer.submit(lambda: _insert(db, 3))]
    writer.start()
    try:
        assert replies[0].result(10) == 1 and replies[2].result(10) == 3
        with pytest.raises(pw.ProgrammingError):
            replies[1].result(10)
    finally:
        writer.stop()
    assert _ids(pg_url) == [1, 3]


def test_an_unparsable_writer_op_fails_its_whole_batch_and_no_other_op_is_lost(
        db: Counting, pg_url: str) -> None:
    # Its message ran nothing, its savepoint included: the rollback to that savepoint
    # fails, and so does the batch. Never: an earlier op told it committed while a
    # rollback to a reused savepoint name undid it.
    writer = GroupCommitWriter(db, name="kinbox-test-writer")
    replies = [writer.submit(lambda: _insert(db, 1)),
               writer.submit(lambda: db.execute_sql(UNPARSABLE)),
               writer.submit(lambda: _insert(db, 3))]
    writer.start()
    try:
        for reply in replies:
            with pytest.raises(pw.DatabaseError):
                reply.result(10)
        assert writer.submit(lambda: _insert(db, 5)).result(10) == 5  # it carries on
    finally:
        writer.stop()
    assert _ids(pg_url) == [5]


def test_a_connection_the_server_ends_before_the_commit_fails_the_batch_with_that_error(
        db: Counting, pg_url: str) -> None:
    """The server ended the writer's connection (a restart, ``pg_terminate_backend``) after
    the batch's statements and before its COMMIT: the COMMIT failed, the rollback after it
    found the connection closed, and every caller got 'cannot rollback: the connection is
    not open' (an InterfaceError) in place of the connection lost."""
    from .helpers import wait_for

    admin = psycopg2.connect(pg_url)
    admin.autocommit = True

    def gone(pid: int) -> bool:
        with admin.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            return bool(cur.fetchone()[0] == 0)

    def insert_then_lose_the_connection() -> None:
        _insert(db, 1)
        pid = db.connection().get_backend_pid()
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: gone(pid), timeout=10, what="the server to end the connection")

    writer = GroupCommitWriter(db, name="kinbox-test-writer")
    writer.start()
    try:
        with pytest.raises(pw.OperationalError) as lost:
            writer.call(insert_then_lose_the_connection, timeout=20)
        assert lost.value.kind == "OperationalError", lost.value  # type: ignore[attr-defined]
        assert writer.call(lambda: _insert(db, 2), timeout=20) == 2  # connected again
    finally:
        writer.stop()
        admin.close()
    assert _ids(pg_url) == [2]


def test_a_refused_row_s_values_stay_out_of_the_error_text_and_its_traceback(
        pg_url: str) -> None:
    """PostgreSQL's DETAIL quotes the refused row ("Failing row contains (...)"), a message
    body among its values; logged at ERROR (a failed commit, a refused turn), the body was
    in the log. The error says what failed; the DETAIL stays on ``.detail``."""
    import traceback

    from kinbox.persistence import DatabaseFailed

    database = open_database(pg_url)
    database.execute_sql("DROP TABLE IF EXISTS detail_t")
    database.execute_sql("CREATE TABLE detail_t (id integer PRIMARY KEY, body text,"
                         " n integer CHECK (n > 0))")
    try:
        with pytest.raises(DatabaseFailed) as caught:
            database.execute_sql("INSERT INTO detail_t VALUES (%s, %s, %s)",
                                 (1, "the secret body", -1))
        text = "".join(traceback.format_exception(caught.value))
        assert "the secret body" not in text
        assert "detail_t_n_check" in str(caught.value)  # what failed is still said
        assert caught.value.sqlstate == "23514" and caught.value.kind == "IntegrityError"
        assert "the secret body" in (caught.value.detail or "")
    finally:
        database.execute_sql("DROP TABLE detail_t")
        database.close()
