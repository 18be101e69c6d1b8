"""Operator reads at their edges: what ``db status`` tells a deploy script, what ``inbox
show`` reads of a row changing under it. Each test failed on the code before its fix."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kinbox.persistence import NewMessage, bind_tables, open_database, upgrade

from .conftest import Stores
from .helpers import wait_for
from .test_cli import ROOT, kinbox


@pytest.mark.timeout(120)
def test_db_status_exits_non_zero_while_an_upgrade_is_pending(db_url: str) -> None:
    """``kinbox db status`` printed "needs upgrade" and exited 0: a deploy script checking
    the exit status went on to start a runtime against an old schema. It now exits 3 (no
    error, a state to act on), and 0 once the schema is current."""
    db = open_database(db_url)
    upgrade(bind_tables(db))
    db.execute_sql("DROP TABLE agent_inbox_seq_mark")
    db.close()
    pending = kinbox("db", "status", "--db", db_url)
    assert pending.returncode == 3, (pending.stdout, pending.stderr)
    assert "needs upgrade" in pending.stdout and "Traceback" not in pending.stderr
    as_json = kinbox("db", "status", "--json", "--db", db_url)
    assert as_json.returncode == 3
    assert json.loads(as_json.stdout)["up_to_date"] is False
    assert kinbox("db", "upgrade", "--db", db_url).returncode == 0
    current = kinbox("db", "status", "--db", db_url)
    assert current.returncode == 0, current.stderr
    assert "up to date" in current.stdout


@pytest.mark.timeout(120)
def test_db_status_json_names_every_state_with_its_count_zero_included(db_url: str) -> None:
    """``db status --json`` listed only the states that had rows: on a fresh database
    ``rows`` was ``{}``, and a script reading ``rows["failed"]`` to alert on failed rows
    crashed with a KeyError exactly when all was well. Every state is there, 0 included;
    while an upgrade is pending nothing was counted, and ``rows`` is null, not a ``{}``
    that reads as an empty journal."""
    db = open_database(db_url)
    upgrade(bind_tables(db))
    db.close()
    s = Stores(db_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("m1", "s1", "body"), 0)
    s.close()
    done = kinbox("db", "status", "--json", "--db", db_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == {"pending": 1, "processing": 0, "delivered": 0,
                                               "failed": 0, "cancelled": 0}
    db = open_database(db_url)
    db.execute_sql("DROP TABLE agent_inbox_seq_mark")
    db.close()
    pending = kinbox("db", "status", "--json", "--db", db_url)
    assert pending.returncode == 3, pending.stderr
    assert json.loads(pending.stdout)["rows"] is None


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_inbox_show_reads_a_row_and_its_history_in_one_snapshot(pg_url: str) -> None:
    """``kinbox inbox show`` read the row, then its history, each in a snapshot of its
    own: a requeue committed between the two showed the row still ``failed`` with the
    ``requeued`` event of the change it had not seen. The history's read is held on a
    lock (on the history's index) while the requeue commits: both halves now show the
    row as it was."""
    s = Stores(pg_url)
    s.store.create_session("s1", None, "Worker", "interactive", 0)
    s.journal.enqueue(NewMessage("stuck", "s1", "body"), 0)
    s.journal.claim("w", 0)
    s.journal.retry("w", "stuck", "boom", 0, permanent=True)
    t, db = s.tables, s.db
    watch = open_database(pg_url)

    def show_waits_for_the_history() -> bool:
        return bool(watch.execute_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s", ('%FROM "agent_inbox_events"%',)
        ).fetchone()[0])
    try:
        with db.atomic():
            # The history's index alone: the command's schema check reads the table's
            # columns (a lock on the table would hold it there, before the row's read).
            db.execute_sql("REINDEX INDEX agent_inbox_events_message_id")
            show = subprocess.Popen(
                [sys.executable, "-m", "kinbox.actors", "inbox", "show", "stuck", "--json",
                 "--db", pg_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                cwd=ROOT)
            try:
                wait_for(show_waits_for_the_history, 90, "inbox show to read the history")
            except BaseException:
                show.kill()
                raise
            # What a requeue writes: the row pending again, and the event saying so.
            t.inbox.update(status="pending", attempts=0).where(
                t.inbox.message_id == "stuck").execute()
            t.event.insert(message_id="stuck", at=5.0, attempts=1, event="requeued",
                           detail="boom").execute()
        out, err = show.communicate(timeout=90)
    finally:
        watch.close()
        s.close()
    assert show.returncode == 0, err
    row = json.loads(out)
    assert (row["status"], [h["event"] for h in row["history"]]) == ("failed", ["failed"])
