"""The messages actors tell each other: small immutable records.

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


@dataclass(frozen=True)
class Deliver:
    """Run a turn for this claimed row (dispatcher -> session actor)."""

    row: ClaimedRow
    """The leased head row of the session's queue."""


@dataclass(frozen=True)
class Claimed:
    """A row its send leased in the enqueue's transaction (the fast path): deliver it, no
    claim query (a sender -> the dispatcher)."""

    row: ClaimedRow


@dataclass(frozen=True)
class TurnDone:
    """A session actor finished with its row, whatever the outcome."""

    session_id: str
    """The session whose slot is free again."""
    claim: bool = True
    """Rows may be due that nothing else will hand over (a row handed back, a failed
    attempt, messages its commit enqueued): claim. False after plain committed turns."""
