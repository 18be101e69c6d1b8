"""SQLite's rule that a ``seq`` is handed out once: the next row's number is past every
row there is and every row a prune deleted.

SQLite numbers new rows ``MAX(seq) + 1`` in the writer's transaction (``BulkSql.next_seq``).
A prune that deleted the newest rows would give their numbers to the next sends, and a
reader holding a ``seq`` (a tail of the journal by ``seq``, a peer link's window position)
would take a new message for one it had seen: it missed it. So a prune raises
:class:`~.models.InboxSeqMark` to the journal's newest ``seq`` in the transaction that
deletes (one statement a batch), and the numbering reads the higher of the two in the
statement it already runs: nothing more on the send path. PostgreSQL numbers rows from
its sequence (``schema.INBOX_SEQUENCE``), which never goes back: the mark is not used
there.
"""

from __future__ import annotations

import peewee as pw

from .database import is_sqlite
from .hot_path import INBOX
from .models import InboxSeqMark

SEQ_MARK = InboxSeqMark._meta.table_name  # type: ignore[attr-defined]

NEXT_SEQ_SQL = (
    f"SELECT NULL, MAX(COALESCE((SELECT MAX(seq) FROM {INBOX}), 0), "
    f"COALESCE((SELECT top FROM {SEQ_MARK} WHERE id = 1), 0))"
)
"""SQLite: one row, ``(NULL, the highest seq handed out)``. Each side is a subquery so that the
newest ``seq`` stays one probe of its index (an aggregate inside an expression would be
read from every row)."""

_RAISE_SQL = (
    f"INSERT INTO {SEQ_MARK} (id, top) SELECT 1, COALESCE((SELECT MAX(seq) "
    f"FROM {INBOX}), 0) WHERE true ON CONFLICT (id) DO UPDATE SET "
    f"top = MAX(top, excluded.top)"
)
"""SQLite: raise the mark to the newest ``seq`` (a scalar subquery, one index probe; the
``WHERE`` tells an upsert's ``ON CONFLICT`` from a join's ``ON``)."""


def hold_mark(db: pw.Database) -> None:
    """SQLite: before rows are deleted, in the deleting transaction: raise the mark to the
    journal's newest ``seq`` (whichever rows go, none of their numbers comes back)."""
    if is_sqlite(db):
        db.execute_sql(_RAISE_SQL)
