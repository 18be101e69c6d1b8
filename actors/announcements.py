"""The UI announcement queue (C3): finished cron runs, for a dashboard to drain.

An in-memory, bounded deque and nothing more: it is a presentation channel,
not the agent inbox. When it is full the oldest announcement gives way (a
UI that was away for a day wants the latest news), and the count of those
dropped is kept so the UI can say that it missed some: each drain reports
the count since the previous one (:class:`Drained`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

DEFAULT_BOUND = 100


class Drained(list[dict[str, Any]]):
    """What a drain took: the announcements, oldest first (a list, as a drain always
    returned), and :attr:`dropped`."""

    def __init__(self, items: Iterable[dict[str, Any]] = (), dropped: int = 0) -> None:
        super().__init__(items)
        self.dropped = dropped
        """How many announcements gave way to newer ones since the previous drain."""


class Announcements:
    """A bounded, thread-safe queue of announcements (dicts, newest last)."""

    def __init__(self, bound: int = DEFAULT_BOUND) -> None:
        if bound < 1:
            raise ValueError(f"the announcement bound must be >= 1, got {bound}")
        self.bound = bound
        self._items: deque[dict[str, Any]] = deque(maxlen=bound)
        self._lock = threading.Lock()
        self.dropped = 0
        """Announcements that gave way to newer ones since the last drain."""

    def add(self, item: dict[str, Any]) -> None:
        """Queue an announcement; the oldest gives way when the queue is full."""
        with self._lock:
            if len(self._items) == self.bound:
                self.dropped += 1
            self._items.append(dict(item))

    def drain(self) -> Drained:
        """Take every queued announcement, oldest first, with how many were dropped since
        the last drain (the count starts again)."""
        with self._lock:
            drained = Drained(self._items, self.dropped)
            self._items.clear()
            self.dropped = 0
            return drained

    def peek(self) -> list[dict[str, Any]]:
        """The queued announcements without taking them."""
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
