"""Leases on inbox rows: claims, takeovers, renewal, fencing.

A worker may run a row only while it holds the row's lease; every write about a row's
outcome is fenced by it (:meth:`InboxClaims._fence`). A claim leases due head rows (one
per target, so one row in flight per target across processes), counts an interrupted
turn when it takes over a dead worker's lease, and acknowledges rows whose turn had
committed already (their delivery marker). Rows leased into a turn that runs (steering,
a foreground child's result) are :mod:`.steering_claims`'. A part of
:class:`~.journal.Journal`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace

from . import inbox_core as core
from . import set_wise
from .batch_run import may_run_again
from .bulk_sql import BulkSql
from .errors import DatabaseFailed, LeaseLost, PersistenceError, RowNotFound, WriterClosed
from .hot_path import CLAIM_COLUMNS, Head, HotPath
from .inbox_records import ClaimedRow, ClaimResult, FenceRow
from .models import InboxMessage, Tables
from .stop_requests import forget_now
from .takeovers import record_takeover
from .writer import WRITE_TIMEOUT, Bulk, GroupCommitWriter, Reply

log = logging.getLogger("kinbox.journal")

DEFAULT_LEASE_SECONDS = 30.0
"""How long a claim holds a row before another worker may take it over."""


def claimed_row(row: InboxMessage) -> ClaimedRow:
    """A row read as a model, as a claim returns it."""
    return ClaimedRow.from_head(Head._make(getattr(row, c) for c in CLAIM_COLUMNS))


class InboxClaims:
    """Claims and leases, through the writer (on PostgreSQL a claim runs beside it)."""

    t: Tables
    writer: GroupCommitWriter
    hot: HotPath
    bulk: BulkSql
    _releases: Bulk[set_wise.Release, None]

    def committed_of(self, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` already have a committed turn (their delivery marker, I6)."""
        return self.hot.with_markers(ids)

    def _claim_op(self, owner: str, now: float, lease: float, limit: int,
                  exclude: frozenset[str], transport: str, suspects: int) -> ClaimResult:
        known: set[str] | None = None  # PostgreSQL's lock reads the markers too
        if self.bulk.pg is not None:  # excluded targets are left out by the walk itself
            heads, known = self.bulk.pg.due_heads(transport, now, limit, sorted(exclude))
        else:
            heads = self._due_heads(transport, now, limit, exclude, suspects)
        candidates = [h for h in heads if h.target_chat_id not in exclude]
        taken, held_back = core.pick_heads(
            (core.is_suspect(h.status, bool(h.suspect)) for h in candidates), limit, suspects)
        picked = [candidates[i] for i in taken]
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

    def _due_heads(self, transport: str, now: float, limit: int, exclude: frozenset[str],
                   suspects: int) -> list[Head]:
        """SQLite: the due heads, oldest first, enough of them that ``limit`` may be picked
        past the ones a claim leaves: the excluded targets' and the suspects past its share
        of ``suspects``. Read as ``limit`` plus the excluded alone, the window could be all
        suspects (a dead worker's turns, older than what came after them), and the plain
        heads behind them waited until those had run one at a time. Read again, wider,
        only when suspects held rows back from a full window."""
        window = limit + len(exclude)
        while True:
            heads = self.hot.due_heads(transport, now, window)
            crowding = sum(1 for h in heads if h.target_chat_id not in exclude
                           and core.is_suspect(h.status, bool(h.suspect)))
            room = limit + len(exclude) + max(0, crowding - suspects)
            if len(heads) < window or room <= window:
                return heads
            window = room

    def _count_interrupted(self, ids: list[str], now: float) -> dict[str, int]:
        """Takeovers: message id -> attempts now, or -1 for a row that thereby reached its
        limit and is ``failed`` (not claimed). Only a turn that had started counts."""
        found: dict[str, int] = {}
        m = self.t.inbox
        # The stops asked of these rows' turns named turns that are over (their worker
        # died): left under the row's id, the claiming process carried one out on the
        # row's new turn as it began, which committed the message with nothing done.
        forget_now(self.t, ids)
        started = {r.message_id for r in m.select(m.message_id).where(
            m.message_id.in_(ids), m.turn_started_at.is_null(False))}
        for row in self._rows_for_fencing(ids):
            if row.message_id not in started:
                found[row.message_id] = row.attempts  # killed before its brain ran
                m.update(suspect=True).where(m.message_id == row.message_id).execute()
                continue
            decision = core.after_takeover(row.attempts, row.max_attempts, row.lease_owner,
                                           now, cap=core.policy_for(row.transport).cap,
                                           runs_now=True)
            # Read under the claim's lock as the head it leases: no fence beyond that.
            done = record_takeover(self.t, row.message_id, row.status, decision, now)
            if done is not None:
                found[row.message_id] = -1 if done.failed else done.attempts
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

        A try that PostgreSQL aborted to resolve a conflict (a deadlock, a serialization
        failure: ``DatabaseFailed.retryable``) runs again at once, up to
        :data:`~.batch_run.CONFLICT_RETRIES` times, as the writer's operations do; then the
        caller gets the error. Nothing of a failed try stays: its transaction rolled
        back whole, and the leases that committed before it are handed back.
        """
        ex = frozenset(exclude)

        def op() -> ClaimResult:
            return self._claim_op(owner, now, lease, limit, ex, transport, suspects)
        if self.bulk.pg is None:
            # A claim whose batch outran the wait may commit yet: its rows must run.
            return self.writer.call_landed(op)
        tries = 0
        while True:
            if self.writer.closed:  # a stopped runtime leases nothing more
                raise WriterClosed("the writer is stopped; no more claims")
            try:
                return self._claim_pg(owner, now, lease, limit, ex, transport, suspects)
            except DatabaseFailed as exc:
                # A deadlock or a serialization failure undid the claim's statement or
                # transaction whole (and _claim_pg handed back what had committed before
                # it): the same claim in a new transaction may well succeed, as the
                # writer's operations are run again. Not the dispatcher's tick later: it
                # may be far away, and every claim of a busy table may meet a conflict.
                if not may_run_again(exc, tries):
                    raise
                tries += 1
                log.debug("a claim was aborted with SQLSTATE %s; claiming again",
                          exc.sqlstate)

    def _claim_pg(self, owner: str, now: float, lease: float, limit: int,
                  ex: frozenset[str], transport: str, suspects: int) -> ClaimResult:
        """One try of :meth:`claim` on PostgreSQL, on the caller's connection: leases that
        committed before a failure are handed back, so a failed try leaves nothing."""
        assert self.bulk.pg is not None
        # The common rows in two statements (pg_claims); what needs more by the full rules.
        plain = self.bulk.pg.claim_plain(owner, transport, now, now + lease, limit, sorted(ex),
                                         suspects)
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
            self.hand_back(owner, [r.message_id for r in leased], now)
            raise

    def hand_back(self, owner: str, ids: list[str], now: float) -> None:
        """Release ``ids``, leased to ``owner`` for turns that will not run (a claim that
        then failed; rows a stopping runtime held for a free slot), never raising for a
        row: a release that fails leaves its row to its lease (logged; the caller's own
        error, if any, is the one raised). An item each, in one batch under one wait: a
        row handed back already (its answer lost with the connection) or no longer
        ``owner``'s is refused alone, set-wise (:func:`.set_wise.release_all`), and the
        others go back. :class:`WriterClosed` if the writer takes no more writes."""
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
            log.warning("could not hand back %d leased rows (%s); they come back when "
                        "their lease runs out", len(kept), kept[0])

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

    def leases_of(self, owner: str, transport: str = "local") -> list[tuple[str, str, float]]:
        """(message id, target, lease end) of the ``transport`` rows ``owner`` holds the
        lease of (the dispatcher's, by default)."""
        m = self.t.inbox
        return [(r.message_id, r.target_chat_id, r.lease_until) for r in m.select(
            m.message_id, m.target_chat_id, m.lease_until).where(
            m.status == core.PROCESSING, m.lease_owner == owner, m.transport == transport)]

    def lease_owners(self) -> set[str]:
        """The owners holding leases on processing rows now."""
        m = self.t.inbox
        return {r.lease_owner for r in m.select(m.lease_owner).distinct().where(
            m.status == core.PROCESSING, m.lease_owner.is_null(False))}

    def _fence(self, owner: str, ids: Sequence[str]) -> list[FenceRow]:
        rows = self.hot.fence_rows(ids)
        for mid in ids:
            row = rows.get(mid)
            if row is None:
                raise RowNotFound("inbox row", mid)
            core.check_lease(mid, row[0], row[1], owner)
        return [FenceRow(i, *rows[i]) for i in ids]
