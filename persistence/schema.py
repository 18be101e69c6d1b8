"""Creating and upgrading the schema with peewee's migration support.

The models are the description of the schema; the database is compared to
them. Its version number (:mod:`.schema_version`) only says whether this code
may do so: a database a newer kinbox upgraded is refused first (``SchemaTooNew``)
unless it says this code may still work on it (then it is only checked for what this
code needs: its tables and columns, the unique indexes and the sequence its writes rely
on, no required column it does not know; ``SchemaIncomplete`` otherwise, and changed
in nothing), and an older one's number is raised by the upgrade that brings it up to the
models, in the same transaction. ``upgrade`` creates missing tables
and indexes and adds missing columns through ``playhouse.migrate`` (which
knows how to add a NOT NULL column with a default on every backend), and on
PostgreSQL widens a text column an older schema made narrower than its model
(SQLite does not enforce a width); ``pending_changes`` lists what an upgrade
would do, for ``kinbox db status``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import peewee as pw
from playhouse import migrate

from .database import is_postgres, is_sqlite
from .errors import SchemaError, SchemaIncomplete, first_lines
from .hot_path import INBOX
from .liveness import LOCK_CLASS
from .models import Tables
from .open_indexes import (
    create_open_indexes,
    missing_open_indexes,
    surplus_indexes,
)
from .schema_catalog import Catalog, read_catalog
from .schema_version import (
    SCHEMA_VERSION,
    Stamp,
    VersionVerdict,
    check_version,
    version_change,
    write_version,
)

INBOX_SEQUENCE = "agent_inbox_seq"
"""PostgreSQL sequence that orders inbox rows across processes."""

SCHEMA_LOCK_SQL = f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext('kinbox-schema'))"
"""PostgreSQL: one upgrade at a time (two processes creating one table at once collide on
the catalog); held until the upgrade's transaction ends."""


def _migrator(db: pw.Database) -> migrate.SchemaMigrator:
    if is_sqlite(db):
        return migrate.SqliteMigrator(db)
    if is_postgres(db):
        return migrate.PostgresqlMigrator(db)
    return migrate.SchemaMigrator.from_database(db)


def _narrow_columns(catalog: Catalog, model: type[pw.Model]) -> list[pw.CharField]:
    """The model's text fields whose PostgreSQL column is narrower than the field (none
    elsewhere): a value the field is meant to take fails to insert there."""
    have = catalog.columns.get(model._meta.table_name, {})
    return [f for f in model._meta.sorted_fields if isinstance(f, pw.CharField)
            and f.column_name in have and (width := have[f.column_name].width) is not None
            and width < f.max_length]


def _widen(name: str, field: pw.CharField) -> str:
    return f"widen column {name}.{field.column_name} to {field.max_length} characters"


def _sequence_change(db: pw.Database, existing: Collection[str]) -> str | None:
    """PostgreSQL: what :data:`INBOX_SEQUENCE` needs before a send can take a ``seq`` from
    it, or None. No table owns it, so a copy of the tables alone (``pg_dump -t``) comes
    without it, and rows copied into a new database are ahead of its count: every send
    then failed (no such relation; a duplicate ``seq``) in a schema called up to date."""
    if not is_postgres(db) or INBOX not in existing:
        return None
    # The rows first, then the sequence: a row's seq was drawn before it was committed, so
    # a sequence read after the rows is at or past every seq read, however busy the
    # senders are (read the other way round, a send between the two reads looked like a
    # sequence behind its rows).
    newest = db.execute_sql(f"SELECT MAX(seq) FROM {INBOX}").fetchone()[0]
    found = db.execute_sql(
        "SELECT last_value, has_sequence_privilege(format('%%I.%%I', schemaname, "
        "sequencename), 'SELECT,USAGE') FROM pg_sequences WHERE schemaname = "
        "current_schema() AND sequencename = %s", (INBOX_SEQUENCE,)).fetchone()
    if found is None:
        return f"create sequence {INBOX_SEQUENCE}"
    if not found[1]:  # last_value is NULL to a role that may not read it: nothing to judge
        return None
    # last_value is NULL until the first nextval (or a setval that left it uncalled).
    if newest is not None and (found[0] or 0) < newest:
        return f"move sequence {INBOX_SEQUENCE} past the rows' seq {newest}"
    return None


def _repair_sequence(db: pw.Database) -> None:
    """Create :data:`INBOX_SEQUENCE` if missing, and move one behind the rows past their
    ``seq`` (inside the upgrade's transaction). A sequence that is well is left alone: a
    ``setval`` is not undone by a rollback, and one racing the senders' ``nextval`` could
    hand out a number twice."""
    if _sequence_change(db, set(db.get_tables())) is None:
        return
    db.execute_sql(f"CREATE SEQUENCE IF NOT EXISTS {INBOX_SEQUENCE}")
    newest = db.execute_sql(f"SELECT MAX(seq) FROM {INBOX}").fetchone()[0]
    if newest is not None:  # every send fails until it is past them
        db.execute_sql("SELECT setval(%s, %s)", (INBOX_SEQUENCE, newest))


def _missing_fields(catalog: Catalog, model: type[pw.Model]) -> list[pw.Field]:
    """The fields of ``model`` whose columns its (existing) table lacks."""
    have = catalog.columns[model._meta.table_name]
    return [field for field in model._meta.sorted_fields if field.column_name not in have]


def _absent(catalog: Catalog, model: type[pw.Model]) -> list[str]:
    """The change that makes ``model``'s table, or one per column of it the table lacks."""
    name = model._meta.table_name
    if name not in catalog.tables:
        return [f"create table {name}"]
    return [f"add column {name}.{field.column_name}"
            for field in _missing_fields(catalog, model)]


def _missing_indexes(catalog: Catalog, model: type[pw.Model], *,
                     unique_only: bool = False) -> list[str]:
    """The names of ``model``'s own indexes (its unique ones: ``unique_only``) that the
    database lacks."""
    return [index._name for index in model._meta.fields_to_index()
            if (index._unique or not unique_only) and index._name not in catalog.indexes]


def _catalog(tables: Tables, existing: set[str] | None = None) -> Catalog:
    return read_catalog(tables.db, [m._meta.table_name for m in tables.all()], existing)


@dataclass(frozen=True)
class SchemaStatus:
    """What an upgrade would change, and the version numbers it judged by."""

    changes: list[str]
    """One line each; empty when up to date (or worked on as it is: a newer database this
    code may use)."""
    stamp: Stamp
    verdict: VersionVerdict
    catalog: Catalog
    """What the database had when it was judged."""


def schema_status(tables: Tables) -> SchemaStatus:
    """The schema's :class:`SchemaStatus`. :class:`.SchemaTooNew` for a database a newer
    kinbox upgraded past this code, :class:`.SchemaIncomplete` for one that says this code
    may work on it but lacks what it needs."""
    db = tables.db
    existing = set(db.get_tables())
    # First: a newer schema is not compared with older models.
    found, judged = check_version(db, existing)
    catalog = _catalog(tables, existing)
    if judged is VersionVerdict.NEWER_COMPATIBLE:
        _require_compatible(tables, catalog, found)
        return SchemaStatus([], found, judged, catalog)
    changes: list[str] = []
    for model in tables.all():
        name = model._meta.table_name
        changes.extend(_absent(catalog, model))
        if name not in catalog.tables:
            continue
        changes.extend(_widen(name, field) for field in _narrow_columns(catalog, model))
        changes.extend(f"create index {index}"  # the models' own indexes
                       for index in _missing_indexes(catalog, model))
    if INBOX in catalog.tables:
        changes.extend(f"create index {name}" for name in missing_open_indexes(catalog.indexes))
        changes.extend(f"drop index {name} (replaced)"
                       for name in surplus_indexes(catalog.indexes))
    sequence = _sequence_change(db, catalog.tables)
    if sequence is not None:
        changes.append(sequence)
    version = version_change(found, judged)
    return SchemaStatus(changes if version is None else [*changes, version], found, judged,
                        catalog)


def pending_changes(tables: Tables) -> list[str]:
    """What ``upgrade`` would change, one line each; empty when up to date
    (:func:`schema_status`'s, with its errors)."""
    return schema_status(tables).changes


def _require_compatible(tables: Tables, catalog: Catalog, found: Stamp) -> None:
    """A newer kinbox's database that says this code may work on it: what this code needs
    must be there, else :class:`.SchemaIncomplete`, nothing changed. Its tables and
    columns, the unique indexes its writes rely on (a duplicate slug, idempotency key or
    token, or ``seq``, would go through without them) and, on PostgreSQL, a usable inbox
    sequence; and no column it does not know that every insert must fill (NOT NULL, no
    default in the table: its inserts would fail one by one, mid-run). Its other indexes
    are the newer code's business: one it dropped is not built again."""
    missing = [line for model in tables.all() for line in _absent(catalog, model)]
    for model in tables.all():
        name = model._meta.table_name
        if name not in catalog.tables:
            continue
        missing.extend(f"unique index {index}"
                       for index in _missing_indexes(catalog, model, unique_only=True))
        known = {field.column_name for field in model._meta.sorted_fields}
        missing.extend(f"a value for {name}.{column} (required, unknown to this kinbox)"
                       for column, info in catalog.columns[name].items()
                       if column not in known and not info.null and not info.has_default)
    sequence = _sequence_change(tables.db, catalog.tables)
    if sequence is not None:
        missing.append(sequence)
    if missing:
        raise SchemaIncomplete(found.version, SCHEMA_VERSION, found.compatible, missing)


def upgrade(tables: Tables) -> list[str]:
    """Bring the schema up to the models and raise its version number, in one
    transaction; return the changes made (by this call: what another process's upgrade
    made while this one waited for it is not among them). :class:`.SchemaTooNew`,
    nothing changed, for a database a newer kinbox upgraded past this code; nothing to
    do (``[]``) for one it may work on as it is."""
    db = tables.db
    if not pending_changes(tables):
        return []  # nothing to write: no transaction beside a running runtime
    # IMMEDIATE: take the write lock first; a deferred transaction that reads and then
    # writes fails at once (SQLITE_BUSY) when another process wrote in between.
    with db.atomic("IMMEDIATE") if is_sqlite(db) else db.atomic():
        if is_postgres(db):
            # Another process's upgrade (an index built on a large table) may take longer
            # than a connection's lock wait: this one waits it out, then looks again.
            db.execute_sql("SET LOCAL lock_timeout = 0")
            db.execute_sql(SCHEMA_LOCK_SQL)
        status = schema_status(tables)  # under the lock: what is left to do now
        changes, catalog = status.changes, status.catalog
        if not changes:
            return changes
        missing_columns: list[tuple[str, str, pw.Field]] = []
        narrow: list[tuple[str, pw.CharField]] = []
        for model in tables.all():
            name = model._meta.table_name
            if name not in catalog.tables:
                db.create_tables([model], safe=True)
                continue
            missing_columns.extend((name, f.column_name, f)
                                   for f in _missing_fields(catalog, model))
            narrow.extend((name, f) for f in _narrow_columns(catalog, model))
        required = [f"{t}.{c}" for t, c, f in missing_columns
                    if not f.null and f.default is None]
        if required:
            # Every column kinbox adds to a table of its own has a default or takes NULL:
            # a table missing one that has neither is another program's of the same name.
            raise SchemaError(
                f"cannot add the column(s) {', '.join(required[:5])}: required, with no "
                f"default; the table {required[0].split('.')[0]} is not one kinbox made "
                "(another program's of that name?): use a database of kinbox's own")
        if missing_columns:
            migrator = _migrator(db)
            migrate.migrate(*(migrator.add_column(t, c, f) for t, c, f in missing_columns))
        if narrow:
            migrator = _migrator(db)
            migrate.migrate(*(migrator.alter_column_type(t, f.column_name, f)
                              for t, f in narrow))
        for model in tables.all():
            if model._meta.table_name in catalog.tables:  # a new table came with its own
                model._schema.create_indexes(safe=True)  # type: ignore[attr-defined]
        if is_postgres(db):
            _repair_sequence(db)
        create_open_indexes(db)
        write_version(db)  # last, in the same transaction: raised only with all the rest
    return changes


def require_current(tables: Tables) -> None:
    """Raise :class:`SchemaError` unless the schema matches the models and the code's
    version, or is a newer one this code may work on (:class:`.SchemaTooNew` for a newer
    one it may not, :class:`.SchemaIncomplete` for one that lacks what it needs)."""
    changes = pending_changes(tables)
    if changes:
        raise SchemaError(
            f"the database schema is out of date ({first_lines(changes)}); "
            "run `kinbox db upgrade`"
        )
