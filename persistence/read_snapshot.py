"""Several reads that must agree: one transaction, one snapshot of the database.

Outside a transaction each statement reads the database as it is when that statement
starts (SQLite's autocommit, PostgreSQL's ``READ COMMITTED``): a change another process
commits between two reads shows in the second only, and a row read by the first is shown
beside a history, or a count, of a state it never had. Inside :func:`read_snapshot` every
read sees the database as the first one did: SQLite's WAL keeps a transaction's reads on
the snapshot its first read took; PostgreSQL needs ``REPEATABLE READ`` for that.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import peewee as pw

from .database import is_postgres


@contextmanager
def read_snapshot(db: pw.Database) -> Iterator[None]:
    """Run the block's reads in one transaction that sees one snapshot (it writes
    nothing: a block that wrote on PostgreSQL could fail to serialise)."""
    with db.atomic(isolation_level="REPEATABLE READ") if is_postgres(db) else db.atomic():
        yield
