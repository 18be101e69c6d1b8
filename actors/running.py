"""The registry of running turns: who is active now, since when, and their stop flags.

Stop requests are ephemeral control (not journaled): ``agent_stop`` sets the
running turn's flag and the brain sees ``turn.stop_requested``. Shared by the
session actors and the direct turns of cron and social (which register
their turn), the tools (which ask) and the dispatcher (which stops turns
past the runtime's ``turn_timeout``).

A session runs one turn at a time whoever started it: ``begin`` waits while
another turn of the same session runs (an inbox turn and a cron run, say),
so their transcript entries never interleave.
"""

from __future__ import annotations

import threading

TIMEOUT = "kinbox:turn_timeout"
"""Who "stopped" a turn that ran past the runtime's turn timeout."""


def overdue(started: float, now: float, timeout: float | None) -> bool:
    """A turn that started at ``started`` has run past ``timeout`` seconds at ``now``."""
    return timeout is not None and now - started > timeout


class RunningTurns:
    """Thread-safe map of session id -> stop flag of its running turn."""

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._flags: dict[str, threading.Event] = {}
        self._stopped_by: dict[str, str | None] = {}
        self._started: dict[str, float] = {}

    def begin(self, session_id: str, now: float = 0.0) -> threading.Event:
        """Register a turn of ``session_id`` started at ``now`` (once the session's running
        turn ended); return its stop flag."""
        flag = threading.Event()
        with self._lock:
            self._lock.wait_for(lambda: session_id not in self._flags)
            self._flags[session_id] = flag
            self._started[session_id] = now
            self._stopped_by.pop(session_id, None)
        return flag

    def end(self, session_id: str) -> str | None:
        """Unregister the turn; return who stopped it (None if nobody did)."""
        with self._lock:
            self._flags.pop(session_id, None)
            self._started.pop(session_id, None)
            self._lock.notify_all()
            return self._stopped_by.pop(session_id, None)

    def stop_overdue(self, now: float, timeout: float | None) -> list[str]:
        """Ask every turn running past ``timeout`` to stop; the sessions asked."""
        with self._lock:
            late = [sid for sid, t in self._started.items()
                    if overdue(t, now, timeout) and sid not in self._stopped_by]
        return [sid for sid in late if self.request_stop(sid, TIMEOUT)]

    def is_running(self, session_id: str) -> bool:
        """True while a turn of ``session_id`` runs in this runtime."""
        with self._lock:
            return session_id in self._flags

    def request_stop(self, session_id: str, by: str | None) -> bool:
        """Set the stop flag of the running turn; False when none runs."""
        with self._lock:
            flag = self._flags.get(session_id)
            if flag is None:
                return False
            self._stopped_by[session_id] = by
        flag.set()
        return True

    def running(self) -> list[str]:
        """Ids of the sessions whose turn runs now."""
        with self._lock:
            return sorted(self._flags)
