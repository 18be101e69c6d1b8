"""How many unauthenticated peer handshakes a server carries at once, and for how long.

A client of the peer endpoint (``/peers/link``, ``/peers/pair``) proves nothing until its
handshake ends: the upgrade is accepted, a challenge sent, and the server waits for the
``hello`` (or ``pair``) frame and then reads the grant (or the invite) in a worker thread.
Without limits, anyone who reaches the port could hold as many of these as it opens, each
for as long as it likes. So a handshake has a deadline, :attr:`HandshakeLimits.timeout`
seconds after it began (the server then closes it: ``1008 handshake timeout``), and at
most :attr:`HandshakeLimits.max_pending` run at once: past that, a new upgrade is refused
at once (HTTP 503 with ``Retry-After``: the earliest deadline among those running, when a
slot is free at the latest). A link that got its welcome, or a pairing answered, gives its
slot back: authenticated links are not counted.

Pure: time comes in as ``now`` (a monotonic reading); the caller (one event loop)
serializes calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

HANDSHAKE_TIMEOUT = 10.0
"""Seconds from the upgrade to the end of the handshake (a device answers in one round
trip; ten seconds allows a slow network)."""
MAX_PENDING = 64
"""Handshakes in progress at once: many more than the devices of a deployment reconnecting
together, few enough that a flood holds no more than that many sockets and reads."""


@dataclass(frozen=True)
class HandshakeLimits:
    """The limits of the unauthenticated part of a peer connection."""

    timeout: float = HANDSHAKE_TIMEOUT
    """Seconds a handshake may take from its upgrade."""
    max_pending: int = MAX_PENDING
    """Handshakes in progress at once; past it a new upgrade is refused (503)."""

    def __post_init__(self) -> None:
        if not self.timeout > 0 or self.max_pending < 1:
            raise ValueError("handshake limits: timeout and max_pending must be positive")


@dataclass(frozen=True)
class Slot:
    """One handshake in progress: give it back with :meth:`HandshakeSlots.release`."""

    number: int
    deadline: float
    """When the handshake must have ended (monotonic seconds)."""


class HandshakeSlots:
    """The handshakes in progress; :meth:`take` a slot for a new one, or learn the wait."""

    def __init__(self, limits: HandshakeLimits | None = None) -> None:
        self.limits = limits or HandshakeLimits()
        self._held: dict[int, float] = {}
        self._numbers = itertools.count()

    def take(self, now: float) -> Slot | float:
        """A slot for a handshake starting at ``now``; when all are held, the seconds until
        the earliest of them ends by its deadline (a wait to give as ``Retry-After``)."""
        if len(self._held) >= self.limits.max_pending:
            return max(0.0, min(self._held.values()) - now)
        slot = Slot(next(self._numbers), now + self.limits.timeout)
        self._held[slot.number] = slot.deadline
        return slot

    def release(self, slot: Slot) -> None:
        """The handshake of ``slot`` ended (welcomed, refused, timed out or gone); twice is
        harmless."""
        self._held.pop(slot.number, None)

    def __len__(self) -> int:
        """How many handshakes are in progress."""
        return len(self._held)


def remaining(slot: Slot, now: float) -> float:
    """Seconds left before ``slot``'s deadline (0.0 once it passed)."""
    return max(0.0, slot.deadline - now)
