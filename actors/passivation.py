"""Which session actors to keep alive: the bounded-threads rule (I8).

Pure: the dispatcher passes in what is live, what is busy and the time, and
gets back which actors to stop. Busy actors are never stopped; the least
recently used idle ones go first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Set


def evictions_for(live_lru: Collection[str], busy: Set[str], incoming: str,
                  cap: int) -> list[str]:
    """Idle actors to stop so that ``incoming`` can be activated within ``cap``.

    ``live_lru`` holds the live actors, least recently used first (an ordered
    dict's keys: ``len`` and ``in`` cost nothing). Returns an empty list when
    there is room or ``incoming`` is already live; only a full runtime walks it.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    excess = len(live_lru) + 1 - cap
    if excess <= 0 or incoming in live_lru:
        return []
    idle = [s for s in live_lru if s not in busy]
    return idle[:excess]


def expired_idle(last_used: Mapping[str, float], busy: Set[str], now: float,
                 ttl: float) -> list[str]:
    """Idle actors unused for at least ``ttl`` seconds, oldest first."""
    old = [(t, s) for s, t in last_used.items() if s not in busy and now - t >= ttl]
    return [s for _, s in sorted(old)]


def excess_idle(live_lru: Collection[str], busy: Set[str], cap: int) -> list[str]:
    """Idle actors to stop so that at most ``cap`` stay live, least recently used first.

    Fewer when too few are idle: running turns keep their actors, so with an async
    brain (up to ``max_async_turns`` turns at once) more than ``cap`` may be live until
    those turns end. Returns an empty list while within ``cap``, walking nothing.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    excess = len(live_lru) - cap
    if excess <= 0:
        return []
    return [s for s in live_lru if s not in busy][:excess]
