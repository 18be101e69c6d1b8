"""Claiming a peer link's window of outbound rows (the link actor's mailbox, I7).

The dispatcher claims only ``local`` rows, one in flight per target; a peer
link needs up to a window of its device's rows in flight at once, in
journal order. :func:`claim_window` leases the target's next open rows
after ``after_seq`` while they are contiguous and claimable, so a row that
waits for its backoff holds back every row behind it (per-target order).
Acks, retries and failures go through the :class:`~.journal.Journal` as
for any row, so fencing and the ``suzent_peer`` retry policy apply.
"""

from __future__ import annotations

from .hot_path import CLAIM_COLUMNS
from .inbox_core import OPEN_STATES, State, is_claimable
from .inbox_records import ClaimedRow
from .models import Tables
from .writer import GroupCommitWriter


class PeerOutbox:
    """Window claims over one database's outbound peer rows."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    def claim_window(self, owner: str, target: str, after_seq: int, now: float, *,
                     lease: float, limit: int) -> list[ClaimedRow]:
        """Lease up to ``limit`` of ``target``'s open rows after ``after_seq``, in order."""
        m = self.t.inbox
        columns = [getattr(m, c) for c in CLAIM_COLUMNS]

        def op() -> list[ClaimedRow]:
            rows = (m.select(*columns).where(m.target_chat_id == target, m.seq > after_seq,
                                             m.status.in_(OPEN_STATES))
                    .order_by(m.seq).limit(limit).tuples())
            taken: list[ClaimedRow] = []
            for r in rows:
                if not is_claimable(r[9], r[10], r[11], now):
                    break
                taken.append(ClaimedRow.from_columns(r))
            if taken:
                m.update(status=State.PROCESSING.value, lease_owner=owner, lease_until=now + lease,
                         updated_at=now).where(
                    m.message_id.in_([t.message_id for t in taken])).execute()
            return taken
        return list(self.writer.call(op))

    def next_due(self, target: str) -> float | None:
        """When the target's head row becomes claimable (None when it has no open row)."""
        m = self.t.inbox
        row = (m.select(m.status, m.available_at, m.lease_until)
               .where(m.target_chat_id == target, m.status.in_(OPEN_STATES))
               .order_by(m.seq).limit(1).tuples().first())
        if row is None:
            return None
        return float(row[1] if row[0] == "pending" else (row[2] or 0.0))
