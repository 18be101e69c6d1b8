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
- newer, and this code at least its *compatible* number (below): worked on as it is,
  nothing upgraded or "repaired" (its tables and columns are checked, no more);
- newer, past that: refused with :class:`.SchemaTooNew` before anything is read or
  written.

Beside its version an upgrade records the oldest version whose code may still work on
the database as it is (:data:`COMPATIBLE_FROM`): a change an older kinbox can live with
(a new table, a column that takes NULL or has a default in the table itself, not only in
Python, which is all peewee's migrator leaves; an index) leaves it where it was, so a rolling
deploy of several processes on one PostgreSQL database keeps its older processes
running, and restartable, beside the upgraded ones; a change older code would misread
raises it. One number alone made every upgrade a stop of every older process.

One rule for both backends: a one-row table (:class:`.models.SchemaVersion`), read and
written in the upgrade's transaction, under its lock on PostgreSQL (SQLite's
``user_version`` has no PostgreSQL twin). :data:`SCHEMA_VERSION` is raised with every
change to the models or the indexes; ``tests/test_schema_version.py`` pins the schema
of each version, so a change made without raising it fails there.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

import peewee as pw

from .errors import SchemaError, SchemaTooNew
from .models import SchemaVersion

SCHEMA_VERSION = 2
"""The schema version this code makes and knows. 2: ``kinbox_schema.compatible``."""

COMPATIBLE_FROM = 1
"""The oldest schema version whose code may work on a database this code upgraded, as it
is. Raise it to :data:`SCHEMA_VERSION` with a change older code would get wrong: a column
it must write and does not know (required, no default in the table; older code checks
for these and refuses the database, :class:`.SchemaIncomplete`), a column or table whose meaning
changed, one it reads that is gone, rows it must not see. Version 2's one change, a
column of this table, is nothing version 1 reads (version 1 refuses every newer number,
knowing no compatible one)."""

VERSION_TABLE: str = SchemaVersion._meta.table_name
"""The table that holds the number."""


@dataclass(frozen=True)
class Stamp:
    """What a database records of the upgrade that last changed its schema."""

    version: int
    """Its schema version (0: none recorded)."""
    compatible: int
    """The oldest schema version whose code may work on it (``version`` where the upgrade
    recorded none)."""


class VersionVerdict(enum.Enum):
    """How a database's version compares with the code's."""

    OLDER = "older"
    """Upgrade it (and raise its number)."""
    CURRENT = "current"
    """Only the models decide what is left to do."""
    NEWER_COMPATIBLE = "newer, compatible"
    """A newer kinbox upgraded it and says this code may still work on it: worked on as it
    is, nothing changed."""
    NEWER = "newer"
    """Refuse it: a newer kinbox upgraded it past what this code may work on."""


def verdict(found: int, known: int, compatible: int) -> VersionVerdict:
    """The rule: the database's version ``found`` (and the oldest version that may work on
    it, ``compatible``) against the code's ``known``."""
    if found < known:
        return VersionVerdict.OLDER
    if found == known:
        return VersionVerdict.CURRENT
    if compatible <= known:
        return VersionVerdict.NEWER_COMPATIBLE
    return VersionVerdict.NEWER


def read_stamp(db: pw.Database, tables: Collection[str] | None = None) -> Stamp:
    """The database's :class:`Stamp`; version 0 without the table or its row. ``tables``:
    the database's tables where the caller has read them already."""
    if VERSION_TABLE not in (db.get_tables() if tables is None else tables):
        return Stamp(0, 0)
    # Every column, by name: a version 1 table has no ``compatible`` to select.
    cursor = db.execute_sql(f"SELECT * FROM {VERSION_TABLE} WHERE id = 1")
    row = cursor.fetchone()
    if row is None:
        return Stamp(0, 0)
    values = dict(zip((d[0] for d in cursor.description), row, strict=True))
    version = int(values["version"])
    compatible = values.get("compatible")
    # The one place a missing number is read: an upgrade that recorded none (version 1)
    # made no promise beyond its own version.
    return Stamp(version, version if compatible is None else int(compatible))


def check_version(db: pw.Database, tables: Collection[str] | None = None
                  ) -> tuple[Stamp, VersionVerdict]:
    """The database's stamp and its verdict, when this code may work on it; else
    :class:`.SchemaTooNew`, nothing read or written but the stamp (``tables``: as
    :func:`read_stamp`)."""
    found = read_stamp(db, tables)
    judged = verdict(found.version, SCHEMA_VERSION, found.compatible)
    if judged is VersionVerdict.NEWER:
        raise SchemaTooNew(found.version, SCHEMA_VERSION, found.compatible)
    return found, judged


def version_change(found: Stamp, judged: VersionVerdict) -> str | None:
    """What an upgrade does to the number of a database at ``found`` (judged ``judged``),
    or None."""
    if judged is not VersionVerdict.OLDER:
        return None
    return f"set schema version to {SCHEMA_VERSION} (from {found.version})"


def write_version(db: pw.Database) -> None:
    """Record :data:`SCHEMA_VERSION` and :data:`COMPATIBLE_FROM` (inside the upgrade's
    transaction, its table made). Never over a newer number: the upgrade judged the
    database under its lock, and should another process have raised it past this code
    regardless (another lock, a hand's edit), the upgrade fails here and rolls back."""
    (SchemaVersion.insert(id=1, version=SCHEMA_VERSION, compatible=COMPATIBLE_FROM)
     .on_conflict(conflict_target=[SchemaVersion.id],
                  update={SchemaVersion.version: SCHEMA_VERSION,
                          SchemaVersion.compatible: COMPATIBLE_FROM},
                  where=SchemaVersion.version <= SCHEMA_VERSION)
     .bind(db).execute())
    found, judged = check_version(db, (VERSION_TABLE,))  # SchemaTooNew past this code
    if judged is VersionVerdict.CURRENT:
        return
    raise SchemaError(f"another process raised the schema to version {found.version} "
                      "during this upgrade, which wrote nothing; run it again")
