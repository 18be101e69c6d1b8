"""PostgreSQL's partial indexes over the open rows: what its claim and head probes walk.

On PostgreSQL every status change writes a new row version and a new entry
in every index naming ``status``; the old entries stay until vacuum. The
full indexes (``(status, seq)``, ``(target_chat_id, status, seq)``) hold
every delivered row as well, so their statistics and their size grow with
the table's history, and on a large backlog the planner stopped using them
(a claim walked the whole table by ``seq``: 8.7 s at 50,000 rows). These
indexes hold only rows that are open (pending or processing): they stay as
small as the backlog, and the statements of :mod:`.pg_claims` are shaped so
that each has one obvious plan over them (an ordered walk with a ``LIMIT``,
or a one-row probe).

SQLite does not get them: its claim path is one process's and its planner
keeps to the full indexes; extra indexes there would only slow its writes.
They are created by :func:`~.schema.upgrade` (``kinbox db upgrade``), which
also reports them missing on an older PostgreSQL database.

In their place PostgreSQL drops the models' full indexes that only SQLite's
statements read (:data:`SQLITE_ONLY_INDEXES`). No status change of an inbox
row is a HOT update (``status`` is in the partial indexes' predicates), so
each writes an entry into every full index of the table: a message changes
its row twice, and the two full inbox indexes were four of its index writes
for nothing. A partial index gets an entry only from a row version that
matches it: a delivery writes just the primary key and ``seq``. Operator
reads of failed rows walk a partial index of their own; a listing of one
target's delivered rows, or of the sessions by ``updated_at``, reads the
table (an operator's query, not the message path's).
"""

from __future__ import annotations

import peewee as pw

from .hot_path import FAILED, INBOX, PENDING, PROCESSING

OPEN_INDEXES = {
    "agent_inbox_pending_seq": f"ON {INBOX} (seq) WHERE status = '{PENDING}'",
    "agent_inbox_processing_seq": f"ON {INBOX} (seq) WHERE status = '{PROCESSING}'",
    "agent_inbox_open_target_seq": (f"ON {INBOX} (target_chat_id, seq) "
                                    f"WHERE status IN ('{PENDING}', '{PROCESSING}')"),
}
"""name -> definition: the pending walk in ``seq`` order, the processing (lease expiry)
walk, and each target's head (its oldest open row)."""

OPERATOR_INDEXES = {
    "agent_inbox_failed_seq": f"ON {INBOX} (seq) WHERE status = '{FAILED}'",
}
"""name -> definition: the failed rows an operator lists and requeues (rare, so the index
stays small and is written only when a row fails)."""

PG_INDEXES = {**OPEN_INDEXES, **OPERATOR_INDEXES}

SQLITE_ONLY_INDEXES = (
    "agent_inbox_messages_target_chat_id_status_seq",
    "agent_inbox_messages_status_seq",
    "sessions_updated_at",
)
"""The models' indexes no PostgreSQL statement reads (peewee's names): the inbox's full
(target, status, seq) and (status, seq), and ``sessions.updated_at``, whose index made
every session status change (two a turn) a non-HOT update."""


def _index_names(db: pw.Database) -> set[str]:
    rows = db.execute_sql("SELECT indexname FROM pg_indexes WHERE schemaname = "
                          "current_schema()").fetchall()
    return {r[0] for r in rows}


def missing_open_indexes(db: pw.Database) -> list[str]:
    """The names of :data:`PG_INDEXES` the database lacks (PostgreSQL only)."""
    have = _index_names(db)
    return [name for name in PG_INDEXES if name not in have]


def surplus_indexes(db: pw.Database) -> list[str]:
    """The names of :data:`SQLITE_ONLY_INDEXES` the database has (PostgreSQL only)."""
    have = _index_names(db)
    return [name for name in SQLITE_ONLY_INDEXES if name in have]


def create_open_indexes(db: pw.Database) -> None:
    """Create the missing ones and drop the surplus (inside the upgrade's transaction)."""
    for name in missing_open_indexes(db):
        db.execute_sql(f"CREATE INDEX IF NOT EXISTS {name} {PG_INDEXES[name]}")
    for name in surplus_indexes(db):
        db.execute_sql(f"DROP INDEX IF EXISTS {name}")
