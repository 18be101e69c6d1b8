"""The durable inbox: every message to an actor is a row here before anyone hears of it.

The journal is the mailbox mirror of DESIGN.md: a session's mailbox is its
open rows, the dispatcher's mailbox is the set of due rows. Every write goes
through the :class:`~.writer.GroupCommitWriter` (but a claim on PostgreSQL,
a short transaction of its own: see :meth:`Journal.claim`), so a caller
that gets a result back knows its change is committed. The rules (states, backoff,
fencing, idempotency) live in :mod:`.inbox_core`; this module applies them
to rows: enqueues and a turn's outcomes here, leases in :mod:`.inbox_claims`, an
operator's changes in :mod:`.inbox_operator`, reads in :mod:`.inbox_reads`.

Ordering: each row gets a ``seq`` in the enqueue transaction; a target's
rows are delivered in ``seq`` order, and only the oldest open row of a
target (its *head*) can be claimed, which gives one row in flight per
target across processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import inbox_core as core
from . import set_wise
from .bulk_sql import BulkSql
from .errors import IdempotencyConflict
from .hot_path import HotPath
from .inbox_claims import DEFAULT_LEASE_SECONDS, InboxClaims
from .inbox_operator import InboxOperator
from .inbox_prune import InboxPrune, PruneBatch, PruneCounts
from .inbox_reads import InboxReads
from .inbox_records import (
    ClaimedRow,
    ClaimResult,
    EnqueueResult,
    Lease,
    NewMessage,
    TurnCommit,
    TurnEntry,
    entry_row,
    fingerprint,
)
from .models import Tables
from .steering_claims import SteeringClaims
from .writer import WRITE_TIMEOUT, Bulk, GroupCommitWriter, Reply

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "ClaimResult",
    "ClaimedRow",
    "EnqueueResult",
    "Journal",
    "NewMessage",
    "PruneBatch",
    "PruneCounts",
    "TurnEntry",
]


class Journal(InboxReads, InboxClaims, SteeringClaims, InboxOperator, InboxPrune):
    """Inbox operations on one database; writes are group-committed, reads are direct."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer
        self.hot = HotPath(tables.db)
        self.bulk = bulk = BulkSql(self.hot)
        self._enqueues: Bulk[set_wise.Enqueue, EnqueueResult] = Bulk(
            "enqueue",
            lambda item: self.enqueue_now(*item),
            lambda items: set_wise.enqueue_all(bulk, items),
        )
        self._releases: Bulk[set_wise.Release, None] = Bulk(
            "release", self._release_one, lambda items: set_wise.release_all(bulk, items)
        )
        self._commits: Bulk[TurnCommit, ClaimedRow | None] = Bulk(
            "turn commit", self._commit_one, lambda items: set_wise.commit_all(bulk, items)
        )

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue_now(self, msg: NewMessage, now: float, lease: Lease | None = None) -> EnqueueResult:
        """Enqueue inside the caller's transaction (on the writer thread)."""
        try:
            return self._enqueue_new(msg, now, lease)
        except set_wise.OneByOne:
            # Another process wrote the id between the read and the insert (two runtimes
            # reporting one orphaned task at their start): judge it against that row.
            return self._enqueue_new(msg, now, lease)

    def _enqueue_new(self, msg: NewMessage, now: float, lease: Lease | None) -> EnqueueResult:
        """The idempotence rule against the row ``msg``'s id has, if any; else insert it."""
        existing = self.hot.existing(msg.message_id)
        if existing is None:  # the common case: no fingerprint to take (a payload's JSON)
            return set_wise.insert_new(self.bulk, [(msg, now, lease)])[0]
        # A repeat, or IdempotencyConflict: an id the journal holds is never a new row.
        created = core.enqueue_decision(msg.message_id, existing.fingerprint(), fingerprint(msg))
        assert not created
        return EnqueueResult(
            msg.message_id, msg.target, existing.status, False, existing.created_at
        )

    def enqueue(self, msg: NewMessage, now: float, *, lease: Lease | None = None) -> EnqueueResult:
        """Write ``msg`` and commit; return once it is durable.

        An id the journal holds is judged by the idempotence rule (I2); an id whose row
        was pruned (:mod:`.inbox_prune`) is new again: de-duplication lasts as long as
        the retention keeps rows.

        With ``lease`` (the fast path), a new row that is its target's head is leased in
        the same transaction and comes back as ``claimed``, for the caller to hand straight
        to its session: only for an owner that provably owns its targets (see
        :func:`.set_wise.heads_to_lease`)."""
        return self.writer.call_bulk(self._enqueues, (msg, now, lease))

    def submit_enqueue(
        self, msg: NewMessage, now: float, *, lease: Lease | None = None
    ) -> Reply[EnqueueResult]:
        """:meth:`enqueue` without waiting: the reply answers once the row is durable (for
        a caller that must act on a late answer too: a row leased with it)."""
        return self.writer.submit_bulk(self._enqueues, (msg, now, lease))

    def enqueue_many(self, msgs: Sequence[NewMessage], now: float) -> list[EnqueueResult]:
        """Enqueue several messages in one transaction (all or, on conflict, an error)."""
        return self.writer.call(lambda: self._enqueue_many_op(list(msgs), now))

    def _enqueue_many_op(self, msgs: list[NewMessage], now: float) -> list[EnqueueResult]:
        done: list[EnqueueResult] = []
        for result in self.enqueue_each_now(msgs, now):
            if isinstance(result, IdempotencyConflict):
                raise result
            done.append(result)
        return done

    def enqueue_each_now(
        self, msgs: Sequence[NewMessage], now: float
    ) -> list[EnqueueResult | IdempotencyConflict]:
        """Enqueue several messages inside the caller's transaction (on the writer thread),
        each by the idempotence rule: its result, ``created`` False for a repeat, or the
        :class:`IdempotencyConflict` of an id used for other content (nothing written for
        it, the others written). All new: one INSERT. Else that INSERT is undone before
        they go one by one: the rows it wrote would be read as repeats, new ones too."""
        items: list[set_wise.Enqueue] = [(msg, now, None) for msg in msgs]
        try:
            with self.t.db.atomic():  # undone alone if it must go one by one
                return list(set_wise.enqueue_all(self.bulk, items))
        except set_wise.OneByOne:  # a repeated id: each message by the idempotence rule
            pass
        out: list[EnqueueResult | IdempotencyConflict] = []
        for msg in msgs:
            try:
                out.append(self.enqueue_now(msg, now))
            except IdempotencyConflict as exc:
                out.append(exc)
        return out

    # -- outcomes --------------------------------------------------------------------------

    def _claim_next_op(
        self, owner: str, target: str, now: float, lease: float
    ) -> ClaimedRow | None:
        """Lease the target's new head if it is due (inside the ack's transaction); on
        PostgreSQL not while a direct turn marks the session (see ``pg_commits``)."""
        if self.bulk.postgres and self.hot.marked(target):
            return None
        while True:
            head = self.hot.head(target)
            if head is None or not core.chains(
                head.status, head.available_at, head.lease_until, now, bool(head.suspect)
            ):
                return None
            if not self.hot.lease(head.message_id, owner, now + lease, now):
                return None  # another worker took it first
            if not self.hot.has_marker(head.message_id):
                return ClaimedRow.from_head(head)
            self.hot.mark_delivered([head.message_id], now)  # its turn had committed

    def write_turn(
        self, session_id: str, ids: Sequence[str], entries: Sequence[TurnEntry], now: float
    ) -> None:
        """A turn's transcript entries and its delivery markers, inside the caller's
        transaction (no fence, no ack: those are the commit's, see ``complete_turn``)."""
        self.bulk.insert_entries([entry_row(session_id, e, now) for e in entries])
        self.bulk.insert_markers([(session_id, mid, now) for mid in ids])

    def _complete_op(
        self,
        owner: str,
        session_id: str,
        ids: list[str],
        entries: Sequence[TurnEntry],
        now: float,
        enqueue: Sequence[NewMessage],
        also: Sequence[Callable[[], object]],
        next_lease: float | None = None,
    ) -> ClaimedRow | None:
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

    def complete_turn(
        self,
        owner: str,
        session_id: str,
        message_ids: Sequence[str],
        entries: Sequence[TurnEntry],
        now: float,
        *,
        enqueue: Sequence[NewMessage] = (),
        also: Sequence[Callable[[], object]] = (),
        next_lease: float | None = None,
    ) -> ClaimedRow | None:
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
        return self.submit_turn(
            owner,
            session_id,
            message_ids,
            entries,
            now,
            enqueue=enqueue,
            also=also,
            next_lease=next_lease,
        ).result(WRITE_TIMEOUT)

    def submit_turn(
        self,
        owner: str,
        session_id: str,
        message_ids: Sequence[str],
        entries: Sequence[TurnEntry],
        now: float,
        *,
        enqueue: Sequence[NewMessage] = (),
        also: Sequence[Callable[[], object]] = (),
        next_lease: float | None = None,
    ) -> Reply[ClaimedRow | None]:
        """:meth:`complete_turn` without waiting: the reply answers once it committed (for
        event-loop callers, which must not block on the commit)."""
        ids = list(message_ids)
        if not enqueue and not also:  # a plain turn: may commit set-wise
            return self.writer.submit_bulk(
                self._commits, TurnCommit(owner, session_id, ids, entries, now, next_lease)
            )
        msgs, ops = list(enqueue), list(also)
        return self.writer.submit(
            lambda: self._complete_op(owner, session_id, ids, entries, now, msgs, ops, next_lease)
        )

    def _commit_one(self, c: TurnCommit) -> ClaimedRow | None:
        return self._complete_op(
            c.owner, c.session_id, c.message_ids, c.entries, c.now, (), (), c.next_lease
        )

    def _ack_op(self, owner: str, ids: list[str], now: float) -> None:
        for row in self._fence(owner, ids):
            core.transition(row.message_id, row.status, core.Event.ACK)
        self.hot.mark_delivered(ids, now)

    def ack(self, owner: str, message_ids: Sequence[str], now: float) -> None:
        """Mark rows delivered without a turn (fenced)."""
        ids = list(message_ids)
        self.writer.call(lambda: self._ack_op(owner, ids, now))

    def _retry_op(
        self,
        owner: str,
        message_id: str,
        error: str,
        now: float,
        permanent: bool,
        retry_after: float | None,
        release: list[str],
        on_failed: Sequence[NewMessage],
        on_failed_also: Sequence[Callable[[], object]],
        ran: bool = True,
    ) -> core.FailureOutcome:
        row = self._fence(owner, [message_id, *release])[0]
        policy = core.policy_for(row.transport)
        out = core.after_failure(
            row.attempts,
            row.max_attempts,
            policy.cap,
            now,
            permanent=permanent,
            retry_after=retry_after,
        )
        core.transition(
            message_id,
            row.status,
            core.Event.FAIL if out.state is core.State.FAILED else core.Event.RETRY,
        )
        m = self.t.inbox
        changes: dict[str, Any] = {
            "status": out.state.value,
            "attempts": out.attempts,
            "available_at": out.available_at,
            "last_error": core.clip_error(error),
            "lease_owner": None,
            "lease_until": None,
            "turn_started_at": None,
            "updated_at": now,
        }
        if ran:  # a turn that ran and ended did not kill its process: no longer suspect
            changes["suspect"] = False
        m.update(**changes).where(m.message_id == message_id).execute()
        self.t.event.insert(
            message_id=message_id,
            at=now,
            attempts=out.attempts,
            event="failed" if out.state is core.State.FAILED else "retry",
            detail=core.clip_error(error),
        ).execute()
        if release:
            self._release_rows(release, now)
        if out.state is core.State.FAILED:
            for msg in on_failed:
                self.enqueue_now(msg, now)
            for op in on_failed_also:
                op()
        return out

    def retry(
        self,
        owner: str,
        message_id: str,
        error: str,
        now: float,
        *,
        permanent: bool = False,
        retry_after: float | None = None,
        release: Sequence[str] = (),
        on_failed: Sequence[NewMessage] = (),
        on_failed_also: Sequence[Callable[[], object]] = (),
        ran: bool = True,
    ) -> core.FailureOutcome:
        """Record a failed attempt: back to pending with backoff, or ``failed`` at the limit.

        ``release`` names other rows of the same turn (steering) handed back
        unrun; ``on_failed`` messages are enqueued in the same transaction
        (with the ``on_failed_also`` operations) only if this attempt makes the
        row ``failed``. ``permanent`` fails it at once; ``retry_after`` (seconds) is the
        least wait before its retry (:func:`~.inbox_core.after_failure`). ``ran``: the
        turn ran; a suspect row (taken over from a worker that died mid-turn) whose turn
        never started (its start was refused) stays suspect, to run alone next time.
        """
        return self.submit_retry(
            owner,
            message_id,
            error,
            now,
            permanent=permanent,
            retry_after=retry_after,
            release=release,
            on_failed=on_failed,
            on_failed_also=on_failed_also,
            ran=ran,
        ).result(WRITE_TIMEOUT)

    def submit_retry(
        self,
        owner: str,
        message_id: str,
        error: str,
        now: float,
        *,
        permanent: bool = False,
        retry_after: float | None = None,
        release: Sequence[str] = (),
        on_failed: Sequence[NewMessage] = (),
        on_failed_also: Sequence[Callable[[], object]] = (),
        ran: bool = True,
    ) -> Reply[core.FailureOutcome]:
        """:meth:`retry` without waiting: the reply answers once it committed."""
        rel, msgs, ops = list(release), list(on_failed), list(on_failed_also)
        return self.writer.submit(
            lambda: self._retry_op(
                owner, message_id, error, now, permanent, retry_after, rel, msgs, ops, ran
            )
        )

    def _release_rows(self, ids: list[str], now: float, available_at: float | None = None) -> None:
        m = self.t.inbox
        changes: dict[str, Any] = {
            "status": core.PENDING,
            "lease_owner": None,
            "lease_until": None,
            "turn_started_at": None,
            "updated_at": now,
        }
        if available_at is not None:
            changes["available_at"] = available_at
        m.update(**changes).where(m.message_id.in_(ids)).execute()
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

    def release_until(self, owner: str, message_ids: Sequence[str], now: float,
                      due: float) -> None:
        """Hand leased rows back unrun (no attempt counted), due no sooner than ``due``:
        their receiver is busy and asked to be tried then (a peer's ``503 busy``), which is
        no failure of theirs. Refused with :class:`LeaseLost` if ``owner`` lost a lease."""
        ids = list(message_ids)

        def op() -> None:
            for row in self._fence(owner, ids):
                core.transition(row.message_id, row.status, core.Event.RELEASE)
            self._release_rows(ids, now, due)

        self.writer.call(op)

    def release_later(self, owner: str, message_id: str, now: float) -> float:
        """Hand a leased row back unrun (no attempt counted), due only after the backoff
        of the failed attempt whose record the database refused
        (:func:`~.inbox_core.after_unrecorded_failure`); when it is due. Refused with
        :class:`LeaseLost` if ``owner`` lost its lease."""

        def op() -> float:
            row = self._fence(owner, [message_id])[0]
            core.transition(message_id, row.status, core.Event.RELEASE)
            cap = core.policy_for(row.transport).cap
            due = core.after_unrecorded_failure(row.attempts, cap, now)
            self._release_rows([message_id], now, due)
            return due

        return self.writer.call(op)
