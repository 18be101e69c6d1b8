"""Exclusive ownership of an embedded SQLite database by one runtime.

The embedded default is one runtime process per database file. Holding an
OS lock on ``<file>.lock`` (named after the file itself, symlinks resolved)
for the runtime's life makes that a checked fact rather than a hope, and it
is what lets a starting runtime take over every lease at once: whoever held
them is certainly gone (a crash releases the OS lock). A file with a second name by
a hard link never gets here: :func:`.database.open_database` refuses it, since
that name would take a lock (and SQLite a WAL) of its own. PostgreSQL deployments
share a database and rely on lease expiry.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import peewee as pw

from . import forks
from .errors import DatabaseInUse, DatabaseOpenError


class ExclusiveLock:
    """An advisory lock next to a SQLite file; released on ``release`` or process death."""

    def __init__(self, db: pw.SqliteDatabase) -> None:
        self.database = str(db.database)
        """The file as the URL names it (what :class:`DatabaseInUse` reports)."""
        # Named after the file itself, symlinks resolved: a runtime reaching the file
        # through a link to it takes the same lock as one naming it, not one of its own.
        self.path = Path(os.path.realpath(self.database) + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`DatabaseInUse` at once (never waits); a lock
        file that cannot be opened is a :class:`DatabaseOpenError` naming it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a folder in its place, no permission, a read-only disk
            raise DatabaseOpenError(self.database, f"cannot open its lock file "
                                    f"{str(self.path)!r}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DatabaseInUse(self.database) from None
        self._fd = fd
        forks.watch(self)

    def drop_in_forked_child(self) -> None:
        """A forked child closes its copy of the lock's file (the lock stays the parent's:
        it goes with the last descriptor of it, so the child's copy outlived a killed
        parent and the database stayed "in use")."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def release(self) -> None:
        """Give the lock up (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
