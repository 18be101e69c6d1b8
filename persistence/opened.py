"""A database opened for a short piece of work: its tables and a running writer.

Commands, benchmarks and test harnesses that write without a runtime open a database,
check or upgrade its schema, start a group-commit writer, and stop it and close the
database afterwards, whatever happens: this is that sequence, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .database import open_database
from .models import Tables, bind_tables
from .schema import upgrade
from .writer import GroupCommitWriter


@contextmanager
def opened(url: str, *, schema: Callable[[Tables], object] = upgrade, must_exist: bool = False,
           read_only: bool = False,
           writer_name: str = "kinbox-writer") -> Iterator[tuple[Tables, GroupCommitWriter]]:
    """The tables of ``url`` and a started writer; ``schema`` prepares the tables first
    (``upgrade`` by default; ``require_current`` to refuse an old schema instead, as a
    ``read_only`` database must: see :func:`open_database`)."""
    db = open_database(url, must_exist=must_exist, read_only=read_only)
    try:
        tables = bind_tables(db)
        schema(tables)
        writer = GroupCommitWriter(db, name=writer_name)
        writer.start()
        try:
            yield tables, writer
        finally:
            writer.stop()
    finally:
        db.close()
