"""The inbox's partial indexes over the open rows: what claims and head probes walk.

On both backends, the models' full indexes (``(status, seq)``,
``(target_chat_id, status, seq)``) hold every delivered row as well, and
every status change moves a row's entries in each: a message's two changes
(leased, delivered) were four index moves each. These indexes hold only rows
that are open (pending or processing): they stay as small as the backlog,
a delivered row leaves them and goes nowhere, and the statements of
:mod:`.hot_path` and :mod:`.pg_claims` are shaped so that each has one
obvious plan over them (an ordered walk with a ``LIMIT``, or a one-row
probe), on SQLite as on PostgreSQL.

- PostgreSQL: every status change writes a new row version and an entry in
  every index naming ``status``, and the old entries stay until vacuum; on
  a large backlog the planner stopped using the full indexes (a claim walked
  the whole table by ``seq``: 8.7 s at 50,000 rows).
- SQLite: the full ``(target, status, seq)`` index put each delivered row on
  its target's page, so a group commit of a thousand messages dirtied (and
  wrote to the log) pages all over it. SQLite uses a partial index only for
  a statement that repeats its condition word for word, which the
  statements here do.

They are created by :func:`~.schema.upgrade` (``kinbox db upgrade``), which
also drops the replaced full indexes (:data:`FULL_INDEXES`) and the indexes on
``sessions.updated_at`` and ``transcript_entries.session_id`` from an older
database. Operator reads of failed rows walk a partial index of their own; a
listing of one target's delivered rows, or the counts per state, read the
table (an operator's query, not the message path's).
"""

from __future__ import annotations

from collections.abc import Collection

import peewee as pw

from .database import is_postgres
from .hot_path import INBOX, is_open
from .inbox_core import FAILED, PENDING, PROCESSING

OPEN_INDEXES = {
    "agent_inbox_pending_seq": f"ON {INBOX} (seq) WHERE status = '{PENDING}'",
    "agent_inbox_processing_seq": f"ON {INBOX} (seq) WHERE status = '{PROCESSING}'",
    "agent_inbox_open_target_seq": f"ON {INBOX} (target_chat_id, seq) WHERE {is_open()}",
}
"""name -> definition: the pending walk in ``seq`` order, the processing (lease expiry)
walk, and each target's head (its oldest open row)."""

OPERATOR_INDEXES = {
    "agent_inbox_failed_seq": f"ON {INBOX} (seq) WHERE status = '{FAILED}'",
}
"""name -> definition: the failed rows an operator lists and requeues (rare, so the index
stays small and is written only when a row fails)."""

INBOX_INDEXES = {**OPEN_INDEXES, **OPERATOR_INDEXES}

FULL_INDEXES = {
    "agent_inbox_messages_target_chat_id_status_seq":
        f"ON {INBOX} (target_chat_id, status, seq)",
    "agent_inbox_messages_status_seq": f"ON {INBOX} (status, seq)",
    "sessions_updated_at": "ON sessions (updated_at)",
    "transcript_entries_session_id": "ON transcript_entries (session_id)",
    "tasks_project_id": "ON tasks (project_id)",
    "cron_runs_job_id": "ON cron_runs (job_id)",
    # PostgreSQL, briefly, for the probes of pg_claims: each cost every message two more
    # index writes (a row's every status change writes every index), for probes the
    # partial indexes above serve.
    "agent_inbox_processing_target":
        f"ON {INBOX} (target_chat_id) WHERE status = '{PROCESSING}'",
    "agent_inbox_processing_target_seq":
        f"ON {INBOX} (target_chat_id, seq) WHERE status = '{PROCESSING}'",
}
"""name -> definition of the indexes these replace, as older versions created them
(peewee's names), dropped by the upgrade: the inbox's full (target, status, seq) and
(status, seq), ``sessions.updated_at``'s, which made every session status change a
write to it (and on PostgreSQL a non-HOT update), the transcript's by session alone
(now by ``(session_id, id)``, the model's), and the tasks' by project alone (now the
prefix of ``(project_id, chat_id, updated_at)``, the model's), and the cron runs' by job
alone (now the prefix of ``(job_id, started_at, id)``, the model's: a job's last runs were
all its runs read and sorted, at every run)."""


def index_names(db: pw.Database) -> set[str]:
    """The names of every index the database has (of this schema on PostgreSQL)."""
    if is_postgres(db):
        sql = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    else:
        sql = "SELECT name FROM sqlite_master WHERE type = 'index'"
    return {r[0] for r in db.execute_sql(sql).fetchall()}


def missing_open_indexes(have: Collection[str]) -> list[str]:
    """The names of :data:`INBOX_INDEXES` a database with the indexes ``have`` lacks."""
    return [name for name in INBOX_INDEXES if name not in have]


def surplus_indexes(have: Collection[str]) -> list[str]:
    """The names of :data:`FULL_INDEXES` a database with the indexes ``have`` has."""
    return [name for name in FULL_INDEXES if name in have]


def create_open_indexes(db: pw.Database) -> None:
    """Create the missing ones and drop the surplus (inside the upgrade's transaction)."""
    have = index_names(db)
    for name in missing_open_indexes(have):
        db.execute_sql(f"CREATE INDEX IF NOT EXISTS {name} {INBOX_INDEXES[name]}")
    for name in surplus_indexes(have):
        db.execute_sql(f"DROP INDEX IF EXISTS {name}")
