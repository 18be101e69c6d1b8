"""Deliberately broken journals: the delivery variants the crash checker must catch.

They live here, not in the package: production code has no switch for them. The crash
child (``crash_child.py``) puts one in place of the runtime's journal class, so the same
runtime, dispatcher and session actors run on top of a journal that breaks one rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kinbox.persistence import (
    ClaimedRow,
    ClaimResult,
    EnqueueResult,
    Journal,
    Lease,
    NewMessage,
    Reply,
    TurnEntry,
)


class AckBeforeTurn(Journal):
    """Acknowledges every row as it is handed out, before its turn runs, and writes the
    turn later without fencing: a kill in between loses the turn (the row is delivered
    without one)."""

    def claim(self, owner: str, now: float, **options: Any) -> ClaimResult:
        result = super().claim(owner, now, **options)
        if result.rows:
            self.ack(owner, [r.message_id for r in result.rows], now)
        return result

    def enqueue(self, msg: NewMessage, now: float, *,
                lease: Lease | None = None) -> EnqueueResult:
        result = super().enqueue(msg, now, lease=lease)
        if result.claimed is not None and lease is not None:
            self.ack(lease.owner, [result.message_id], now)
        return result

    def submit_turn(self, owner: str, session_id: str, message_ids: Sequence[str],
                    entries: Sequence[TurnEntry], now: float,
                    **options: Any) -> Reply[ClaimedRow | None]:
        def write() -> None:
            self.write_turn(session_id, message_ids, entries, now)
        return self.writer.submit(write)


class SkipMarkerCheck(Journal):
    """The seed's original two-step commit (the turn, then the ack, in two transactions)
    with no marker check on claim: a kill between the two runs the turn again."""

    def committed_of(self, ids: Sequence[str]) -> set[str]:
        return set()

    def submit_turn(self, owner: str, session_id: str, message_ids: Sequence[str],
                    entries: Sequence[TurnEntry], now: float,
                    **options: Any) -> Reply[ClaimedRow | None]:
        self.writer.call(lambda: self.write_turn(session_id, message_ids, entries, now))
        return self.writer.submit(lambda: self._ack_op(owner, list(message_ids), now))


BROKEN = {"ack_before_turn": AckBeforeTurn, "skip_marker_check": SkipMarkerCheck}
"""The variants by the name the crash tests give on the child's command line."""
