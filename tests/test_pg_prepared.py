"""Server-side prepared statements (``persistence/pg_prepared``) on a real PostgreSQL.

A statement is prepared once per connection and answers as its text does; one
that vanished from its server session (a pooler, a ``DISCARD``) is prepared
again; one that never stays prepared goes back to text with a warning; inside
a transaction block the text runs, unless the caller guards it with a
savepoint (``run_guarded``), where a failure raises and the next call finds
the statement right; a statement is prepared again as its executions double,
so its generic plan follows the tables as they grow; any other error is the
caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import peewee as pw
import pytest

from kinbox.persistence import open_database
from kinbox.persistence.pg_prepared import PreparedStatement

pytestmark = pytest.mark.postgres

SQL = "SELECT %(a)s::integer + %(b)s::integer, %(label)s::text"
PARAMS = [("a", "integer"), ("b", "integer"), ("label", "text")]


@pytest.fixture
def db(pg_url: str) -> Iterator[pw.Database]:
    database = open_database(pg_url)
    yield database
    database.close()


def _prepared(db: pw.Database) -> list[str]:
    return [r[0] for r in db.execute_sql("SELECT name FROM pg_prepared_statements")]


class Forgetful(PreparedStatement):
    """What a transaction-mode pooler does: the next statement finds no prepared one."""

    def _prepare(self) -> None:
        super()._prepare()
        self.db.execute_sql("DEALLOCATE ALL")


@pytest.mark.timeout(60)
def test_a_statement_is_prepared_once_per_connection_and_answers_as_its_text(
        db: pw.Database) -> None:
    stmt = PreparedStatement(db, "t_sum", SQL, PARAMS)
    assert stmt.run({"a": 2, "b": 3, "label": "x"}) == [(5, "x")]
    assert stmt.run({"a": 4, "b": -1, "label": "y"}) == [(3, "y")]
    assert _prepared(db) == [stmt.name] and not stmt.plain
    assert stmt.run({"a": 1, "b": 1, "label": "z"}) == list(
        db.execute_sql(SQL, {"a": 1, "b": 1, "label": "z"}).fetchall())
    db.close()  # a new connection: prepared again there
    assert _prepared(db) == []
    assert stmt.run({"a": 1, "b": 2, "label": "w"}) == [(3, "w")] and _prepared(db) == [stmt.name]


@pytest.mark.timeout(60)
def test_a_statement_gone_from_its_session_is_prepared_again(db: pw.Database) -> None:
    stmt = PreparedStatement(db, "t_sum", SQL, PARAMS)
    assert stmt.run({"a": 1, "b": 1, "label": "a"}) == [(2, "a")]
    db.execute_sql("DEALLOCATE ALL")  # behind its back
    assert stmt.run({"a": 2, "b": 2, "label": "b"}) == [(4, "b")]
    assert _prepared(db) == [stmt.name] and not stmt.plain


@pytest.mark.timeout(60)
def test_one_already_prepared_on_the_connection_is_used_and_no_other_text(
        db: pw.Database) -> None:
    first = PreparedStatement(db, "t_sum", SQL, PARAMS)
    db.execute_sql(first.prepare_sql)  # another instance prepared it on this connection
    # Another program (or version) on a pooled backend: the same name, another text.
    db.execute_sql("PREPARE t_sum (integer, integer, text) AS SELECT 0, 'not this'")
    second = PreparedStatement(db, "t_sum", SQL, PARAMS)
    assert second.run({"a": 5, "b": 5, "label": "c"}) == [(10, "c")] and not second.plain
    other = PreparedStatement(db, "t_sum", SQL.replace("+", "-"), PARAMS)
    assert other.name != second.name and other.run({"a": 5, "b": 5, "label": "d"}) == [(0, "d")]


@pytest.mark.timeout(60)
def test_a_statement_that_never_stays_prepared_goes_back_to_text_with_a_warning(
        db: pw.Database, caplog: pytest.LogCaptureFixture) -> None:
    stmt = Forgetful(db, "t_sum", SQL, PARAMS)
    with caplog.at_level(logging.WARNING, logger="kinbox.pg_prepared"):
        assert stmt.run({"a": 3, "b": 4, "label": "d"}) == [(7, "d")]
    assert stmt.plain and [r.levelname for r in caplog.records] == ["WARNING"]
    assert stmt.name in caplog.records[0].getMessage()
    caplog.clear()
    assert stmt.run({"a": 1, "b": 0, "label": "e"}) == [(1, "e")] and caplog.records == []


@pytest.mark.timeout(60)
def test_inside_a_transaction_block_the_text_runs(db: pw.Database) -> None:
    stmt = PreparedStatement(db, "t_sum", SQL, PARAMS)
    with db.atomic():
        assert stmt.run({"a": 1, "b": 2, "label": "f"}) == [(3, "f")]
        assert _prepared(db) == []
    assert stmt.run({"a": 1, "b": 2, "label": "g"}) == [(3, "g")] and _prepared(db) == [stmt.name]


def _prepare_time(db: pw.Database, stmt: PreparedStatement) -> object:
    rows = db.execute_sql("SELECT prepare_time FROM pg_prepared_statements WHERE name = %s",
                          (stmt.name,)).fetchall()
    return rows[0][0] if rows else None


@pytest.mark.timeout(60)
def test_guarded_inside_a_transaction_block_the_prepared_statement_runs(
        db: pw.Database) -> None:
    stmt = PreparedStatement(db, "t_sum", SQL, PARAMS)
    with db.atomic():
        assert stmt.run_guarded({"a": 1, "b": 2, "label": "f"}) == [(3, "f")]
        assert _prepared(db) == [stmt.name]
        assert stmt.run_guarded({"a": 2, "b": 2, "label": "g"}) == [(4, "g")]
    assert _prepared(db) == [stmt.name] and not stmt.plain


@pytest.mark.timeout(60)
def test_guarded_a_statement_gone_raises_and_the_next_call_prepares_it_again(
        db: pw.Database) -> None:
    stmt = PreparedStatement(db, "t_sum", SQL, PARAMS)
    assert stmt.run_guarded({"a": 1, "b": 1, "label": "a"}) == [(2, "a")]
    db.execute_sql("DEALLOCATE ALL")  # behind its back
    with db.atomic():
        with pytest.raises(pw.DatabaseError), db.atomic():  # the caller's savepoint
            stmt.run_guarded({"a": 2, "b": 2, "label": "b"})
        assert stmt.run_guarded({"a": 3, "b": 3, "label": "c"}) == [(6, "c")]
    assert _prepared(db) == [stmt.name] and not stmt.plain


@pytest.mark.timeout(60)
def test_guarded_a_name_this_text_already_took_raises_once_then_is_used(
        db: pw.Database) -> None:
    first = PreparedStatement(db, "t_sum", SQL, PARAMS)
    db.execute_sql(first.prepare_sql)  # another instance prepared it on this connection
    second = PreparedStatement(db, "t_sum", SQL, PARAMS)
    with db.atomic():
        with pytest.raises(pw.DatabaseError), db.atomic():
            second.run_guarded({"a": 1, "b": 2, "label": "d"})
        assert second.run_guarded({"a": 1, "b": 3, "label": "e"}) == [(4, "e")]
    assert not second.plain


@pytest.mark.timeout(60)
def test_guarded_a_statement_that_never_stays_prepared_goes_back_to_text(
        db: pw.Database, caplog: pytest.LogCaptureFixture) -> None:
    stmt = Forgetful(db, "t_sum", SQL, PARAMS)
    with caplog.at_level(logging.WARNING, logger="kinbox.pg_prepared"), db.atomic():
        for label in ("f", "g"):  # lost twice in a row: the text from now on
            with pytest.raises(pw.DatabaseError), db.atomic():
                stmt.run_guarded({"a": 1, "b": 1, "label": label})
        assert stmt.plain and stmt.run_guarded({"a": 2, "b": 5, "label": "h"}) == [(7, "h")]
    assert [r.levelname for r in caplog.records] == ["WARNING"]


class QuickReplan(PreparedStatement):
    REPLAN_FIRST, REPLAN_MOST = 2, 4


@pytest.mark.timeout(60)
def test_a_statement_is_prepared_again_as_its_executions_double_up_to_a_limit(
        db: pw.Database) -> None:
    stmt = QuickReplan(db, "t_sum", SQL, PARAMS)
    prepared_at: list[int] = []
    last = None
    for run in range(1, 19):
        assert stmt.run({"a": run, "b": 1, "label": "r"}) == [(run + 1, "r")]
        if _prepare_time(db, stmt) != last:
            prepared_at.append(run)
            last = _prepare_time(db, stmt)
    # Prepared at the first run, then after 2, 4 and (the most) every 4 executions.
    assert prepared_at == [1, 3, 7, 11, 15]
    assert _prepared(db) == [stmt.name]  # the old one deallocated each time
    with db.atomic():  # the same inside a caller's transaction block
        for run in range(4):
            assert stmt.run_guarded({"a": run, "b": 0, "label": "t"}) == [(run, "t")]
    assert _prepare_time(db, stmt) != last


@pytest.mark.timeout(60)
def test_any_other_error_is_the_callers(db: pw.Database) -> None:
    stmt = PreparedStatement(db, "t_sum", SQL, PARAMS)
    with pytest.raises(pw.DataError):
        stmt.run({"a": "not a number", "b": 1, "label": "h"})
    broken = PreparedStatement(db, "t_broken", "SELECT %(a)s::integer FROM no_such_table",
                               [("a", "integer")])
    with pytest.raises(pw.ProgrammingError):
        broken.run({"a": 1})
    assert not stmt.plain and not broken.plain


@pytest.mark.timeout(60)
def test_guarded_a_plan_a_schema_change_made_stale_is_prepared_again_next_time(
        db: pw.Database) -> None:
    db.execute_sql("CREATE TEMP TABLE t_stale (x integer)")
    db.execute_sql("INSERT INTO t_stale VALUES (1)")
    stmt = PreparedStatement(db, "t_stale", "SELECT * FROM t_stale WHERE x = %(x)s",
                             [("x", "integer")])
    with db.atomic():
        assert stmt.run_guarded({"x": 1}) == [(1,)]
        db.execute_sql("ALTER TABLE t_stale ADD COLUMN y integer")  # SELECT * changed
        with pytest.raises(pw.DatabaseError), db.atomic():
            stmt.run_guarded({"x": 1})
        assert stmt.run_guarded({"x": 1}) == [(1, None)]
