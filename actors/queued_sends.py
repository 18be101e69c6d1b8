"""Writes on their way to the journal, counted per key against a limit: family sends per
target for the pending limit (F6), and sub-agent starts per parent for the running-children
limit (:data:`.validation.CHILD_LIMIT`), which has the same race.

A family send made in a turn becomes an inbox row only when that turn commits,
yet the limit (at most 20 pending per target) must count it from the call on:
each turn counted the target's rows and its own queued sends, so two turns
sending to one target at once each missed the other's, and the target ended
with more than 20. Here a send is counted from its check (:meth:`QueuedSends.reserve`)
until its row is durable (the journal counts it from then on) or its attempt
is dropped. The count is this process's: turns of
another process sharing the database are seen once they commit.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable


class QueuedSends:
    """Family sends checked against the pending limit and not yet durable, per target."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def reserve(self, target: str, limit: int, pending: Callable[[], int]) -> bool:
        """Count one more send to ``target`` if its ``pending()`` rows and the sends
        counted before it stay under ``limit``; False (nothing counted) otherwise.

        Counted first, checked after (the read is no step under the lock, which would
        hold up every family send while the database answers): of two senders at once,
        the later counts the earlier, so they cannot both take the last place. A send
        counted here and also read as a row (it became durable meanwhile) counts twice
        for a moment: a refusal too many, never a place too many."""
        with self._lock:
            before = self._counts[target]
            self._counts[target] += 1
        try:
            allowed = pending() + before < limit
        except BaseException:
            self.release(target)
            raise
        if not allowed:
            self.release(target)
        return allowed

    def release(self, target: str) -> None:
        """A counted send is durable (the journal counts it now) or will never be."""
        with self._lock:
            self._counts[target] -= 1
            if self._counts[target] <= 0:
                del self._counts[target]

    def count(self, target: str) -> int:
        """The sends to ``target`` counted now (for operators and tests)."""
        with self._lock:
            return self._counts[target]
