"""The root of kinbox's exception tree, and the errors of the persistence layer.

:class:`KinboxError` is defined here, in the bottom layer, so that every
error kinbox raises (``kinbox.persistence`` and ``kinbox.actors`` alike)
shares one root; ``kinbox.actors`` re-exports it and draws the whole tree.
Every error of this layer derives from :class:`PersistenceError`, so a
caller can also catch the layer as a whole. Driver errors are wrapped
(``raise ... from exc``; from None where PostgreSQL's text was cut, see
:class:`DatabaseFailed`) and never leak as ``sqlite3``/``psycopg2`` types.
Decide on the types and their attributes, never on the message text::

    KinboxError
    └── PersistenceError
        ├── DatabaseOpenError      .url (password masked), .reason: cannot be opened
        │   └── DatabaseMissing    a read-only command found no database there
        ├── SchemaError            the schema is missing, older than this code, or newer
        │   ├── SchemaTooNew       .found, .known, .compatible: a newer kinbox upgraded the
        │   │                      database past what this code may work on
        │   └── SchemaIncomplete   .found, .known, .compatible, .missing: a newer kinbox's
        │                          database this code may work on lacks what it needs
        ├── IdempotencyConflict    .message_id was reused for another message
        ├── IllegalTransition      .message_id, .current, .event: the state machine forbids it
        ├── LeaseLost              .message_id, .owner: acted on a row it no longer leases
        ├── RowNotFound            .kind, .key, .by: an inbox row, session, task... does not exist
        ├── DuplicateError         .kind, .field, .value: a unique value is already taken
        ├── InvalidArgument        .field, .value: a store was called with a value outside
        │                          its contract (a page's limit of 0, a negative offset);
        │                          also a ValueError
        ├── DatabaseInUse          .path: another runtime process owns this SQLite file
        ├── LifeLockLost           .owner: the connection holding a runtime's life lock died
        ├── DatabaseFailed         .kind, .sqlstate, .detail, .retryable: a statement failed in the
        │                          database or its driver (a lost connection, a lock timeout,
        │                          a full disk, a value refused, a deadlock); also the peewee
        │                          error it stands for
        └── WriterClosed           the group-commit writer was stopped
"""

from __future__ import annotations

from .redaction import redact_text, redact_url


class KinboxError(Exception):
    """The root of every error kinbox raises (re-exported by ``kinbox.actors``)."""


class PersistenceError(KinboxError):
    """Base class of every error raised by ``kinbox.persistence``."""


class DatabaseOpenError(PersistenceError):
    """The database URL is malformed or the database cannot be opened."""

    def __init__(self, url: str, reason: str) -> None:
        reason = redact_text(reason, url)  # a driver may quote what it could not parse
        super().__init__(f"cannot open database {redact_url(url)!r}: {reason}")
        self.url = redact_url(url)
        self.reason = reason


class DatabaseMissing(DatabaseOpenError):
    """A command that only reads found no database at the URL (and created none)."""


class SchemaError(PersistenceError):
    """The schema is missing tables or columns; run ``kinbox db upgrade``."""


class SchemaTooNew(SchemaError):
    """The database's schema version ``found`` is newer than the ``known`` one of this code
    (a newer kinbox upgraded it) and needs code of at least version ``compatible``: refused,
    nothing changed. Not for ``kinbox db upgrade``: this code cannot take a schema back."""

    def __init__(self, found: int, known: int, compatible: int) -> None:
        super().__init__(
            f"the database's schema is version {found}, newer than this kinbox knows "
            f"(version {known}), and needs a kinbox of schema version {compatible} or "
            "later: a newer kinbox upgraded it. Run that kinbox version or a later one on "
            "it (upgrade this installation); kinbox never downgrades a schema, so go back "
            "only to a backup taken before that upgrade")
        self.found = found
        self.known = known
        self.compatible = compatible


def first_lines(lines: list[str], most: int = 5) -> str:
    """Up to ``most`` of ``lines``, joined for one line of an error ("; ..." when cut)."""
    return "; ".join(lines[:most]) + ("; ..." if len(lines) > most else "")


class SchemaIncomplete(SchemaError):
    """A database a newer kinbox upgraded says this code (version ``known``) may work on it
    (its ``compatible`` number), but lacks what this code needs: ``missing``, one line each
    (a table, a column, a unique index, the inbox sequence; a column this code does not
    know that every insert would have to fill). Refused, nothing changed."""

    def __init__(self, found: int, known: int, compatible: int, missing: list[str]) -> None:
        shown = first_lines(missing)
        super().__init__(
            f"the database's schema is version {found} and says a kinbox of version "
            f"{compatible} or later may work on it, but it lacks what this kinbox (version "
            f"{known}) needs ({shown}): run the kinbox that upgraded it")
        self.found = found
        self.known = known
        self.compatible = compatible
        self.missing = missing


class IdempotencyConflict(PersistenceError):
    """A message id already exists as another message (another target, kind, content,
    sender or payload: ``inbox_core.enqueue_decision``)."""

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"message id {message_id!r} already exists with different content (its "
            "target, kind, text, sender or payload differ); "
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
    """The requested row does not exist; ``kind`` names what was looked for, ``key`` the
    value of its ``by`` column (the id unless told)."""

    def __init__(self, kind: str, key: str, detail: str = "", *, by: str = "id") -> None:
        super().__init__(f"no {kind} with {by} {key!r}{detail}")
        self.kind = kind
        self.key = key
        self.by = by


class DuplicateError(PersistenceError):
    """A value that must be unique is taken: ``field`` of a ``kind`` (project slug, session id)."""

    def __init__(self, kind: str, field: str, value: str) -> None:
        super().__init__(f"a {kind} with {field} {value!r} already exists")
        self.kind = kind
        self.field = field
        self.value = value


class InvalidArgument(PersistenceError, ValueError):
    """A store's public method was given ``value`` for its argument ``field`` outside the
    method's contract (:mod:`.paging`'s bounds: a ``limit`` of 0 or -1, a ``True``, a
    ``"3"``): refused before any SQL runs, so that no such value reaches a database that
    would read it as something else (SQLite takes a negative LIMIT as no limit at all)."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        if isinstance(value, int) and value.bit_length() > 128:
            # Python refuses to print an int of over 4,300 digits (and any long one says
            # nothing a reader could check): its size stands for it.
            shown = f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
        else:
            shown = repr(value)
        super().__init__(f"{field} must be {expected}, not "
                         f"{shown if len(shown) <= 40 else shown[:37] + '...'}")
        self.field = field
        self.value = value


class DatabaseInUse(PersistenceError):
    """Another runtime already owns this embedded database file (``path``)."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"database {path!r} is in use by another kinbox runtime; stop it first, "
            "or use PostgreSQL to share one database between processes")
        self.path = path


class LifeLockLost(PersistenceError):
    """The connection that held runtime ``owner``'s life lock is gone (the server restarted,
    failed over or ended the session): to every other runtime it is dead, and they take
    its rows over."""

    def __init__(self, owner: str, reason: str) -> None:
        super().__init__(f"runtime {owner} lost the database connection that holds its life "
                         f"lock ({reason}); other runtimes take its rows over")
        self.owner = owner


class DatabaseFailed(PersistenceError):
    """A statement failed in the database or in its driver. ``kind`` is the DB-API class
    of the failure: ``OperationalError`` (a lost connection, a lock wait that timed out,
    a full disk), ``InterfaceError`` (the connection is closed), ``IntegrityError``,
    ``DataError``, ``ProgrammingError``... Raised by the databases kinbox opens in place of
    peewee's error, and a subclass of it too (see :mod:`.driver_errors`). ``sqlstate``
    is the SQLSTATE code PostgreSQL gave (``40P01`` a deadlock, ``57P01`` the server
    shutting down...), None on SQLite. ``detail`` is the driver's whole text where the
    error's own is cut to PostgreSQL's primary message: its ``DETAIL`` quotes the values of
    a refused row (a message body among them), which must reach no log above DEBUG.
    ``retryable``: PostgreSQL ended the statement to resolve a conflict with another
    transaction (:data:`CONFLICT_SQLSTATES`); nothing of it was written, and the same work
    in a new transaction may well succeed (the writer runs it again by itself)."""

    kind = "DatabaseError"
    sqlstate: str | None = None
    detail: str | None = None

    @property
    def retryable(self) -> bool:
        """A deadlock or a serialization failure: the same work may run again."""
        return self.sqlstate in CONFLICT_SQLSTATES


CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})
"""PostgreSQL's answers to two transactions in each other's way: ``40P01`` a deadlock (it
aborts one of the statements waiting for each other's locks), ``40001`` a serialization
failure (under ``REPEATABLE READ`` or ``SERIALIZABLE``). Either undoes the statement (or
the transaction, at its commit) whole, so running the work again in a new transaction is
safe; by SQLSTATE, never by message text."""


class WriterClosed(PersistenceError):
    """The group-commit writer is stopped and accepts no more work."""


class WriteTimeout(PersistenceError, TimeoutError):
    """A write's commit did not come within the time its caller waits. ``withdrawn``: it
    was still queued, and it never runs (a retry cannot make it twice); False: its batch
    was already running, so it may yet commit."""

    def __init__(self, timeout: float | None, withdrawn: bool) -> None:
        super().__init__(
            f"no answer from the writer within {timeout} s; " + (
                "the write was withdrawn: nothing of it is written" if withdrawn else
                "its batch was already running (the database is slow or blocked): it may "
                "yet commit"))
        self.timeout = timeout
        self.withdrawn = withdrawn
