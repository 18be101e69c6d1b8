"""A session's status and recency as readers see them: read off the journal, not stored.

Every turn used to write its session's row twice, ``active`` when its message
was leased and ``idle`` with a new ``updated_at`` when its turn committed: two
statements per group commit, a dozen scattered page writes on SQLite, a row
version per turn on PostgreSQL, for facts the journal already holds:

- a session is **active** while one of its inbox rows is processing (leased
  to a turn, here or in another process), or while a direct turn runs (it has
  no inbox row, so it marks the session's own row with its runtime's id,
  ``sessions.turn_owner``);
- its **recency** (``updated_at``: listings' order, the Focal heartbeat's last
  activity) is the later of the row's own ``updated_at`` (creation, a rename,
  a config change, a direct turn) and its newest transcript entry's time.

Each is one index probe per session read: the open rows' partial index by
target (its condition repeated word for word, as SQLite requires) and the
transcript's ``(session_id, id)`` index from its end. Reads are rare beside
turns; listings and the heartbeat pay for them, the message path does not.
What older versions stored in ``sessions.status`` (an ``active`` a crash could
leave behind) no longer means anything. A direct turn's mark is ended by the
turn however it ends; one a killed process left is ended by the next start of
a runtime that holds the SQLite file alone, and on PostgreSQL by any runtime
that finds the mark's owner gone (``sessions.turn_owner``, the same check that
takes over a dead runtime's leases).
"""

from __future__ import annotations

import peewee as pw

from .database import is_postgres
from .hot_path import PROCESSING, is_open
from .models import Tables

ACTIVE, IDLE = "active", "idle"
"""A session's status as read."""


def live_columns(t: Tables) -> tuple[pw.Node, pw.Node]:
    """The derived ``status`` and ``updated_at`` of the selected session row, as the
    columns ``live_status`` and ``recent`` (for ``t.session.select(...)``)."""
    s, entry, row = t.session, t.transcript.alias("e"), t.inbox.alias("i")
    # A scalar subquery, not EXISTS: one probe per session, never a hashed read of the
    # inbox (see ``pg_claims.marker_probe``).
    turning = row.select(pw.SQL("1")).where(
        (row.target_chat_id == s.id) & pw.SQL(f"{is_open('i')} AND i.status = '{PROCESSING}'")
    ).limit(1)
    leased = pw.NodeList((turning, pw.SQL("IS NOT NULL")))
    status = pw.Case(None, [(s.turn_owner.is_null(False) | leased, ACTIVE)], IDLE)
    newest = (entry.select(entry.created_at).where(entry.session_id == s.id)
              .order_by(entry.id.desc()).limit(1))
    later = pw.fn.GREATEST if is_postgres(t.db) else pw.fn.MAX  # SQLite's MAX of two is scalar
    return (status.alias("live_status"),
            later(s.updated_at, pw.fn.COALESCE(newest, s.updated_at)).alias("recent"))
