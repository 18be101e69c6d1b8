"""Leasing rows into a turn that runs: steering (the target's next due rows) and one row
the turn names (a foreground child's result), each fenced by what proves the turn is still
its owner's: the turn's own row, or for a turn no row started (a cron run's, a social
event's) its session's direct-turn mark. A part of :class:`~.journal.Journal`.
"""

from __future__ import annotations

from collections.abc import Callable

import peewee as pw

from . import inbox_core as core
from .bulk_sql import BulkSql
from .hot_path import HotPath, is_open
from .inbox_claims import DEFAULT_LEASE_SECONDS, claimed_row
from .inbox_records import ClaimedRow
from .models import InboxMessage, Tables
from .writer import WRITE_TIMEOUT, GroupCommitWriter, Reply


class SteeringClaims:
    """Rows leased into a running turn, through the writer."""

    t: Tables
    writer: GroupCommitWriter
    hot: HotPath
    bulk: BulkSql

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
            if r.status == core.PROCESSING and r.lease_owner == owner:
                # Already this turn's (one row in flight per target): a row it took by
                # name (a foreground child's result, :meth:`claim_row`) after the rows
                # steering took. Stopping at it, steering gave the turn nothing after it.
                continue
            # Contiguous rows a commit may chain only, so per-target order holds: pending,
            # due, and not suspect (a row taken over runs alone, its death its own).
            if not core.chains(r.status, r.available_at, r.lease_until, now, bool(r.suspect)):
                break
            taken.append(r)
        if taken:
            m.update(status=core.PROCESSING, lease_owner=owner,
                     lease_until=now + lease, updated_at=now).where(
                m.message_id.in_([r.message_id for r in taken]),
                m.status == core.PENDING).execute()
        return [claimed_row(r) for r in taken]

    def _holds(self, owner: str, turn_row: str) -> bool:
        """Does ``owner`` still hold the running turn's own row (read under the fence's
        lock on PostgreSQL)? What leases a row into a turn is fenced by it."""
        held = self.hot.fence_rows([turn_row]).get(turn_row)
        return held is not None and held[0] == core.PROCESSING and held[1] == owner

    def _marks(self, owner: str, target: str, turn_id: str) -> bool:
        """Does the direct turn ``turn_id`` of ``owner`` still mark ``target`` (read under
        the session row's lock on PostgreSQL, which ending the mark takes too)?"""
        s = self.t.session
        query = s.select(s.turn_owner, s.turn_id).where(s.id == target)
        row = (query.for_update() if self.bulk.postgres else query).first()
        return row is not None and row.turn_owner == owner and row.turn_id == turn_id

    def _claim_row_op(self, owner: str, target: str, holds: Callable[[], bool],
                      message_id: str, now: float, lease: float) -> ClaimedRow | None:
        m = self.t.inbox
        if not holds():
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
        return claimed_row(row)

    def submit_claim_row(self, owner: str, target: str, turn_row: str, message_id: str,
                         now: float, *, lease: float = DEFAULT_LEASE_SECONDS
                         ) -> Reply[ClaimedRow | None]:
        """Queue a lease of the one row ``message_id`` of ``target`` into the running turn
        of ``turn_row`` (:meth:`submit_claim_more`'s fence and lease, for a row the turn
        asks for by name: a foreground child's result, which the turn already has); the
        reply holds the row, or None unless ``owner`` still holds ``turn_row`` and the row
        is the target's and claimable.

        A lease into a turn must be waited for until it lands or fails (a
        :class:`~.errors.WriteTimeout` not ``withdrawn`` may land yet): taken as refused,
        the row it leased was no part of the turn, and nothing ran or handed it back
        until its lease ran out."""
        return self.writer.submit(lambda: self._claim_row_op(
            owner, target, lambda: self._holds(owner, turn_row), message_id, now, lease))

    def claim_row(self, owner: str, target: str, turn_row: str, message_id: str, now: float,
                  *, lease: float = DEFAULT_LEASE_SECONDS) -> ClaimedRow | None:
        """:meth:`submit_claim_row`, waited for (:data:`~.writer.WRITE_TIMEOUT`)."""
        return self.submit_claim_row(owner, target, turn_row, message_id, now,
                                     lease=lease).result(WRITE_TIMEOUT)

    def submit_claim_row_into_direct_turn(self, owner: str, target: str, turn_id: str,
                                          message_id: str, now: float, *,
                                          lease: float = DEFAULT_LEASE_SECONDS
                                          ) -> Reply[ClaimedRow | None]:
        """:meth:`submit_claim_row` for a turn no inbox row started (a cron run's, a social
        event's), fenced by the session's direct-turn mark of ``owner`` and ``turn_id``
        (:meth:`~.sessions.SessionStore.take_direct_turn`): None unless it still holds."""
        return self.writer.submit(lambda: self._claim_row_op(
            owner, target, lambda: self._marks(owner, target, turn_id), message_id, now,
            lease))

    def submit_claim_more(self, owner: str, target: str, turn_row: str, after_seq: int,
                          now: float, *, lease: float = DEFAULT_LEASE_SECONDS,
                          limit: int = 100) -> Reply[list[ClaimedRow]]:
        """Queue a lease of the target's next due rows after ``after_seq`` (steering into
        the running turn of ``turn_row``): none unless ``owner`` still holds ``turn_row``.
        Waited for until it lands or fails, as :meth:`submit_claim_row` says."""
        return self.writer.submit(
            lambda: self._claim_more_op(owner, target, turn_row, after_seq, now, lease, limit))

    def claim_more(self, owner: str, target: str, turn_row: str, after_seq: int, now: float,
                   *, lease: float = DEFAULT_LEASE_SECONDS,
                   limit: int = 100) -> list[ClaimedRow]:
        """:meth:`submit_claim_more`, waited for (:data:`~.writer.WRITE_TIMEOUT`)."""
        return self.submit_claim_more(owner, target, turn_row, after_seq, now, lease=lease,
                                      limit=limit).result(WRITE_TIMEOUT)
