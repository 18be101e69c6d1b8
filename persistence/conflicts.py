"""Inserts that leave a row already there: the one rule for which refusals they pass over.

Several writers may insert the same row (two runtimes' first start, a commit retried
elsewhere), and the second one's insert must leave the first's row as it is. peewee's
``on_conflict_ignore()`` said so too broadly: on SQLite it is ``INSERT OR IGNORE``, which
passes over every constraint the row breaks (a NOT NULL value missing, a CHECK), so a row
the table refused was answered as one already there: a stop never asked, a reply never
kept, a duplicate id reported for a missing title. ``ON CONFLICT ... DO NOTHING``
(SQLite >= 3.24, PostgreSQL) passes over uniqueness conflicts alone, the same on both
backends; every other refusal raises (:class:`~.errors.DatabaseFailed`).
"""

from __future__ import annotations

from typing import Any

import peewee as pw


def unless_present(insert: Any, *key: pw.Field) -> Any:
    """``insert`` (not yet executed), doing nothing where a row holds its ``key`` already.

    ``key``: the columns of the primary key or of one unique index, the conflict expected;
    a conflict on another unique index still raises. No ``key``: a conflict on any unique
    index of the table, for a row whose twin meets two at once (a project's id and slug),
    where a single target lets PostgreSQL raise on the other index in a race."""
    return insert.on_conflict(action="NOTHING", conflict_target=list(key) or None)
