"""The schema's version number: which kinbox last upgraded a database.

:mod:`.schema` compares the database with the models, and sees only what this code's
models know. A database a newer kinbox upgraded looked current to an older one (its
new tables and columns are nothing the older models miss), or was "repaired" backwards
(an index the newer code dropped built again), and a column whose meaning the newer
code changed was read the old way. The number tells them apart:

- older (or none: a database from before the number, or an empty one, counts as 0):
  upgraded, the version raised in the upgrade's own transaction, so an upgrade that
  fails leaves both the schema and the number as they were;
- the same: only the comparison with the models decides;
- newer: refused with :class:`.SchemaTooNew` before anything is read or written.

One rule for both backends: a one-row table (:class:`.models.SchemaVersion`), read and
written in the upgrade's transaction, under its lock on PostgreSQL (SQLite's
``user_version`` has no PostgreSQL twin). :data:`SCHEMA_VERSION` is raised with every
change to the models or the indexes; ``tests/test_schema_version.py`` pins the schema
of each version, so a change made without raising it fails there.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

import peewee as pw

from .errors import SchemaTooNew
from .models import SchemaVersion

SCHEMA_VERSION = 1
"""The schema version this code makes and knows."""

VERSION_TABLE: str = SchemaVersion._meta.table_name
"""The table that holds the number."""


class VersionVerdict(enum.Enum):
    """How a database's version compares with the code's."""

    OLDER = "older"
    """Upgrade it (and raise its number)."""
    CURRENT = "current"
    """Only the models decide what is left to do."""
    NEWER = "newer"
    """Refuse it: a newer kinbox upgraded it."""


def verdict(found: int, known: int) -> VersionVerdict:
    """The rule: the database's version ``found`` against the code's ``known``."""
    if found < known:
        return VersionVerdict.OLDER
    if found > known:
        return VersionVerdict.NEWER
    return VersionVerdict.CURRENT


def read_version(db: pw.Database, tables: Collection[str] | None = None) -> int:
    """The database's schema version; 0 without the table or its row. ``tables``: the
    database's tables where the caller has read them already."""
    if VERSION_TABLE not in (db.get_tables() if tables is None else tables):
        return 0
    found = (SchemaVersion.select(SchemaVersion.version)
             .where(SchemaVersion.id == 1).bind(db).scalar())
    return int(found) if found is not None else 0


def check_version(db: pw.Database, tables: Collection[str] | None = None) -> int:
    """The database's schema version, when this code may work on it; else
    :class:`.SchemaTooNew`, nothing read or written but the number (``tables``: as
    :func:`read_version`)."""
    found = read_version(db, tables)
    if verdict(found, SCHEMA_VERSION) is VersionVerdict.NEWER:
        raise SchemaTooNew(found, SCHEMA_VERSION)
    return found


def version_change(found: int) -> str | None:
    """What an upgrade does to the number of a database at ``found``, or None."""
    if verdict(found, SCHEMA_VERSION) is not VersionVerdict.OLDER:
        return None
    return f"set schema version to {SCHEMA_VERSION} (from {found})"


def write_version(db: pw.Database) -> None:
    """Record :data:`SCHEMA_VERSION` (inside the upgrade's transaction, its table made)."""
    (SchemaVersion.insert(id=1, version=SCHEMA_VERSION)
     .on_conflict(conflict_target=[SchemaVersion.id],
                  update={SchemaVersion.version: SCHEMA_VERSION})
     .bind(db).execute())
