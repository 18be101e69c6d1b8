"""Claiming and acknowledging a peer link's window of outbound rows (its mailbox, I7).

The dispatcher claims only ``local`` rows, one in flight per target; a peer
link needs up to a window of its device's rows in flight at once, in
journal order. :meth:`PeerOutbox.claim_window` leases the target's next open
rows after ``after_seq`` while they are contiguous and claimable, so a row
that waits for its backoff holds back every row behind it (per-target
order). Acks are fenced by the same ``inbox_core`` rules as ``Journal.ack``,
row by row (a row taken over is left out, the rest of the batch acked);
retries and failures go through the :class:`~.journal.Journal`, so the
``suzent_peer`` retry policy applies.

A row whose lease ran out while a link held it (its process died, or stalled past
the lease, while sending it) is a failed attempt nobody could report: the claim that
finds it counts it (``inbox_core.after_takeover``, the peer backoff) and marks it
suspect, instead of sending it again uncounted, so a row whose sending kills its
process every time ends ``failed`` at its attempt limit rather than crash-looping for
ever. A suspect row then goes alone, as its device's head with nothing else in flight
(as the dispatcher runs suspects alone): a death while it is out is its own, and the
rows that shared a window with it count one attempt, not one per crash. A failure the
link lives to report (``Journal.retry``) clears the mark.

The window read and the lease are fixed SQL strings (as in
:mod:`.hot_path`): built by peewee per call, they cost about 140 us per
message of writer time on a link at full speed, more than the rest of the
claim; the statements now cost what the database does.

:meth:`PeerOutbox.ack_waiting` delivers rows no link holds, those waiting for a retry
that the device's signed refusal (heard by a ``read`` or ``stop`` link) says it has.

The ``submit_*`` forms return the writer's reply without waiting for the
commit, so a link at full speed keeps reading acks and sending frames while
its last round of acks is being made durable.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from . import inbox_core as core
from .database import is_postgres
from .errors import LeaseLost, RowNotFound
from .hot_path import CLAIM_COLUMNS, INBOX, Head, HotPath, chunks, is_open
from .inbox_core import PENDING, PROCESSING, Event, check_lease, is_claimable, transition
from .inbox_records import ClaimedRow, TakenOver, WindowClaim
from .models import Tables
from .takeovers import record_takeover
from .writer import GroupCommitWriter, Reply

log = logging.getLogger("kinbox.peers")

WINDOW_CLAIM_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext(%s))"
"""PostgreSQL: a device's window claim takes its lock, key the target, for its transaction,
or claims nothing this time: claims from several processes take turns (a second link sees
the first one's live leases and stays idle: one link per device), and a claim never waits
for a lock. It runs in a writer's batch beside other writes, some taking this lock shared
(:data:`NEW_ROW_LOCK`): a claim that waited for them could wait for a batch that waits for
its own, and PostgreSQL would abort one of the two batches, every write in it."""

NEW_ROW_LOCK = "SELECT pg_advisory_xact_lock_shared(hashtext(%s))"
"""PostgreSQL: a transaction writing rows for a device holds the same lock, shared, before
its rows are numbered. PostgreSQL numbers a row when it is written, not when it commits:
without it a row numbered first and committed after a later one was claimed sat behind
the link's window (which reads on from the last row it took), sent out of order, or not
at all while the link stayed busy. A claim now finds the writes in flight (and claims
nothing until they commit), and a write waits for the claim, so a device's rows commit,
as claims see them, in order."""


class PeerOutbox:
    """Window claims and acks over one database's outbound peer rows."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer
        self.hot = HotPath(tables.db)
        p = self.hot.p
        # One ordered walk of the open rows' (target, seq) partial index from ``seq``.
        self._sql_window = (f"SELECT {', '.join(CLAIM_COLUMNS)} FROM {INBOX} "
                            f"WHERE target_chat_id = {p} AND {is_open()} AND seq > {p} "
                            f"ORDER BY seq LIMIT {p}")
        self._sql_lease = (f"UPDATE {INBOX} SET status = {p}, lease_owner = {p}, "
                           f"lease_until = {p}, updated_at = {p} WHERE message_id IN ")

    def _claim_op(self, owner: str, target: str, after_seq: int, now: float, lease: float,
                  limit: int, waiting_too: bool = False) -> WindowClaim:
        if is_postgres(self.t.db) and not self.t.db.execute_sql(
                WINDOW_CLAIM_LOCK, (target,)).fetchone()[0]:
            return WindowClaim([])  # another claim, or a write of the device's rows, is on
        rows = self._open_rows(target, after_seq, limit)
        if not rows:
            return WindowClaim([])
        head = rows[0] if after_seq <= 0 else self._head(target)
        if head is not None and head.seq <= after_seq and head.suspect:
            return WindowClaim([])  # a suspect row is out (this link's): it goes alone
        taken: list[ClaimedRow] = []
        over: list[str] = []  # leases that ran out under a link: counted, not taken
        own = self._unheld(owner, rows) if after_seq <= 0 else set()
        stopped = False
        for r in rows:
            if not (r.message_id in own
                    or is_claimable(r.status, r.available_at, r.lease_until, now)
                    or (waiting_too and r.status == PENDING)):
                break
            if r.status == PROCESSING and r.message_id not in own:
                over.append(r.message_id)
                stopped = True  # it waits out its backoff, and the rows behind it
            elif stopped:
                continue
            elif r.suspect:  # alone, and only as the head
                if not taken and head is not None and r.seq == head.seq:
                    taken.append(ClaimedRow.from_head(r))
                stopped = True
            else:
                taken.append(ClaimedRow.from_head(r))
        counted = self._count_takeovers(over, now) if over else []
        p = self.hot.p
        for ids in chunks([t.message_id for t in taken]):
            self.t.db.execute_sql(self._sql_lease + f"({', '.join([p] * len(ids))})",
                                  (PROCESSING, owner, now + lease, now, *ids))
        return WindowClaim(taken, tuple(counted))

    def _unheld(self, owner: str, rows: Sequence[Head]) -> set[str]:
        """The ids of ``rows`` leased to ``owner``, for a claim from the device's head: its
        link holds none of them then (it claims from the head only when it holds nothing).

        A claim's lease can commit while its answer is lost with the connection (on
        PostgreSQL: a server restart, a failover, a cut network): the link took the claim
        for failed, and the rows stayed leased to a live owner that no one takes over.
        Its next claims stopped at them until the lease ran out, then counted each as
        taken over (an attempt, suspect, announced as its sender's death). Such a row
        is taken again, uncounted, as a pending one is. Read under the locks of
        ``owner``'s rows (on PostgreSQL), never waiting for another owner's."""
        leased = sorted(r.message_id for r in rows if r.status == PROCESSING)
        if not leased:
            return set()
        hot = self.hot
        lock = " ORDER BY message_id FOR UPDATE" if hot.postgres else ""
        mine: set[str] = set()
        for part in chunks(leased):
            mine.update(r[0] for r in self.t.db.execute_sql(
                f"SELECT message_id FROM {INBOX} WHERE message_id IN ({hot.in_list(len(part))}) "
                f"AND status = {hot.p} AND lease_owner = {hot.p}{lock}",
                [*part, PROCESSING, owner]))
        return mine

    def _count_takeovers(self, ids: list[str], now: float) -> list[TakenOver]:
        """Each of ``ids`` was leased by a link that never answered for it: a failed attempt
        (back to pending with the peer backoff, or ``failed`` at the limit), and suspect.

        Decided again under the rows' locks (:meth:`~.hot_path.HotPath.fence_rows`): the
        window was read unlocked, and on PostgreSQL the owner may have renewed the lease,
        acknowledged the row or reported its failure since. Such a row is left as it is."""
        m = self.t.inbox
        counted = []
        for mid, (status, owner, attempts, max_attempts, transport) in sorted(
                self.hot.fence_rows(ids).items()):
            if status != PROCESSING:
                continue  # answered meanwhile
            decision = core.after_takeover(attempts, max_attempts, owner, now,
                                           cap=core.policy_for(transport).cap, runs_now=False)
            # Still the same owner's expired lease: one renewed meanwhile is a live link's.
            done = record_takeover(self.t, mid, status, decision, now, fence=(
                (m.status == PROCESSING) & (m.lease_owner == owner) & (m.lease_until <= now)))
            if done is None:
                continue
            counted.append(done)
            if done.failed:
                log.warning("peer row %s failed: taken over at attempt %d of %d (its sender "
                            "died while sending it)", mid, done.attempts, max_attempts)
        return counted

    def _head(self, target: str) -> Head | None:
        rows = self._open_rows(target, 0, 1)
        return rows[0] if rows else None

    def _open_rows(self, target: str, after_seq: int, limit: int) -> list[Head]:
        return [Head._make(r) for r in self.t.db.execute_sql(
            self._sql_window, (target, after_seq, limit)).fetchall()]

    def submit_claim(self, owner: str, target: str, after_seq: int, now: float, *,
                     lease: float, limit: int, waiting_too: bool = False) -> Reply[WindowClaim]:
        """Queue a window claim; the reply holds the leased rows once committed, and the
        takeovers it counted (for the link to announce as it does a reported failure).
        ``waiting_too``: pending rows waiting for their backoff are leased as well (for a
        link whose grant closed here, which fails every open row at once, not each when
        its backoff ends)."""
        return self.writer.submit(
            lambda: self._claim_op(owner, target, after_seq, now, lease, limit, waiting_too))

    def claim_window(self, owner: str, target: str, after_seq: int, now: float, *,
                     lease: float, limit: int) -> list[ClaimedRow]:
        """Lease up to ``limit`` of ``target``'s open rows after ``after_seq``, in order
        (counting the takeovers it finds, and a suspect row alone: see the module)."""
        return self.submit_claim(owner, target, after_seq, now, lease=lease,
                                 limit=limit).result(30).rows

    def _ack_op(self, owner: str, ids: list[str], now: float) -> list[str]:
        rows = self.hot.fence_rows(ids)
        held, lost = [], []
        for mid in ids:
            row = rows.get(mid)
            if row is None:
                raise RowNotFound(f"no inbox row with id {mid!r}")
            try:
                check_lease(mid, row[0], row[1], owner)
            except LeaseLost:
                lost.append(mid)
                continue
            transition(mid, row[0], Event.ACK)
            held.append(mid)
        self.hot.mark_delivered(held, now)
        return lost

    def submit_ack(self, owner: str, message_ids: Sequence[str], now: float) -> Reply[list[str]]:
        """Queue the acks of rows the receiver committed; the reply holds the ids whose
        lease ``owner`` no longer holds (fenced: left to whoever does, who sends them again
        and hears the receiver's repeated ack). Each row's ack stands alone: one taken
        over must not keep the others of the batch from being delivered, since the link
        that sent them has let them go and its lease renewals would hold them for ever."""
        ids = list(message_ids)
        return self.writer.submit(lambda: self._ack_op(owner, ids, now))

    def waiting(self, target: str, limit: int) -> list[str]:
        """The ids of ``target``'s first ``limit`` open rows that no link holds (pending:
        waiting for a retry, or due and not claimed yet), in journal order: what a
        ``read`` or ``stop`` link names in its upgrade, so that a refusal it hears says
        which of them the device committed (their acks lost with an earlier link)."""
        return [r.message_id for r in self._open_rows(target, 0, limit)
                if r.status == PENDING]

    def _ack_waiting_op(self, ids: list[str], now: float) -> list[str]:
        rows = self.hot.fence_rows(ids)
        done = [mid for mid in ids if mid in rows and rows[mid][0] == PENDING]
        for mid in done:  # taken and acknowledged at once: the device has it already
            transition(mid, transition(mid, PENDING, Event.CLAIM), Event.ACK)
        self.hot.mark_delivered(done, now)
        return done

    def ack_waiting(self, message_ids: Sequence[str], now: float) -> list[str]:
        """Mark ``delivered`` those of ``message_ids`` still pending (no link holds them):
        the device said, signed, that it committed them. A row a link took meanwhile is
        left to it (its own handshake hears the same); returns the ids acknowledged."""
        ids = list(message_ids)
        return self.writer.call(lambda: self._ack_waiting_op(ids, now))

    def next_due(self, target: str) -> float | None:
        """When the target's head row becomes claimable (None when it has no open row)."""
        rows = self._open_rows(target, 0, 1)
        if not rows:
            return None
        head = rows[0]  # CLAIM_COLUMNS: status, available_at, lease_until are 9, 10, 11
        due = head[10] if head[9] == PENDING else head[11]
        return float(due or 0.0)  # type: ignore[arg-type]
