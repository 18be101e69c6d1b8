"""Every thread's connection to one database, so that one call closes them all.

peewee keeps a connection per thread (its ``_state`` is a ``threading.local``), and
``close()`` closes the calling thread's alone. A runtime is started on one thread and may
be stopped on another (a signal handler's, a web server's shutdown hook): kinbox's own
threads close their connections as they end, but the starting thread's, and those of
threads that called the runtime and live on, stayed open after the stop, a server
connection or a set of the SQLite file's handles each, for as long as the thread lived.

:class:`ThreadConnections` notes each connection a thread opens, in a small holder kept
in that thread's state and only weakly here: a thread that ends frees its holder and its
connection as it always did. :meth:`ThreadConnections.close_all` closes every one still
open, from any thread; a thread whose connection was closed so connects again at its next
statement, as after a ``close()`` of its own. SQLite connections are therefore opened with
``check_same_thread=False`` (each thread still uses its own alone; only the close may
come from another).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import peewee as pw

log = logging.getLogger("kinbox.database")

CLOSE_WAIT = 2.0
"""Seconds :meth:`ThreadConnections.close_all` waits for other threads' connections to
close. The driver closes a connection a thread is using when its statement ends: on a
server that stopped answering (hung, paused), never, and the runtime's stop that closed
them held the process for good."""


class _Held:
    """One thread's open connection; ``closed`` once another thread closed it."""

    __slots__ = ("__weakref__", "closed", "conn")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.closed = False


class ThreadConnections:
    """Mixin for a peewee ``Database`` (listed before it): every thread's connection noted,
    and :meth:`close_all`."""

    _state: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._held: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._held_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def connect(self, reuse_if_open: bool = False) -> bool:
        """peewee's ``connect``, noting the thread's new connection."""
        opened: bool = super().connect(reuse_if_open)  # type: ignore[misc]
        if opened:
            held = self._state.held = _Held(self._state.conn)
            with self._held_lock:
                self._held.add(held)
        return opened

    def _close(self, conn: Any) -> None:
        held = getattr(self._state, "held", None)
        if held is not None and held.conn is conn:
            self._state.held = None
            with self._held_lock:
                self._held.discard(held)
        super()._close(conn)  # type: ignore[misc]

    def is_closed(self) -> bool:
        """peewee's answer, and also True (the thread's state reset) for a connection
        :meth:`close_all` closed from another thread, outside a transaction: the next
        statement connects again. Inside one the state stays, for the transaction to fail
        and end as it must."""
        # Asked before every statement (peewee's cursor()): one read of the thread's state,
        # and peewee's own answer (its ``_state.closed``) without a second call.
        state = self._state
        held = getattr(state, "held", None)
        if held is not None and held.closed and not state.transactions:
            state.reset()
            state.held = None
            return True
        return bool(state.closed)

    def close_all(self) -> int:
        """Close the calling thread's connection and every other thread's still open; how
        many. For when every user of the database is done (a runtime's stop): a thread
        still using its connection would see it closed under it. Other threads'
        connections are given :data:`CLOSE_WAIT` seconds to close, no more."""
        closed = 0
        if not self.is_closed() and not self._state.transactions:
            self.close()  # type: ignore[attr-defined]
            closed += 1
        with self._held_lock:
            others = [held for held in self._held if not held.closed]
            self._held.clear()
        if not others:
            return closed
        for held in others:
            held.closed = True
        done: list[_Held] = []
        closer = threading.Thread(target=_close_held, args=(others, done), daemon=True,
                                  name="kinbox-close")
        closer.start()
        closer.join(CLOSE_WAIT)
        if closer.is_alive():
            log.warning("%d database connection(s) in use by a statement the server has "
                        "not answered were not closed within %.0f s; they close with it, "
                        "or with the process", len(others) - len(done), CLOSE_WAIT)
        return closed + len(done)


def _close_held(others: list[_Held], done: list[_Held]) -> None:
    """Close other threads' connections, noting each closed in ``done`` (on a thread of its
    own: one in use waits for its statement)."""
    for held in others:
        try:
            held.conn.close()
            done.append(held)
        except Exception as exc:  # a connection already broken: nothing left to close
            log.debug("closing another thread's connection failed: %s", type(exc).__name__)


def close_every_connection(db: pw.Database) -> None:
    """Close every thread's connection to ``db`` (one kinbox opened), else the caller's."""
    if isinstance(db, ThreadConnections):
        db.close_all()
    elif not db.is_closed():
        db.close()
