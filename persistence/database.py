"""Opening a database from a URL, with the durability settings kinbox relies on.

``open_database`` is the one way in: ``sqlite:///path`` for the embedded
default and ``postgresql://...`` for several processes sharing one database.
Both are kinbox's subclasses of peewee's databases, whose statements fail as
kinbox errors (:mod:`.driver_errors`); the PostgreSQL settings are read from
the URL by playhouse's ``db_url``. SQLite connections get WAL, ``synchronous=FULL``
(an acknowledged message survives power loss), a busy timeout and foreign
keys on *every* connection, since peewee opens one connection per thread.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

import peewee
from playhouse import db_url

from .driver_errors import SqliteDatabase, sqlite_uri
from .errors import DatabaseMissing, DatabaseOpenError
from .pg_database import PostgresDatabase
from .redaction import redact_text

Synchronous = Literal["FULL", "NORMAL"]

BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite connection waits for a lock before failing."""


def default_data_dir() -> Path:
    """The data directory: ``$KINBOX_HOME`` or ``~/.local/share/kinbox``. A '~' in
    ``$KINBOX_HOME`` (an env file's, which no shell expanded) is the home folder, as it is
    in the SQLite path made from it: a server database's folder, and its device key, are
    not put under a folder named '~' wherever a command runs."""
    home = os.environ.get("KINBOX_HOME")
    if not home:
        return Path.home() / ".local" / "share" / "kinbox"
    try:
        return Path(home).expanduser()
    except RuntimeError:  # '~someone' with no home folder here: the open names the path
        return Path(home)


def default_url() -> str:
    """The database URL used when none is given: ``$KINBOX_DB`` or the data-dir file."""
    return os.environ.get("KINBOX_DB") or f"sqlite:///{default_data_dir() / 'kinbox.db'}"


SQLITE_PAGE_SIZE = 1024
"""The page size of a SQLite file kinbox creates (SQLite's default is 4,096).

Each commit writes every page it changed, whole, to the WAL. A group commit
of the throughput workload changes about one page per session it touches:
a session's place in the transcript's ``(session_id, id)`` index and a
target's in the open rows' ``(target_chat_id, seq)`` index are spread over
the file, while the rows themselves go to the right edge. Smaller pages
make those scattered writes four times smaller, and the rows are small
(a larger one spills into overflow pages, which hold the same bytes either
way). Measured interleaved on this 2-core machine (``bench throughput``
workload, 6 runs each): 3,699 against 3,389 msgs/s at 100 sessions and
2,889 against 2,646 at 1,000, the writer's CPU per message 15% lower.
It only applies to a new file: an existing one keeps the page size it was
made with (SQLite cannot change it in WAL mode).

Two costs, both small here: the WAL's automatic checkpoint counts pages (1,000),
so it runs about every MiB of WAL instead of every 4 MiB (measured with 1 KiB
pages: a limit of 4,000 pages, or no checkpoint at all during the run, made no
difference); and an index key longer than about 230 bytes (a caller's message id
near its 256-character limit) spills into an overflow page."""


def sqlite_pragmas(synchronous: Synchronous = "FULL") -> dict[str, object]:
    """The pragmas applied to every SQLite connection, in order: the page size comes
    first, before WAL mode, since it can only take effect on a file that has none yet."""
    return {
        "page_size": SQLITE_PAGE_SIZE,
        "journal_mode": "wal",
        "synchronous": synchronous,
        "busy_timeout": BUSY_TIMEOUT_MS,
        "foreign_keys": 1,
    }


READ_ONLY_PRAGMAS: dict[str, object] = {"busy_timeout": BUSY_TIMEOUT_MS, "query_only": 1}
"""The pragmas of a SQLite connection opened ``read_only``: none that changes the file
(its journal mode, page size and synchronous setting stay the runtime's business)."""


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL, or None for any other URL.

    :class:`DatabaseOpenError` for a path that ends in ``/``: it names a folder, and a
    path drops that slash, so a runtime made a database file where a folder was meant;
    and for a ``~user`` this machine has no home folder for."""
    name = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if name in ("", ":memory:"):
        return None
    if name.endswith(("/", os.sep)):
        raise DatabaseOpenError(url, "the path ends in '/', a folder: name the database "
                                "file in it (sqlite:///path/to/kinbox.db)")
    try:
        return Path(name).expanduser()
    except RuntimeError:  # '~someone' for a user this machine has not, or no home at all
        raise DatabaseOpenError(url, f"cannot find the home folder {name.split('/')[0]!r} "
                                "names; give the path in full") from None


MIN_SQLITE = (3, 35)
"""The oldest SQLite the journal runs on: its statements use ``UPDATE ... RETURNING``
(3.35) and ``UPDATE ... FROM`` (3.33)."""


SQLITE_CACHED_STATEMENTS = 1024
"""Prepared statements the SQLite driver keeps per connection (its default is 128). The
writer's set-wise statements have a text per batch size (a VALUES row per item): 166 texts
in a 10,000-message run, so with 128 some were prepared again each batch (interleaved:
3,795 against 3,551 msgs/s, medians of 5)."""


def open_database(url: str, *, synchronous: Synchronous = "FULL",
                  must_exist: bool = False, read_only: bool = False) -> peewee.Database:
    """Open and check the database at ``url``; raise :class:`DatabaseOpenError` if it fails.

    ``synchronous`` only applies to SQLite; ``NORMAL`` trades the last
    transactions before a power loss for speed (benchmarks compare both).
    ``must_exist`` is for commands that only read: a missing SQLite file is
    :class:`DatabaseMissing` and no file is created. ``read_only`` (which implies it) is
    for commands that write nothing: a SQLite file is opened read-only, with no pragma
    that would change it, and read in a folder or from a file this process may not write.
    """
    if synchronous not in ("FULL", "NORMAL"):
        raise DatabaseOpenError(url, f"synchronous must be FULL or NORMAL, not {synchronous!r}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise DatabaseOpenError(
                url, f"SQLite {sqlite3.sqlite_version} is too old: the journal's statements "
                f"need {'.'.join(map(str, MIN_SQLITE))} or newer (UPDATE ... RETURNING); "
                "use a Python built with a newer SQLite, or PostgreSQL")
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if "?" in path or "#" in path:
            raise DatabaseOpenError(
                url, "a SQLite URL takes no query parameters or fragment: the rest would "
                "name another, empty file (kinbox sets its own pragmas)")
        if not path or path == ":memory:":
            raise DatabaseOpenError(
                url, "give a file path (sqlite:///path/to/file.db); in-memory databases "
                "are private to one thread and cannot hold a journal"
            )
        # The file sqlite_path names ('~' is the home folder), for every check and the open.
        path = str(sqlite_path(url))
        if Path(path).is_dir():  # SQLite says only 'unable to open database file'
            raise DatabaseOpenError(url, f"{path!r} is a directory, not a database file")
        if Path(path).exists() and not Path(path).is_file():
            # /dev/null reads as an empty database: the first write failed, a bare 'disk
            # I/O error', and left a '-journal' file beside the device (a pipe: that error).
            raise DatabaseOpenError(url, f"{path!r} is not a regular file (a device, a pipe "
                                    "or a socket), not a database file")
        if (must_exist or read_only) and not Path(path).is_file():
            raise DatabaseMissing(url, f"there is no database file at {path!r}; a runtime "
                                  "creates it on start, or run `kinbox db upgrade`")
        names = os.stat(path).st_nlink if Path(path).is_file() else 1
        if names > 1:
            # SQLite keeps a WAL per name, and the owner lock is named after the file too:
            # through a second name a runtime would neither see what the other committed
            # nor be kept from delivering beside it (symlinks are fine: both resolve them).
            raise DatabaseOpenError(
                url, f"{path!r} has {names} names (hard links): SQLite cannot share a "
                "database between names; remove the other names, or copy the file (with "
                "no runtime on it) if one was meant as a copy")
        parent = Path(path).parent
        if not parent.is_dir():
            raise DatabaseOpenError(url, f"directory {str(parent)!r} does not exist")
        options: dict[str, object] = {"pragmas": sqlite_pragmas(synchronous),
                                      "cached_statements": SQLITE_CACHED_STATEMENTS}
    elif scheme in ("postgresql", "postgres"):
        try:
            import psycopg2  # noqa: F401  (playhouse's message does not say how to get it)
        except ImportError:
            raise DatabaseOpenError(url, "the PostgreSQL driver is not installed; install "
                                    "the postgres extra (in a clone: pip install -e "
                                    "'.[postgres]')") from None
        options = {}
    else:
        raise DatabaseOpenError(
            url, "unsupported scheme; use sqlite:///path/to/file.db or postgresql://user@host/db"
        )
    if scheme == "sqlite" and read_only:
        return _sqlite_read_only(url, path)
    try:
        if scheme == "sqlite":
            _create_private(path)
        # PostgreSQL: kinbox's own class (see pg_database), from the URL as db_url reads it.
        db = (SqliteDatabase(path, **options) if scheme == "sqlite"
              else PostgresDatabase(**_pg_settings(url)))
        db.connect(reuse_if_open=True)
        db.execute_sql("SELECT 1")
        db.close()
    except Exception as exc:  # driver errors vary by backend; all mean "cannot open"
        said = str(exc).strip() or type(exc).__name__
        if redact_text(said, url) != said:  # it quotes a password: masked, and not chained
            raise DatabaseOpenError(url, said) from None
        raise DatabaseOpenError(url, said) from exc
    return db


def _create_private(path: str) -> None:
    """Create a missing SQLite file empty (SQLite's new database) with mode 0600: it holds
    every transcript, and SQLite would create it with the umask's mode (0644 under 022),
    readable by every user of the machine. SQLite gives the WAL and shared-memory files
    the database file's mode, so they stay private too. A file that exists keeps its mode.
    A symlink to a file not made yet is followed (``O_EXCL`` alone would refuse it, and
    SQLite would then make the file it names with the umask's mode)."""
    try:
        os.close(os.open(os.path.realpath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:  # there already, or another process created it first
        pass


def _sqlite_read_only(url: str, path: str) -> peewee.Database:
    """The SQLite file at ``path`` opened read-only (``mode=ro``). In a folder it may not
    write, SQLite cannot make the WAL's index beside a file no runtime has open (one that
    has it open keeps its ``-wal`` and ``-shm`` there): with no ``-wal`` file there is no
    write the main file lacks, so it is read as ``immutable``, taking no locks."""
    uri = sqlite_uri(path, "ro")
    tries = [uri]
    if not Path(path + "-wal").exists():
        tries.append(f"{uri}&immutable=1")
    failure: Exception | None = None
    for at in tries:
        db = SqliteDatabase(at, uri=True, pragmas=READ_ONLY_PRAGMAS,
                            cached_statements=SQLITE_CACHED_STATEMENTS)
        try:
            db.connect(reuse_if_open=True)
            db.execute_sql("SELECT COUNT(*) FROM sqlite_master")  # reads the file: opens it
            return db
        except Exception as exc:  # driver errors vary; all mean "cannot open"
            failure = exc
        finally:
            db.close()
    raise DatabaseOpenError(url, str(failure).strip() or type(failure).__name__) from failure


def _pg_settings(url: str) -> dict[str, object]:
    try:
        settings: dict[str, object] = db_url.parse(url, unquote_password=True,
                                                   unquote_user=True)
    except ValueError:
        # A '/', '?' or '#' in the password ends the host part there, so what reads as the
        # port is the password's first part: the parser's message quotes it.
        raise ValueError(
            "the URL's host and port cannot be read (the port is not a number from 0 to "
            "65535, or a '[' is not closed); write a '/', '?', '#' or '@' in the user "
            "name or password percent-encoded: %2F, %3F, %23, %40") from None
    # As libpq reads a URL: the user, password and database name percent-decoded (a URL
    # writes an '@', ':', '/' or '%' in them as %40, %3A, %2F, %25); the query's values
    # already are. playhouse leaves them as written, so they failed to authenticate.
    if isinstance(settings.get("database"), str):
        settings["database"] = unquote(str(settings["database"]))
    if not settings.get("database"):
        raise ValueError("the URL names no database (postgresql://user@host/dbname)")
    for name, value in PG_CONNECTION_DEFAULTS.items():  # the URL's own win
        settings.setdefault(name, value)
    if _libpq_version() >= 120000:  # older ones refuse the connection for a name unknown
        settings.setdefault("tcp_user_timeout", TCP_USER_TIMEOUT_MS)
    return settings


def _libpq_version() -> int:
    """The libpq the driver runs with (a driver built from source loads the system's,
    which may be older than the one it was compiled against)."""
    try:
        from psycopg2.extensions import libpq_version
    except ImportError:
        return 0
    return int(libpq_version())


PG_CONNECTION_DEFAULTS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30,
                          "keepalives_interval": 10, "keepalives_count": 3}
"""libpq settings of every connection kinbox opens, unless its URL gives them: a server
that cannot be reached fails a connect in 10 s, and a connection that died without a word
(a server gone, a firewall's dropped state) is found dead within about a minute instead of
the kernel's two hours, so the life lock's and the listener's connections, which wait on
their socket, do not hang a thread that long."""


TCP_USER_TIMEOUT_MS = 60_000
"""How long, in milliseconds, a connection's sent data may go unacknowledged before the
connection counts as dead (libpq 12 and newer; unless its URL says otherwise): keepalives
probe an idle connection only, and a statement sent to a server that vanished (a failover,
a host gone without a reset) was retransmitted for about 15 minutes, holding its thread
(the ticker's: lease renewals, the gone check) all that time."""


PG_PORT = 5432
"""The port libpq connects to when neither the URL nor ``$PGPORT`` gives one."""


def pg_default_port() -> int:
    """The port libpq connects to when a URL gives none: ``$PGPORT``, else :data:`PG_PORT`."""
    return int(os.environ.get("PGPORT") or PG_PORT)


def pg_address(url: str) -> tuple[str, int, str]:
    """The server and database a PostgreSQL URL names, as libpq reads it, whichever way it
    is written: the host (a ``host`` parameter's, else ``$PGHOST``'s, else '' for the local
    socket), the port (:func:`pg_default_port` when it gives none) and the database name
    decoded. ``ValueError`` when it names no database or its port is not a number."""
    settings = _pg_settings(url)
    host = str(settings.get("host") or os.environ.get("PGHOST", ""))
    port = int(settings.get("port") or pg_default_port())
    return host, port, str(settings["database"])


def is_sqlite(db: peewee.Database) -> bool:
    """True when ``db`` is a SQLite database."""
    return isinstance(db, peewee.SqliteDatabase)


def is_postgres(db: peewee.Database) -> bool:
    """True when ``db`` is a PostgreSQL database."""
    return isinstance(db, peewee.PostgresqlDatabase)
