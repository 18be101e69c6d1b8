"""Which runtimes are still alive, on PostgreSQL: a lock each holds for its whole life.

Leases alone cannot tell a dead owner from a slow one, so a restart after a
kill used to wait until the dead runtime's leases ran out (30 s). Here each
delivering runtime takes a session-level advisory lock named for its owner
id, on a connection of its own that it keeps open until it stops. The lock
lives exactly as long as that connection: when the process dies (SIGKILL
included) the kernel closes its socket, the server ends the session and
the lock is free. So "can I take owner X's lock?" answers "is X gone?",
and the rows X leased can be taken over at once, while a live owner, however
slow, keeps its lock and its rows.

The lock key is (``LOCK_CLASS``, ``hashtext(owner)``), 32 bits of hash. Two
owners whose keys collide cannot both hold their locks: the second runtime's
start fails (after :data:`LOCK_WAIT`) rather than wait for the first to die,
and a new start draws a new owner id. So an owner whose key this runtime holds
is one that died before it started; a dead owner whose key a live one holds
looks alive, and its rows wait for their leases, as they did before life locks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

import peewee as pw

from . import forks
from .driver_errors import sqlstate_of
from .errors import LifeLockLost, PersistenceError

log = logging.getLogger("kinbox.liveness")

LOCK_CLASS = 0x6B62
"""The first key of kinbox's advisory locks ("kb"), apart from other applications' locks."""

LOCK_WAIT = "5s"
"""How long taking the life lock waits (``lock_timeout``): another runtime's check holds an
owner's lock for an instant; only a live runtime whose owner id collides holds it longer,
and waiting for that one meant waiting, at start, for as long as it lived."""

CHECK_WAIT = "1s"
"""How long a statement of the check on other owners (:meth:`OwnerLiveness.gone`) may take
(``statement_timeout``, lock waits included), set once the life lock is held. The check
runs on the runtime's ticker, which renews leases too: with no bound, a stalled server or
a lock wait (another session holding a catalog the check reads) stalled the ticker with
it. A check cut short proves no one gone; the next one, half a second later, asks again."""

RELEASE_WAIT = 2.0
"""Seconds a stop waits for a check under way on the lock's connection before it leaves
the connection to the process (a hung server never answers the check)."""

CUT_SHORT = frozenset({"57014", "55P03"})
"""The SQLSTATEs of a statement cut short by its wait: ``statement_timeout``
(query_canceled) and ``lock_timeout`` (lock_not_available)."""


LIFE_KEEPALIVES = (("tcp_keepalives_idle", 10), ("tcp_keepalives_interval", 5),
                   ("tcp_keepalives_count", 4))
"""The server's TCP keepalives on a life lock's session: a host that died without closing
its socket (power loss, a cut network) is given up after about 30 s, a default lease,
rather than the 2 h 11 min of the usual defaults, during which the dead runtime looked
alive and its direct-turn marks (they have no lease) held their sessions. A live runtime
asks on its lock's connection twice a second, so the probes start only when it is silent.
Ignored on a Unix socket; a server that cannot set one keeps its default."""


class OwnerLiveness:
    """One runtime's life lock on a PostgreSQL database, and the check on other owners."""

    def __init__(self, db: pw.PostgresqlDatabase, owner: str) -> None:
        self.db = db
        self.owner = owner
        self._conn: Any = None
        self._lock = threading.Lock()

    def hold(self) -> None:
        """Take this runtime's life lock on a connection of its own (kept until release)."""
        conn = None
        try:
            conn = self.db._connect()
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"SET lock_timeout = '{LOCK_WAIT}'")
                for name, seconds in LIFE_KEEPALIVES:
                    try:
                        cur.execute(f"SET {name} = {seconds}")
                    except Exception as exc:  # a platform without it (autocommit: no harm)
                        log.debug("the life lock's session keeps its %s: %s", name, exc)
                cur.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, self.owner))
                cur.execute(f"SET statement_timeout = '{CHECK_WAIT}'")  # for gone(), from here
        except Exception as exc:
            if conn is not None:
                conn.close()
            raise PersistenceError(f"cannot take the runtime's life lock (a live runtime "
                                   f"whose owner id shares its key holds it, or the "
                                   f"database failed): {exc}") from exc
        self._conn = conn
        forks.watch(self)

    def drop_in_forked_child(self) -> None:
        """A forked child lets go of its copy of the lock's connection without a word to
        the server (closing it would end the parent's session, and its lock): the socket
        is then the parent's alone, and goes, with the lock, when the parent dies."""
        conn, self._conn = self._conn, None  # never used here again
        self._lock = threading.Lock()  # another thread of the parent may have held it
        if conn is not None and not conn.closed:
            forks.blank(conn.fileno())

    def still_held(self) -> None:
        """Raise :class:`LifeLockLost` when this runtime's own lock went with its
        connection; a check cut short by its wait proves nothing (the lock counts as held).
        One round trip on the lock's own connection: it needs no other connection to the
        database, and a server that takes none (a restart under way) still gives this
        answer at once."""
        self.gone(())

    def gone(self, owners: Iterable[str]) -> set[str]:
        """The owners among ``owners`` whose runtime no longer holds its life lock;
        :class:`LifeLockLost` when this runtime's own lock went with its connection.

        Each statement waits at most :data:`CHECK_WAIT`: a check cut short returns the
        owners it proved gone so far, and proves nothing of the rest (a live owner is
        never taken for a gone one)."""
        found: set[str] = set()
        with self._lock:
            if self._conn is None:
                return found
            try:
                with self._conn.cursor() as cur:
                    cur.execute("SELECT 1")  # the connection, and so the lock, still there
                    for owner in owners:
                        if owner == self.owner:
                            continue
                        cur.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                                    (LOCK_CLASS, owner))
                        if cur.fetchone()[0]:
                            found.add(owner)  # its lock was free: gone, whatever comes next
                            cur.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))",
                                        (LOCK_CLASS, owner))
            except Exception as exc:
                if self._conn.closed:
                    raise LifeLockLost(self.owner, type(exc).__name__) from exc
                if sqlstate_of(exc) not in CUT_SHORT:
                    raise
                log.info("the check for runtimes that are gone waited past %s (%s); the "
                         "owners it did not reach count as alive", CHECK_WAIT,
                         type(exc).__name__)
        return found

    def release(self) -> None:
        """Give the lock up by closing its connection (as the process's death would). A
        check under way on it ends first; one the server never answers (it hung) is
        waited for at most :data:`RELEASE_WAIT`: the stop must not hang with it (the
        lock then goes with the connection's end, or the process's)."""
        if not self._lock.acquire(timeout=RELEASE_WAIT):
            log.warning("the life lock's connection waits on a statement the server has not "
                        "answered in %.0f s; it is left to close with the process",
                        RELEASE_WAIT)
            return
        try:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None
        finally:
            self._lock.release()


def live_runtimes(db: pw.PostgresqlDatabase) -> int:
    """How many delivering runtimes hold their life lock on ``db``'s database now (a check
    that another runtime runs at this instant holds one more, for as long as it takes)."""
    row = db.execute_sql(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
        "AND objsubid = 2 AND granted AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
        (LOCK_CLASS,)).fetchone()
    return int(row[0])
