"""What the database has, read in one go: its tables, their columns and its indexes.

The schema check (:mod:`.schema`) runs at every runtime's start and every command
that writes. It compared the models with the database table by table, and on
PostgreSQL each table cost two reads of ``information_schema.columns`` (a view
the server plans afresh each time): 58 statements and 0.1-0.3 s of every start of
a runtime, a worker or a CLI command on an up-to-date database. A snapshot answers
every question the check asks from one read of the columns of kinbox's tables (the
system catalog's) and one of the indexes (three statements with the tables); on SQLite
the columns come from ``PRAGMA table_info``, which reads the file in process.
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
    """The table gives it a value when an insert names none (a default, an identity or
    generated column, SQLite's rowid)."""
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
            for table, column, null, filled, width in db.execute_sql(_PG_COLUMNS,
                                                                     (present,)).fetchall():
                columns[table][column] = ColumnInfo(bool(null), bool(filled), width)
    else:
        for name in present:
            columns[name] = {c.name: ColumnInfo(c.null, _sqlite_fills(c), None)
                             for c in db.get_columns(name)}
    return Catalog(existing, columns, frozenset(index_names(db)))


# From the system catalog, not information_schema.columns: that view shows only the
# columns of tables the role holds a privilege on (a table it cannot see would look
# empty, every column "missing"), and it is slower to plan. A column is filled by the
# table when it has a default, is an identity column or is generated. A text column's
# width is its type modifier less the 4 bytes of its header (varchar(n), char(n)).
_PG_COLUMNS = (
    "SELECT c.relname, a.attname, NOT a.attnotnull, "
    "a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', "
    "CASE WHEN a.atttypid IN ('varchar'::regtype, 'bpchar'::regtype) AND a.atttypmod > 4 "
    "THEN a.atttypmod - 4 END "
    "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relname = ANY(%s) "
    "AND a.attnum > 0 AND NOT a.attisdropped")


def _sqlite_fills(column: pw.ColumnMetadata) -> bool:
    """Does SQLite give ``column`` a value when an insert names none: a default, or the
    rowid an ``INTEGER PRIMARY KEY`` stands for?"""
    return column.default is not None or (
        column.primary_key and column.data_type.upper() == "INTEGER")
