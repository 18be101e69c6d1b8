"""One direct turn of a session at a time in this runtime, waited for by a thread or awaited.

A direct turn (:mod:`.direct_turn`) marks its session in the database before it
registers on the running-turn board, so two of the same session here must not overlap
from the mark on: the second would take the first's mark. The turns of an async brain
are driven on the event loop, which must never block on a lock; those of a sync brain on
a pool thread. So a turn's place in its session's line is a future, which the thread
waits for and the loop awaits. A session's line goes once it is empty: every chat thread
a platform ever opened keeps nothing for the runtime's life.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future


class SessionGate:
    """Per session, the direct turns in line: the first holds the gate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: dict[str, deque[Future[None]]] = {}

    def enter(self, session_id: str) -> Future[None]:
        """A place in the session's line: done once it is the turn's. Pass it to
        :meth:`leave` however the turn ends, waited for or not."""
        place: Future[None] = Future()
        with self._lock:
            line = self._lines.setdefault(session_id, deque())
            line.append(place)
            first = len(line) == 1
        if first:
            _grant(place)
        return place

    def leave(self, session_id: str, place: Future[None]) -> None:
        """Give up ``place`` (held, or still waited for): the next in line gets the gate."""
        with self._lock:
            line = self._lines[session_id]
            held = line[0] is place
            line.remove(place)
            following = line[0] if held and line else None
            if not line:
                del self._lines[session_id]
        if following is not None:
            _grant(following)

    def sessions(self) -> int:
        """How many sessions have a turn holding or waiting for the gate."""
        with self._lock:
            return len(self._lines)


def _grant(place: Future[None]) -> None:
    # One cancelled meanwhile (its waiter gave up) holds the gate until its leave,
    # which passes it on.
    if place.set_running_or_notify_cancel():
        place.set_result(None)
