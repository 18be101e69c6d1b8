"""When a runtime renews the leases it holds (inbox rows, cron runs).

Pure: times come in as arguments. A renewal is due once a third of a lease has passed
since the last one began, so a lease is renewed twice before it could run out; one the
database refused is due again at once. Noted as done before it ran, the next try came a
third of a lease later, and a database blip over two tries (10-20 s of a 30 s lease, a
PostgreSQL failover) let the leases run out: another runtime took the rows (or the cron
run) over and ran the same turn a second time while the first still ran. The inbox's
renewal and cron's each kept a copy of this rule, and the copies drifted apart.
"""

from __future__ import annotations

RENEWALS_PER_LEASE = 3
"""A renewal is due once ``1 / RENEWALS_PER_LEASE`` of a lease has passed."""


class RenewalSchedule:
    """The time of the last renewal begun (not thread-safe: its owner locks)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0.0

    def due(self, now: float, lease_seconds: float) -> bool:
        """Is a renewal due at ``now``?"""
        return now - self.last >= lease_seconds / RENEWALS_PER_LEASE

    def begin(self, now: float) -> float:
        """Note a renewal begun at ``now``; the time before it, for :meth:`refused`."""
        before, self.last = self.last, now
        return before

    def refused(self, began: float, before: float) -> None:
        """The renewal begun at ``began`` failed: due again at once (unless a later one
        has begun since)."""
        if self.last == began:
            self.last = before
