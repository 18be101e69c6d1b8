"""The durable inbox: every message to an actor is a row here before anyone hears of it.

The journal is the mailbox mirror of DESIGN.md: a session's mailbox is its
open rows, the dispatcher's mailbox is the set of due rows. Every write goes
through the :class:`~.writer.GroupCommitWriter` (but a claim on PostgreSQL,
a short transaction of its own: see :meth:`Journal.claim`), so a caller
that gets a result back knows its change is committed. The rules (states, backoff,
fencing, idempotency) live in :mod:`.inbox_core`; this module applies them
to rows.

Ordering: each row gets a ``seq`` in the enqueue transaction; a target's
rows are delivered in ``seq`` order, and only the oldest open row of a
target (its *head*) can be claimed, which gives one row in flight per
target across processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import peewee as pw

from . import inbox_core as core
from . import set_wise
from .bulk_sql import BulkSql
from .errors import LeaseLost, PersistenceError, RowNotFound, WriterClosed
from .hot_path import CLAIM_COLUMNS, Head, HotPath, is_open
from .inbox_operator import InboxOperator
from .inbox_reads import InboxReads
from .inbox_records import (
    ClaimedRow,
    ClaimResult,
    EnqueueResult,
    FenceRow,
    Lease,
    NewMessage,
    TurnCommit,
    TurnEntry,
    entry_row,
)
from .models import InboxMessage, Tables
from .writer import WRITE_TIMEOUT, Bulk, GroupCommitWriter, Reply

log = logging.getLogger("kinbox.journal")

__all__ = ["DEFAULT_LEASE_SECONDS", "ClaimResult", "ClaimedRow", "EnqueueResult", "Journal",
           "NewMessage", "TurnEntry"]

DEFAULT_LEASE_SECONDS = 30.0
"""How long a claim holds a row before another worker may take it over."""


def _claimed(row: InboxMessage) -> ClaimedRow:
    return ClaimedRow.from_head(Head._make(getattr(row, c) for c in CLAIM_COLUMNS))


class Journal(InboxReads, InboxOperator):
    """Inbox operations on one database; writes are group-committed, reads are direct."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer
        self.hot = HotPath(tables.db)
        self.bulk = bulk = BulkSql(self.hot)
        self._enqueues: Bulk[set_wise.Enqueue, EnqueueResult] = Bulk(
            "enqueue", lambda item: self.enqueue_now(*item),
            lambda items: set_wise.enqueue_all(bulk, items))
        self._releases: Bulk[set_wise.Release, None] = Bulk(
            "release", self._release_one, lambda items: set_wise.release_all(bulk, items))
        self._commits: Bulk[TurnCommit, ClaimedRow | None] = Bulk(
            "turn commit", self._commit_one,
            lambda items: set_wise.commit_all(bulk, items))

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue_now(self, msg: NewMessage, now: float, lease: Lease | None = None
                    ) -> EnqueueResult:
        """Enqueue inside the caller's transaction (on the writer thread)."""
        try:
            return self._enqueue_new(msg, now, lease)
        except set_wise.OneByOne:
            # Another process wrote the id between the read and the insert (two runtimes
            # reporting one orphaned task at their start): judge it against that row.
            return self._enqueue_new(msg, now, lease)

    def _enqueue_new(self, msg: NewMessage, now: float, lease: Lease | None
                     ) -> EnqueueResult:
        """The idempotence rule against the row ``msg``'s id has, if any; else insert it."""
        existing = self.hot.existing(msg.message_id)
        fingerprint = core.Fingerprint(msg.target, msg.kind, msg.content)
        before = core.Fingerprint(*existing[:3]) if existing else None
        if not core.enqueue_decision(msg.message_id, before, fingerprint):
            assert existing is not None
            return EnqueueResult(msg.message_id, msg.target, existing[3], False, existing[4])
        return set_wise.insert_new(self.bulk, [(msg, now, lease)])[0]

    def enqueue(self, msg: NewMessage, now: float, *, lease: Lease | None = None
                ) -> EnqueueResult:
        """Write ``msg`` and commit; return once it is durable.

        With ``lease`` (the fast path), a new row that is its target's head is leased in
        the same transaction and comes back as ``claimed``, for the caller to hand straight
        to its session: only for an owner that provably owns its targets (see
        :func:`.set_wise.heads_to_lease`)."""
        return self.writer.call_bulk(self._enqueues, (msg, now, lease))

    def submit_enqueue(self, msg: NewMessage, now: float, *, lease: Lease | None = None
                       ) -> Reply[EnqueueResult]:
        """:meth:`enqueue` without waiting: the reply answers once the row is durable (for
        a caller that must act on a late answer too: a row leased with it)."""
        return self.writer.submit_bulk(self._enqueues, (msg, now, lease))

    def enqueue_many(self, msgs: Sequence[NewMessage], now: float) -> list[EnqueueResult]:
        """Enqueue several messages in one transaction (all or, on conflict, an error)."""
        return self.writer.call(lambda: self._enqueue_many_op(list(msgs), now))

    def _enqueue_many_op(self, msgs: list[NewMessage], now: float) -> list[EnqueueResult]:
        items: list[set_wise.Enqueue] = [(msg, now, None) for msg in msgs]
        try:
            with self.t.db.atomic():  # undone alone if it must go one by one
                return set_wise.enqueue_all(self.bulk, items)
        except set_wise.OneByOne:  # a repeated id: each message by the idempotence rule
            return [self.enqueue_now(msg, now) for msg in msgs]

    # -- claims ----------------------------------------------------------------------------

    def committed_of(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` already have a committed turn (their delivery marker, I6)."""
        return self.hot.with_markers(ids)

    def _claim_op(self, owner: str, now: float, lease: float, limit: int,
                  exclude: frozenset[str], transport: str, suspects: int) -> ClaimResult:
        known: set[str] | None = None  # PostgreSQL's lock reads the markers too
        if self.bulk.pg is not None:  # excluded targets are left out by the walk itself
            heads, known = self.bulk.pg.due_heads(transport, now, limit, sorted(exclude))
        else:
            heads = self.hot.due_heads(transport, now, limit + len(exclude))
        picked, held_back = [], False
        for h in heads:  # at most ``suspects`` suspect rows: they run alone
            if h.target_chat_id in exclude or len(picked) == limit:
                continue
            if core.is_suspect(h.status, bool(h.suspect)):
                if suspects <= 0:
                    held_back = True
                    continue
                suspects -= 1
            picked.append(h)
        if not picked:
            return ClaimResult([], [], held_back)
        rows = [ClaimedRow.from_head(h) for h in picked]
        ids = [r.message_id for r in rows]
        done = self.committed_of(ids) if known is None else known & set(ids)
        if done:
            self.hot.mark_delivered(sorted(done), now)
        taken_over = [h.message_id for h in picked
                      if h.status == core.PROCESSING and h.message_id not in done]
        attempts = self._count_interrupted(taken_over, now) if taken_over else {}
        rows = [replace(r, attempts=attempts[r.message_id], taken_over=True)
                if r.message_id in attempts else r
                for r in rows if r.message_id not in done and attempts.get(r.message_id, 0) >= 0]
        # ``attempts`` < 0: failed by this claim, not leased
        if rows:
            self.hot.lease_many([r.message_id for r in rows], owner, now + lease, now)
        failed = tuple(sorted(mid for mid, n in attempts.items() if n < 0))
        return ClaimResult(rows, sorted(done), held_back, failed=failed)

    def _count_interrupted(self, ids: list[str], now: float) -> dict[str, int]:
        """Takeovers: message id -> attempts now, or -1 for a row that thereby reached its
        limit and is ``failed`` (not claimed). Only a turn that had started counts."""
        found: dict[str, int] = {}
        m = self.t.inbox
        started = {r.message_id for r in m.select(m.message_id).where(
            m.message_id.in_(ids), m.turn_started_at.is_null(False))}
        for row in self._rows_for_fencing(ids):
            if row.message_id not in started:
                found[row.message_id] = row.attempts  # killed before its brain ran
                m.update(suspect=True).where(m.message_id == row.message_id).execute()
                continue
            out = core.after_interrupted_turn(row.attempts, row.max_attempts)
            error = core.interrupted_error(out.attempts, row.max_attempts, row.lease_owner)
            failed = out.state is core.State.FAILED
            self.t.event.insert(message_id=row.message_id, at=now, attempts=out.attempts,
                                event="failed" if failed else "interrupted",
                                detail=error).execute()
            changes: dict[str, Any] = {"attempts": out.attempts, "last_error": error,
                                       "updated_at": now, "turn_started_at": None,
                                       "suspect": True}
            if failed:
                changes.update(status=core.FAILED, lease_owner=None,
                               lease_until=None)
            m.update(**changes).where(m.message_id == row.message_id).execute()
            found[row.message_id] = -1 if failed else out.attempts
        return found

    def mark_turn_started(self, owner: str, message_id: str, now: float) -> None:
        """Durably note that a taken-over row's turn is starting (fenced by the lease)."""
        self.submit_turn_started(owner, message_id, now).result(WRITE_TIMEOUT)

    def submit_turn_started(self, owner: str, message_id: str, now: float) -> Reply[None]:
        """:meth:`mark_turn_started` without waiting (for event-loop callers)."""
        m = self.t.inbox

        def op() -> None:
            self._fence(owner, [message_id])
            m.update(turn_started_at=now).where(m.message_id == message_id).execute()
        return self.writer.submit(op)

    def _rows_for_fencing(self, ids: Sequence[str]) -> list[FenceRow]:
        rows = self.hot.fence_rows(ids)
        return [FenceRow(i, *rows[i]) for i in ids if i in rows]

    def claim(self, owner: str, now: float, *, limit: int = 64,
              lease: float = DEFAULT_LEASE_SECONDS, exclude: Iterable[str] = (),
              transport: str = "local", suspects: int = 1) -> ClaimResult:
        """Lease up to ``limit`` due head rows (one per target), oldest first, of which at
        most ``suspects`` are suspect (rows whose last worker died mid-turn).

        On PostgreSQL the claim runs on the caller's connection, not as a writer
        operation: queued behind the turn commits on the writer it waited longer than it
        ran (a p99 of 19 ms a claim against 9 ms of SQL). The rows that need only their
        lease take two statements (:meth:`.pg_claims.PgClaims.claim_plain`); any that
        need more are claimed by the full rules in a short transaction. It is safe beside
        the writer as beside another process's: it locks the rows it leases (``FOR UPDATE
        SKIP LOCKED``) and checks their state and headship again under the lock, and the
        rows it reads cannot be ones the writer is acknowledging or chaining, which are
        the excluded targets'. SQLite has one writer per process.
        """
        ex = frozenset(exclude)

        def op() -> ClaimResult:
            return self._claim_op(owner, now, lease, limit, ex, transport, suspects)
        if self.bulk.pg is None:
            return self.writer.call(op)
        if self.writer.closed:  # a stopped runtime leases nothing more
            raise WriterClosed("the writer is stopped; no more claims")
        # The common rows in two statements (pg_claims); what needs more by the full rules.
        plain = self.bulk.pg.claim_plain(owner, transport, now, now + lease, limit, sorted(ex))
        rows = [ClaimedRow.from_head(h) for h in plain.rows]
        leased = rows
        try:
            if not plain.special or len(rows) >= limit:
                return ClaimResult(self._stood(owner, rows, now), [], next_due=plain.next_due)
            with self.t.db.atomic():
                rest = self._claim_op(owner, now, lease, limit - len(rows),
                                      ex | {r.target for r in rows}, transport, suspects)
            leased = rows + rest.rows
            return ClaimResult(self._stood(owner, leased, now), rest.acked_by_marker,
                               rest.held_back, plain.next_due, rest.failed)
        except Exception:
            # The plain rows' leases committed with their statement, and the caller, told
            # the claim failed, will never start them: left leased to a live worker they
            # would wait out the lease and come back as suspects. Hand them back unrun.
            self._hand_back(owner, [r.message_id for r in leased], now)
            raise

    def _hand_back(self, owner: str, ids: list[str], now: float) -> None:
        """Release ``ids``, leased to ``owner`` by a claim that then failed; a release that
        fails too leaves its row to its lease (the claim's own error is the one raised).
        An item each, in one batch under one wait: a row the claim's stand-back already
        handed back (its answer lost with the connection) is refused alone, set-wise
        (:func:`.set_wise.release_all`), and the others go back."""
        replies = [self.writer.submit_bulk(self._releases, (owner, [mid], now)) for mid in ids]
        deadline = time.monotonic() + WRITE_TIMEOUT
        kept = []
        for reply in replies:
            try:
                reply.result(max(0.0, deadline - time.monotonic()))
            except LeaseLost:
                pass  # handed back already, or no longer this owner's
            except PersistenceError as exc:
                kept.append(type(exc).__name__)
        if kept:
            log.warning("a failed claim could not hand back %d leased rows (%s); they come "
                        "back when their lease runs out", len(kept), kept[0])

    def _stood(self, owner: str, rows: list[ClaimedRow], now: float) -> list[ClaimedRow]:
        """``rows`` but those handed back because their session has a turn running
        elsewhere after all (:meth:`.pg_claims.PgClaims.stand_back`). Only rows that
        were pending: a takeover's session may hold the dead owner's other rows (steered
        into its turn) with leases still running, and the row taken over is the one to
        run first."""
        assert self.bulk.pg is not None
        fresh = [r.message_id for r in rows if not r.taken_over]
        back = self.bulk.pg.stand_back(owner, fresh, now)
        return [r for r in rows if r.message_id not in back] if back else rows

    def _claim_more_op(self, owner: str, target: str, turn_row: str, after_seq: int,
                       now: float, lease: float, limit: int) -> list[ClaimedRow]:
        m = self.t.inbox
        # Fenced by the turn's own row: only while ``owner`` still holds it. A worker paused
        # past its lease whose row was taken over must not lease the rows the new owner's
        # turn is to chain into (rows it steered before are no proof: a takeover leaves
        # them leased to it). On PostgreSQL the rows read here are locked, as a fence's
        # rows are (a takeover's claim skips them; a chaining commit's lease is seen, not
        # overwritten; a row another process cancelled meanwhile is read as it is now, no
        # longer open, and not leased anyway).
        lock = self.bulk.postgres
        if not self._holds(owner, turn_row):
            return []
        candidates = (m.select().where(m.target_chat_id == target, pw.SQL(is_open()),
                                       m.seq > after_seq)
                      .order_by(m.seq).limit(limit))
        taken: list[InboxMessage] = []
        for r in candidates.for_update() if lock else candidates:
            if r.status != core.PENDING or r.available_at > now:
                break  # contiguous due rows only, so per-target order holds
            taken.append(r)
        if taken:
            m.update(status=core.PROCESSING, lease_owner=owner,
                     lease_until=now + lease, updated_at=now).where(
                m.message_id.in_([r.message_id for r in taken]),
                m.status == core.PENDING).execute()
        return [_claimed(r) for r in taken]

    def _holds(self, owner: str, turn_row: str) -> bool:
        """Does ``owner`` still hold the running turn's own row (read under the fence's
        lock on PostgreSQL)? What leases a row into a turn is fenced by it."""
        held = self.hot.fence_rows([turn_row]).get(turn_row)
        return held is not None and held[0] == core.PROCESSING and held[1] == owner

    def _claim_row_op(self, owner: str, target: str, turn_row: str, message_id: str,
                      now: float, lease: float) -> ClaimedRow | None:
        m = self.t.inbox
        if not self._holds(owner, turn_row):
            return None
        query = m.select().where(m.message_id == message_id, m.target_chat_id == target)
        row = (query.for_update() if self.bulk.postgres else query).get_or_none()
        # Claimable as a claim sees it (pending and due, or a dead worker's lease ran out:
        # an earlier attempt of this turn took it, and died), compared and set again by
        # the lease itself.
        if row is None or not core.is_claimable(row.status, row.available_at,
                                                 row.lease_until, now):
            return None
        if not self.hot.lease(message_id, owner, now + lease, now):
            return None
        return _claimed(row)

    def claim_row(self, owner: str, target: str, turn_row: str, message_id: str, now: float,
                  *, lease: float = DEFAULT_LEASE_SECONDS) -> ClaimedRow | None:
        """Lease the one row ``message_id`` of ``target`` into the running turn of
        ``turn_row`` (:meth:`claim_more`'s fence and lease, for a row the turn asks for by
        name: a foreground child's result, which the turn already has). None unless
        ``owner`` still holds ``turn_row`` and the row is the target's and claimable."""
        return self.writer.call(
            lambda: self._claim_row_op(owner, target, turn_row, message_id, now, lease))

    def claim_more(self, owner: str, target: str, turn_row: str, after_seq: int, now: float,
                   *, lease: float = DEFAULT_LEASE_SECONDS,
                   limit: int = 100) -> list[ClaimedRow]:
        """Lease the target's next due rows after ``after_seq`` (steering into the running
        turn of ``turn_row``): none unless ``owner`` still holds ``turn_row``."""
        return self.writer.call(
            lambda: self._claim_more_op(owner, target, turn_row, after_seq, now, lease, limit))

    def renew(self, owner: str, targets: Sequence[str], until: float, now: float) -> int:
        """Extend every lease ``owner`` holds on rows of ``targets``; return how many."""
        m = self.t.inbox
        tg = list(targets)
        return self.writer.call(lambda: m.update(lease_until=until, updated_at=now).where(
            m.target_chat_id.in_(tg), m.lease_owner == owner,
            m.status == core.PROCESSING).execute())

    def expire_leases(self, now: float, owners: Iterable[str] | None = None) -> int:
        """Make processing rows claimable now: every one (start-up of an exclusive
        runtime), or those of ``owners`` (runtimes known to be gone)."""
        m = self.t.inbox
        cond = m.status == core.PROCESSING
        if owners is not None:
            cond &= m.lease_owner.in_(sorted(owners))
        return self.writer.call(lambda: m.update(lease_until=now).where(cond).execute())

    def lease_owners(self) -> set[str]:
        """The owners holding leases on processing rows now."""
        m = self.t.inbox
        return {r.lease_owner for r in m.select(m.lease_owner).distinct().where(
            m.status == core.PROCESSING, m.lease_owner.is_null(False))}

    # -- outcomes --------------------------------------------------------------------------

    def _fence(self, owner: str, ids: Sequence[str]) -> list[FenceRow]:
        rows = self.hot.fence_rows(ids)
        for mid in ids:
            row = rows.get(mid)
            if row is None:
                raise RowNotFound("inbox row", mid)
            core.check_lease(mid, row[0], row[1], owner)
        return [FenceRow(i, *rows[i]) for i in ids]

    def _claim_next_op(self, owner: str, target: str, now: float,
                       lease: float) -> ClaimedRow | None:
        """Lease the target's new head if it is due (inside the ack's transaction); on
        PostgreSQL not while a direct turn marks the session (see ``pg_commits``)."""
        if self.bulk.postgres and self.hot.marked(target):
            return None
        while True:
            head = self.hot.head(target)
            if head is None or not core.chains(head.status, head.available_at, head.lease_until,
                                               now, bool(head.suspect)):
                return None
            if not self.hot.lease(head.message_id, owner, now + lease, now):
                return None  # another worker took it first
            if not self.hot.has_marker(head.message_id):
                return ClaimedRow.from_head(head)
            self.hot.mark_delivered([head.message_id], now)  # its turn had committed

    def write_turn(self, session_id: str, ids: Sequence[str], entries: Sequence[TurnEntry],
                   now: float) -> None:
        """A turn's transcript entries and its delivery markers, inside the caller's
        transaction (no fence, no ack: those are the commit's, see ``complete_turn``)."""
        self.bulk.insert_entries([entry_row(session_id, e, now) for e in entries])
        self.bulk.insert_markers([(session_id, mid, now) for mid in ids])

    def _complete_op(self, owner: str, session_id: str, ids: list[str],
                     entries: Sequence[TurnEntry], now: float,
                     enqueue: Sequence[NewMessage], also: Sequence[Callable[[], object]],
                     next_lease: float | None = None) -> ClaimedRow | None:
        self._fence(owner, ids)
        for msg in enqueue:
            self.enqueue_now(msg, now)
        for op in also:
            op()
        self.write_turn(session_id, ids, entries, now)
        self.hot.mark_delivered(ids, now)
        if next_lease is None:
            return None
        # Judged, leased (its compare-and-set too) and stamped at the chain time: a time
        # that has passed (a send's), at most CHAIN_SLACK past the commit's own.
        return self._claim_next_op(owner, session_id, self.bulk.chain_time(now), next_lease)

    def complete_turn(self, owner: str, session_id: str, message_ids: Sequence[str],
                      entries: Sequence[TurnEntry], now: float, *,
                      enqueue: Sequence[NewMessage] = (),
                      also: Sequence[Callable[[], object]] = (),
                      next_lease: float | None = None) -> ClaimedRow | None:
        """Commit a turn's transcript entries, its delivery markers and the acks together.

        Refused with :class:`LeaseLost` (nothing written) if ``owner`` lost any lease.
        ``enqueue`` messages (a parent's wake-up, a reply) and ``also``
        operations (a task update; run on the writer thread) commit in the same
        transaction, so a crash cannot keep the turn and lose what it caused.
        With ``next_lease``, the target's next due row is leased in the same
        transaction and returned, so a busy session keeps going without a
        round trip through the dispatcher (still one row in flight: the next
        is leased only as this one is acknowledged).
        """
        return self.submit_turn(owner, session_id, message_ids, entries, now, enqueue=enqueue,
                                also=also, next_lease=next_lease).result(WRITE_TIMEOUT)

    def submit_turn(self, owner: str, session_id: str, message_ids: Sequence[str],
                    entries: Sequence[TurnEntry], now: float, *,
                    enqueue: Sequence[NewMessage] = (),
                    also: Sequence[Callable[[], object]] = (),
                    next_lease: float | None = None) -> Reply[ClaimedRow | None]:
        """:meth:`complete_turn` without waiting: the reply answers once it committed (for
        event-loop callers, which must not block on the commit)."""
        ids = list(message_ids)
        if not enqueue and not also:  # a plain turn: may commit set-wise
            return self.writer.submit_bulk(
                self._commits, TurnCommit(owner, session_id, ids, entries, now, next_lease))
        msgs, ops = list(enqueue), list(also)
        return self.writer.submit(
            lambda: self._complete_op(owner, session_id, ids, entries, now, msgs, ops,
                                      next_lease))

    def _commit_one(self, c: TurnCommit) -> ClaimedRow | None:
        return self._complete_op(c.owner, c.session_id, c.message_ids, c.entries, c.now,
                                 (), (), c.next_lease)

    def _ack_op(self, owner: str, ids: list[str], now: float) -> None:
        for row in self._fence(owner, ids):
            core.transition(row.message_id, row.status, core.Event.ACK)
        self.hot.mark_delivered(ids, now)

    def ack(self, owner: str, message_ids: Sequence[str], now: float) -> None:
        """Mark rows delivered without a turn (fenced)."""
        ids = list(message_ids)
        self.writer.call(lambda: self._ack_op(owner, ids, now))

    def _retry_op(self, owner: str, message_id: str, error: str, now: float,
                  permanent: bool, release: list[str], on_failed: Sequence[NewMessage],
                  on_failed_also: Sequence[Callable[[], object]]) -> core.FailureOutcome:
        row = self._fence(owner, [message_id, *release])[0]
        policy = core.TRANSPORT_POLICIES.get(row.transport, core.LOCAL)
        out = core.after_failure(row.attempts, row.max_attempts, policy.cap, now,
                                 permanent=permanent)
        core.transition(message_id, row.status,
                        core.Event.FAIL if out.state is core.State.FAILED else core.Event.RETRY)
        m = self.t.inbox
        m.update(status=out.state.value, attempts=out.attempts, available_at=out.available_at,
                 last_error=core.clip_error(error), lease_owner=None, lease_until=None,
                 turn_started_at=None, suspect=False,
                 updated_at=now).where(m.message_id == message_id).execute()
        self.t.event.insert(message_id=message_id, at=now, attempts=out.attempts,
                            event="failed" if out.state is core.State.FAILED else "retry",
                            detail=core.clip_error(error)).execute()
        if release:
            self._release_rows(release, now)
        if out.state is core.State.FAILED:
            for msg in on_failed:
                self.enqueue_now(msg, now)
            for op in on_failed_also:
                op()
        return out

    def retry(self, owner: str, message_id: str, error: str, now: float, *,
              permanent: bool = False, release: Sequence[str] = (),
              on_failed: Sequence[NewMessage] = (),
              on_failed_also: Sequence[Callable[[], object]] = ()) -> core.FailureOutcome:
        """Record a failed attempt: back to pending with backoff, or ``failed`` at the limit.

        ``release`` names other rows of the same turn (steering) handed back
        unrun; ``on_failed`` messages are enqueued in the same transaction
        (with the ``on_failed_also`` operations) only if this attempt makes the
        row ``failed``.
        """
        return self.submit_retry(owner, message_id, error, now, permanent=permanent,
                                 release=release, on_failed=on_failed,
                                 on_failed_also=on_failed_also).result(WRITE_TIMEOUT)

    def submit_retry(self, owner: str, message_id: str, error: str, now: float, *,
                     permanent: bool = False, release: Sequence[str] = (),
                     on_failed: Sequence[NewMessage] = (),
                     on_failed_also: Sequence[Callable[[], object]] = ()
                     ) -> Reply[core.FailureOutcome]:
        """:meth:`retry` without waiting: the reply answers once it committed."""
        rel, msgs, ops = list(release), list(on_failed), list(on_failed_also)
        return self.writer.submit(
            lambda: self._retry_op(owner, message_id, error, now, permanent, rel, msgs, ops))

    def _release_rows(self, ids: list[str], now: float) -> None:
        m = self.t.inbox
        m.update(status=core.PENDING, lease_owner=None, lease_until=None,
                 turn_started_at=None, updated_at=now).where(m.message_id.in_(ids)).execute()
        self.bulk.announce()  # handed back: other processes may claim them now

    def _release_one(self, item: set_wise.Release) -> None:
        owner, ids, now = item
        for row in self._fence(owner, ids):
            core.transition(row.message_id, row.status, core.Event.RELEASE)
        self._release_rows(ids, now)

    def release(self, owner: str, message_ids: Sequence[str], now: float) -> None:
        """Hand leased rows back unrun (no attempt counted).

        Set-wise with the other releases of its batch; refused with :class:`LeaseLost`
        if ``owner`` lost a lease."""
        self.writer.call_bulk(self._releases, (owner, list(message_ids), now))
