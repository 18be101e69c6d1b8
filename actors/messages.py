"""The messages actors tell each other: small records, never changed once sent.

These are control messages between threads, not journal rows: a lost
``Wake`` costs nothing because the journal still holds the work and the
next ``Tick`` finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..persistence import ClaimedRow


@dataclass(frozen=True)
class Wake:
    """Tell the dispatcher that rows may be due (a send just committed)."""


@dataclass(frozen=True)
class Tick:
    """Periodic: renew leases, passivate idle actors, claim rows that became due."""


@dataclass(frozen=True)
class ClaimNow:
    """The dispatcher's own coalesced request to claim (many wakes, one query)."""


@dataclass(slots=True)  # one a message: not frozen (see persistence.inbox_records)
class Deliver:
    """Run a turn for this leased row (the slot table -> a session actor)."""

    row: ClaimedRow
    """The leased head row of the session's queue."""
