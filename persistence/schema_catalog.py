"""What the database has, read in one go: its tables, their columns and its indexes.

The schema check (:mod:`.schema`) runs at every runtime's start and every command
that writes. It compared the models with the database table by table, and on
PostgreSQL each table cost two reads of ``information_schema.columns`` (a view
the server plans afresh each time): 58 statements and 0.1-0.3 s of every start of
a runtime, a worker or a CLI command on an up-to-date database. A snapshot answers
every question the check asks from one read of the columns of kinbox's tables and
one of the indexes (three statements with the tables); on SQLite the columns come
from ``PRAGMA table_info``, which reads the file in process.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import peewee as pw

from .database import is_postgres
from .open_indexes import index_names


@dataclass(frozen=True)
class ColumnInfo:
    """One column as the database has it."""

    null: bool
    """It takes NULL."""
    has_default: bool
    """The table gives it a value when an insert names none."""
    width: int | None
    """PostgreSQL: the most characters a text column takes (None: no limit, or SQLite,
    which enforces none)."""


@dataclass(frozen=True)
class Catalog:
    """A snapshot of the schema: ``tables`` (every one), ``columns`` of the tables asked
    about that exist, by table then column, and every index name."""

    tables: frozenset[str]
    columns: Mapping[str, Mapping[str, ColumnInfo]]
    indexes: frozenset[str]


def read_catalog(db: pw.Database, wanted: Collection[str],
                 tables: Collection[str] | None = None) -> Catalog:
    """The database's :class:`Catalog`, with the columns of the ``wanted`` tables
    (``tables``: the database's tables where the caller has read them already)."""
    existing = frozenset(db.get_tables() if tables is None else tables)
    present = [name for name in wanted if name in existing]
    columns: dict[str, dict[str, ColumnInfo]] = {name: {} for name in present}
    if is_postgres(db):
        if present:
            rows = db.execute_sql(
                "SELECT table_name, column_name, is_nullable = 'YES', "
                "column_default IS NOT NULL, character_maximum_length "
                "FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = ANY(%s)", (present,)).fetchall()
            for table, column, null, has_default, width in rows:
                columns[table][column] = ColumnInfo(bool(null), bool(has_default), width)
    else:
        for name in present:
            columns[name] = {c.name: ColumnInfo(c.null, c.default is not None, None)
                             for c in db.get_columns(name)}
    return Catalog(existing, columns, frozenset(index_names(db)))
