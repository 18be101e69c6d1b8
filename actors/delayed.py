"""Calls to make later, all on one thread: many waiting callbacks, not a thread each.

``Delayed.call_in(seconds, key, call)`` runs ``call`` on the instance's one
thread once ``seconds`` have passed, unless :meth:`Delayed.close` came first;
a key holds one call (a later one replaces it). Social ingress resumes its
stalled chats with it: during a lasting database error up to its bound of
chats wait at once, and a timer each would be as many sleeping threads.

The wait is on the monotonic clock: what waits here is a pause before trying
something again, not a due time from the runtime's clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("kinbox.delayed")


class Delayed:
    """Callbacks due after a delay, run in due order on one thread started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._due: dict[str, tuple[float, Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False

    def call_in(self, seconds: float, key: str, call: Callable[[], None]) -> None:
        """Run ``call`` in ``seconds`` (replacing ``key``'s waiting call); nothing once
        closed."""
        with self._cond:
            if self._closed:
                return
            self._due[key] = (time.monotonic() + seconds, call)
            if self._thread is None:
                # A daemon: what waits here is dropped by close(); it never holds the
                # process open.
                self._thread = threading.Thread(target=self._run, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def __len__(self) -> int:
        """Calls waiting."""
        with self._cond:
            return len(self._due)

    def close(self) -> None:
        """Drop every waiting call and end the thread; later calls are ignored."""
        with self._cond:
            self._closed = True
            self._due.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    ready = sorted((due, key) for key, (due, _) in self._due.items()
                                   if due <= now)
                    if ready:
                        break
                    nearest = min((due for due, _ in self._due.values()), default=None)
                    self._cond.wait(None if nearest is None else nearest - now)
                calls = [self._due.pop(key)[1] for _, key in ready]
            for call in calls:
                try:
                    call()
                except Exception:  # one failing call must not end the others' thread
                    log.exception("a delayed call failed")
