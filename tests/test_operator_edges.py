"""Operator commands at their edges: a filter given empty, a bulk change racing another
process, an upgrade another process made first. Each test failed on the code before its
fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from kinbox.persistence import NewMessage

from .conftest import Stores
from .helpers import AdvisoryWaiters, db_upgrade_process, wait_for
from .test_cli import ROOT, kinbox

pytestmark = pytest.mark.timeout(120)


def test_an_empty_project_filter_is_a_usage_error_not_every_project(db_url: str) -> None:
    """``sessions list --project "$UNSET"`` listed the sessions of every project, with
    status 0, as if the filter had matched them all (an empty ``--target`` or ``--kind``
    is refused the same way)."""
    s = Stores(db_url)
    s.store.create_project("p_books", "books", "Books", 0)
    s.store.create_session("mine", "p_books", "Mine", "interactive", 0)
    s.store.create_session("other", None, "Other", "interactive", 0)
    s.close()
    for empty in ("", " "):
        done = kinbox("sessions", "list", "--project", empty, "--json", "--db", db_url)
        assert done.returncode == 2, done.stdout
        assert "Traceback" not in done.stderr
        assert "argument --project: expected a project slug, got an empty one" in done.stderr
    done = kinbox("sessions", "list", "--project", "books", "--json", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert [s["id"] for s in json.loads(done.stdout)["items"]] == ["mine"]


def _failed_rows(url: str, ids: tuple[str, ...]) -> None:
    """One failed row each in ``ids``, each to a session of its own (claimed together)."""
    s = Stores(url)
    try:
        for mid in ids:
            s.store.create_session(f"to-{mid}", None, mid, "interactive", 0)
            s.journal.enqueue(NewMessage(mid, f"to-{mid}", f"body of {mid}"), 0)
        s.journal.claim("w", 0, limit=10)
        for mid in ids:
            s.journal.retry("w", mid, "boom", 0, permanent=True)
    finally:
        s.close()


def _statuses(url: str) -> dict[str, str]:
    s = Stores(url)
    try:
        return {r["message_id"]: r["status"] for r in s.journal.rows()}
    finally:
        s.close()


def _blocked_updates(conn: Any) -> int:
    """Statements of this database's other sessions waiting for a row lock now."""
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' "
                    "AND query ILIKE 'UPDATE%agent_inbox_messages%'")
        return int(cur.fetchone()[0])


@pytest.mark.timeout(120)
def test_requeue_all_failed_requeues_the_rest_when_another_process_ends_one_meanwhile(
        pg_url: str) -> None:
    """``inbox requeue --all-failed`` reads the failed rows, then requeues them one by one.
    On PostgreSQL another process may end one in between (an operator's ``inbox cancel``):
    the whole requeue failed on it ("cannot requeue a row in state 'cancelled'", status 1)
    and requeued none of the others. The one that is no longer failed is left as it is."""
    import psycopg2

    _failed_rows(pg_url, ("a", "b", "c"))
    other = psycopg2.connect(pg_url)  # another operator, cancelling "b"
    probe = psycopg2.connect(pg_url)
    probe.autocommit = True
    try:
        with other.cursor() as cur:
            cur.execute("SELECT 1 FROM agent_inbox_messages WHERE message_id = 'b' FOR UPDATE")
        requeue = subprocess.Popen(
            [sys.executable, "-m", "kinbox.actors", "inbox", "requeue", "--all-failed",
             "--json", "--db", pg_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd=ROOT)
        try:
            wait_for(lambda: _blocked_updates(probe) == 1 or requeue.poll() is not None,
                     timeout=60, what="the requeue to wait for the row being cancelled")
            with other.cursor() as cur:
                cur.execute("UPDATE agent_inbox_messages SET status = 'cancelled' "
                            "WHERE message_id = 'b'")
            other.commit()
            out, err = requeue.communicate(timeout=60)
        finally:
            if requeue.poll() is None:
                requeue.kill()
                requeue.wait()
    finally:
        other.close()
        probe.close()
    assert requeue.returncode == 0, err
    assert json.loads(out) == {"requeued": ["a", "c"], "interrupted": False}
    assert _statuses(pg_url) == {"a": "pending", "b": "cancelled", "c": "pending"}


@pytest.mark.timeout(120)
def test_db_upgrade_reports_only_what_it_applied_when_another_process_upgraded_first(
        pg_url: str) -> None:
    """Two upgrades at once (``kinbox db upgrade`` beside a worker starting on an older
    schema): the second waits for the first's schema lock, then has nothing left to do.
    It printed the changes it had seen before the wait as "applied", changes it never
    made."""
    import psycopg2

    from kinbox.persistence import bind_tables, open_database, upgrade
    from kinbox.persistence.schema import SCHEMA_LOCK_SQL

    db = open_database(pg_url)
    upgrade(bind_tables(db))
    db.execute_sql("ALTER TABLE agent_inbox_messages DROP COLUMN last_error")
    db.close()
    first = psycopg2.connect(pg_url)  # the other process's upgrade, under the schema lock
    waiting = AdvisoryWaiters(pg_url)
    try:
        with first.cursor() as cur:
            cur.execute(SCHEMA_LOCK_SQL)
        second = db_upgrade_process(pg_url)
        try:
            wait_for(lambda: waiting() == 1 or second.poll() is not None,
                     timeout=60, what="the second upgrade to wait for the first")
            with first.cursor() as cur:
                cur.execute("ALTER TABLE agent_inbox_messages ADD COLUMN last_error TEXT")
            first.commit()
            out, err = second.communicate(timeout=60)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()
    finally:
        first.close()
        waiting.close()
    assert second.returncode == 0, err
    assert json.loads(out) == {"applied": []}


def _rows_in(db_url: str, rows: int, status: str, id_format: str) -> str:
    """A SQLite database holding ``rows`` inbox rows in ``status`` (ids from
    ``id_format``, over 10 sessions), written at once; its file's path."""
    s = Stores(db_url)
    s.tables.inbox.insert_many([
        {"message_id": id_format.format(i=i), "seq": i + 1, "transport": "local",
         "target_chat_id": f"s{i % 10}", "kind": "agent_message", "content": "x",
         "status": status, "max_attempts": 5, "available_at": 0, "created_at": 0,
         "updated_at": 0} for i in range(rows)]).execute()
    s.close()
    return db_url.removeprefix("sqlite:///")


@pytest.mark.timeout(180)
def test_an_interrupted_prune_stops_between_batches_and_says_what_it_deleted(
        db_url: str) -> None:
    """Ctrl-C in a long ``inbox prune`` printed a traceback (status -2, a death by the
    signal) and never said how many rows had gone in the batches it had committed. It
    stops after the batch under way now, says what went, and exits 130."""
    import signal
    import sqlite3

    rows = 5000
    path = _rows_in(db_url, rows, "delivered", "old-{i}")

    def left() -> int:
        with sqlite3.connect(path) as con:
            return int(con.execute("SELECT count(*) FROM agent_inbox_messages").fetchone()[0])

    prune = subprocess.Popen(
        [sys.executable, "-m", "kinbox.actors", "inbox", "prune", "--older-than", "30d",
         "--batch", "1", "--json", "--db", db_url], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_for(lambda: left() < rows or prune.poll() is not None, timeout=60,
                 what="the prune's first batches")
        prune.send_signal(signal.SIGINT)
        out, err = prune.communicate(timeout=60)
    finally:
        if prune.poll() is None:
            prune.kill()
            prune.wait()
    assert prune.returncode == 130, err
    assert "Traceback" not in err and "stopping after the batch under way" in err
    said = json.loads(out)
    assert said["interrupted"] is True
    assert 0 < said["rows"] == rows - left() < rows


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sequence", ["missing", "behind"])
def test_db_status_and_upgrade_see_an_inbox_sequence_that_would_fail_every_send(
        pg_url: str, sequence: str) -> None:
    """On PostgreSQL the inbox's ``seq`` comes from the sequence ``agent_inbox_seq``, which
    no table owns: a copy of the tables alone (``pg_dump -t``) has none, and rows copied
    into a new database (``--data-only``) are ahead of its new sequence. ``db status``
    said "up to date" and ``db upgrade`` "already up to date" while every send failed (no
    such relation, or a duplicate ``seq``); the upgrade now makes the sequence, or moves
    it, past the rows."""
    from kinbox.persistence import open_database

    s = Stores(pg_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    for i in range(3):
        s.journal.enqueue(NewMessage(f"old-{i}", "s1", "kept"), 0)
    s.close()
    db = open_database(pg_url)
    if sequence == "missing":
        db.execute_sql("DROP SEQUENCE agent_inbox_seq")
    else:
        db.execute_sql("SELECT setval('agent_inbox_seq', 1, false)")
    db.close()
    status = json.loads(kinbox("db", "status", "--json", "--db", pg_url).stdout)
    assert status["up_to_date"] is False, status
    up = kinbox("db", "upgrade", "--json", "--db", pg_url)
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["applied"] == status["pending"]
    assert json.loads(kinbox("db", "status", "--json", "--db", pg_url).stdout)["up_to_date"]
    s = Stores(pg_url)
    try:
        s.journal.enqueue(NewMessage("new", "s1", "sent after the copy"), 0)
        seqs = {r["message_id"]: r["seq"] for r in s.journal.rows()}
    finally:
        s.close()
    assert seqs["new"] > max(seqs[f"old-{i}"] for i in range(3))


def test_an_offset_beside_a_cursor_is_a_usage_error_even_when_it_is_zero(db_url: str) -> None:
    """``--after`` with ``--offset`` is a usage error, but ``--offset 0`` (a script passing
    both, the offset from a first page) was taken and ignored: argparse saw the default."""
    s = Stores(db_url)
    s.store.create_many([(f"s{i}", None, f"t{i}", "cron") for i in range(3)], 0)
    s.close()
    first = kinbox("sessions", "list", "--limit", "1", "--json", "--db", db_url)
    cursor = json.loads(first.stdout)["next_after"]
    assert cursor
    done = kinbox("sessions", "list", "--after", cursor, "--offset", "0", "--db", db_url)
    assert done.returncode == 2, done.stdout
    assert "argument --offset: not allowed with argument --after" in done.stderr
    alone = kinbox("sessions", "list", "--limit", "1", "--json", "--db", db_url)
    assert json.loads(alone.stdout)["next_offset"] == 1


def _many_failed(s: Stores, n: int) -> list[str]:
    ids = [f"rq-{i:05d}" for i in range(n)]
    s.writer.call(lambda: [s.journal.enqueue_now(NewMessage(mid, f"t{i % 7}", "x"), 1.0)
                           for i, mid in enumerate(ids)])
    s.db.execute_sql("UPDATE agent_inbox_messages SET status = 'failed'")
    return ids


def _states(s: Stores) -> dict[str, int]:
    rows = s.db.execute_sql("SELECT status, COUNT(*) FROM agent_inbox_messages GROUP BY status")
    return dict(rows.fetchall())


def test_a_requeue_of_many_failed_rows_commits_batch_by_batch(stores: Stores,
                                                               any_db_url: str) -> None:
    """Each batch is durable and the write lock free before the next begins: one
    transaction for every row held the delivering runtime's writes (on SQLite the whole
    file) for as long as the requeue took, 14 s for 20,000 rows."""
    from kinbox.persistence.inbox_operator import REQUEUE_BATCH
    ids = _many_failed(stores, 2 * REQUEUE_BATCH + 10)
    batches: list[list[str]] = []
    seen_pending: list[int] = []

    for batch in stores.journal.requeue_steps(2.0):
        batches.append(batch)
        seen_pending.append(_states(stores).get("pending", 0))
        if any_db_url.startswith("sqlite"):  # another process may write now
            import sqlite3
            other = sqlite3.connect(any_db_url.removeprefix("sqlite:///"), timeout=0,
                                    isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            other.close()

    assert [len(b) for b in batches] == [REQUEUE_BATCH, REQUEUE_BATCH, 10]
    assert [b for batch in batches for b in batch] == ids
    assert seen_pending == [REQUEUE_BATCH, 2 * REQUEUE_BATCH, len(ids)]
    assert _states(stores) == {"pending": len(ids)}


def test_a_requeue_that_fails_part_way_keeps_the_batches_before_and_runs_again(
        stores: Stores) -> None:
    from kinbox.persistence.inbox_operator import REQUEUE_BATCH
    ids = _many_failed(stores, REQUEUE_BATCH + 5)
    calls: list[int] = []

    def also(batch: list[str]) -> None:
        calls.append(len(batch))
        if len(calls) == 2:
            raise RuntimeError("the second batch's other writes failed")

    with pytest.raises(RuntimeError):
        stores.journal.requeue_where(2.0, also=also)
    assert _states(stores) == {"pending": REQUEUE_BATCH, "failed": 5}
    assert stores.journal.requeue_where(3.0) == ids[REQUEUE_BATCH:]
    assert _states(stores) == {"pending": len(ids)}


@pytest.mark.timeout(180)
def test_an_interrupted_requeue_of_every_failed_row_stops_between_batches_and_says_which(
        db_url: str) -> None:
    """``inbox requeue --all-failed`` commits batch by batch: Ctrl-C part-way left the
    batches before it requeued, yet the command printed only that a change "is committed
    whole or not at all", and never which rows had gone back. It stops after the batch
    under way now, lists what it requeued, and exits 130."""
    import signal
    import sqlite3

    rows = 10_000
    path = _rows_in(db_url, rows, "failed", "bad-{i:05d}")

    def pending() -> int:
        with sqlite3.connect(path) as con:
            return int(con.execute("SELECT count(*) FROM agent_inbox_messages "
                                   "WHERE status = 'pending'").fetchone()[0])

    requeue = subprocess.Popen(
        [sys.executable, "-m", "kinbox.actors", "inbox", "requeue", "--all-failed", "--json",
         "--db", db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        wait_for(lambda: pending() > 0 or requeue.poll() is not None, timeout=60,
                 what="the requeue's first batches")
        requeue.send_signal(signal.SIGINT)
        out, err = requeue.communicate(timeout=60)
    finally:
        if requeue.poll() is None:
            requeue.kill()
            requeue.wait()
    assert requeue.returncode == 130, err
    assert "Traceback" not in err and "stopping after the batch under way" in err
    said = json.loads(out)
    assert said["interrupted"] is True
    with sqlite3.connect(path) as con:
        went = [r[0] for r in con.execute("SELECT message_id FROM agent_inbox_messages "
                                          "WHERE status = 'pending' ORDER BY seq")]
    assert 0 < len(went) < rows
    assert said["requeued"] == went


@pytest.mark.timeout(120)
def test_a_role_that_may_not_read_the_sequence_is_not_told_it_is_behind(pg_url: str) -> None:
    """PostgreSQL shows a sequence's ``last_value`` only to a role that may read it (NULL
    otherwise): a monitoring role granted the tables alone was told the sequence was
    behind the rows, and every command it ran was refused ("run kinbox db upgrade")."""
    from urllib.parse import urlsplit, urlunsplit

    from kinbox.persistence import open_database

    s = Stores(pg_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("m1", "s1", "kept"), 0)
    s.close()
    role = f"kinbox_ro_{os.getpid()}"
    db = open_database(pg_url)
    db.execute_sql(f"DROP ROLE IF EXISTS {role}")
    db.execute_sql(f"CREATE ROLE {role} LOGIN")
    try:
        db.execute_sql(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        parts = urlsplit(pg_url)
        ro_url = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
        status = kinbox("db", "status", "--json", "--db", ro_url)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["up_to_date"] is True, status.stdout
        listed = kinbox("inbox", "list", "--json", "--db", ro_url)
        assert listed.returncode == 0, listed.stderr
        assert [r["message_id"] for r in json.loads(listed.stdout)["items"]] == ["m1"]
    finally:
        db.execute_sql(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        db.execute_sql(f"DROP ROLE {role}")
        db.close()
