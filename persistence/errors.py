"""Errors raised by the persistence layer.

Every error the layer raises derives from :class:`PersistenceError`, so a
caller can catch the layer as a whole. Driver errors are wrapped
(``raise ... from exc``) and never leak as ``sqlite3``/``psycopg2`` types::

    PersistenceError
    ├── DatabaseOpenError      the URL is malformed or the database cannot be opened
    ├── SchemaError            the schema is missing or older than this code
    ├── IdempotencyConflict    a message id was reused with different content
    ├── IllegalTransition      an inbox state change the state machine forbids
    ├── LeaseLost              a worker acted on a row it no longer leases (fencing)
    ├── RowNotFound            an inbox row, session or project does not exist
    ├── DuplicateError         a project slug or session id is already taken
    ├── DatabaseInUse          another runtime process owns this SQLite file
    └── WriterClosed           the group-commit writer was stopped
"""

from __future__ import annotations


class PersistenceError(Exception):
    """Base class of every error raised by ``kinbox.persistence``."""


class DatabaseOpenError(PersistenceError):
    """The database URL is malformed or the database cannot be opened."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot open database {redact_url(url)!r}: {reason}")
        self.url = redact_url(url)
        self.reason = reason


class SchemaError(PersistenceError):
    """The schema is missing tables or columns; run ``kinbox db upgrade``."""


class IdempotencyConflict(PersistenceError):
    """A message id already exists with different content."""

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"message id {message_id!r} already exists with different content; "
            "use a new id for a new message"
        )
        self.message_id = message_id


class IllegalTransition(PersistenceError):
    """The inbox state machine does not allow this change."""

    def __init__(self, message_id: str, current: str, event: str) -> None:
        super().__init__(f"message {message_id!r}: cannot {event} a row in state {current!r}")
        self.message_id = message_id
        self.current = current
        self.event = event


class LeaseLost(PersistenceError):
    """A worker acked or retried a row whose lease it no longer holds."""

    def __init__(self, message_id: str, owner: str) -> None:
        super().__init__(f"message {message_id!r}: worker {owner!r} no longer holds its lease")
        self.message_id = message_id
        self.owner = owner


class RowNotFound(PersistenceError):
    """The requested row does not exist."""


class DuplicateError(PersistenceError):
    """A project slug or session id that must be unique is already taken."""


class DatabaseInUse(PersistenceError):
    """Another runtime already owns this embedded database file."""


class WriterClosed(PersistenceError):
    """The group-commit writer is stopped and accepts no more work."""


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for errors and logs)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url
