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
"""

from __future__ import annotations

import peewee as pw

from .hot_path import INBOX, PENDING, PROCESSING

OPEN_INDEXES = {
    "agent_inbox_pending_seq": f"ON {INBOX} (seq) WHERE status = '{PENDING}'",
    "agent_inbox_processing_seq": f"ON {INBOX} (seq) WHERE status = '{PROCESSING}'",
    "agent_inbox_open_target_seq": (f"ON {INBOX} (target_chat_id, seq) "
                                    f"WHERE status IN ('{PENDING}', '{PROCESSING}')"),
}
"""name -> definition: the pending walk in ``seq`` order, the processing (lease expiry)
walk, and each target's head (its oldest open row)."""


def missing_open_indexes(db: pw.Database) -> list[str]:
    """The names of :data:`OPEN_INDEXES` the database lacks (PostgreSQL only)."""
    rows = db.execute_sql("SELECT indexname FROM pg_indexes WHERE tablename = %s",
                          (INBOX,)).fetchall()
    have = {r[0] for r in rows}
    return [name for name in OPEN_INDEXES if name not in have]


def create_open_indexes(db: pw.Database) -> None:
    """Create the missing ones (inside the upgrade's transaction)."""
    for name in missing_open_indexes(db):
        db.execute_sql(f"CREATE INDEX IF NOT EXISTS {name} {OPEN_INDEXES[name]}")
