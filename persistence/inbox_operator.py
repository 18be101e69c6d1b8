"""An operator's changes to inbox rows: requeue a failed row, cancel a pending one (or
every pending one of a kind, for the user's setting that makes them moot).

Each change is checked by the state machine (:mod:`.inbox_core`), applies only to the
state it was checked against, and is kept in the row's history; the rows it makes due are
announced, so a dispatcher in this or another process claims them. A part of
:class:`~.journal.Journal`, kept apart from the delivery path it does not take part in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from . import inbox_core as core
from .bulk_sql import BulkSql
from .errors import IllegalTransition, RowNotFound
from .inbox_reads import row_to_dict
from .models import InboxMessage, Tables
from .writer import GroupCommitWriter

REQUEUE_BATCH = 200
"""How many rows an operator's requeue changes in one transaction (about 0.15 s of the
write lock on this machine's SQLite: the delivering runtime's writes wait no longer)."""


class InboxOperator:
    """Requeue and cancel through the writer, a row (or a batch of rows) a transaction."""

    t: Tables
    writer: GroupCommitWriter
    bulk: BulkSql

    def _operator_op(self, message_id: str, now: float, event: core.Event, recorded: str,
                     detail: Callable[[InboxMessage], str | None],
                     changes: dict[str, Any]) -> dict[str, Any]:
        """An operator's change to one row: checked by the state machine, kept in history.

        The change applies only to the state it was checked against: on PostgreSQL another
        process may move the row between the read and the write (a worker delivering it,
        another operator requeueing it), and the check then runs again on what it became."""
        m = self.t.inbox
        while True:
            row = m.get_or_none(m.message_id == message_id)
            if row is None:
                raise RowNotFound("inbox row", message_id)
            core.transition(message_id, row.status, event)
            if m.update(updated_at=now, **changes).where(
                    (m.message_id == message_id) & (m.status == row.status)).execute():
                break
        self.t.event.insert(message_id=message_id, at=now, attempts=row.attempts,
                            event=recorded, detail=detail(row)).execute()
        self.bulk.announce()  # a requeued row, or the one behind a cancelled head, is due
        return row_to_dict(m.get(m.message_id == message_id))

    def _requeue_op(self, message_id: str, now: float) -> dict[str, Any]:
        return self._operator_op(message_id, now, core.Event.REQUEUE, "requeued",
                                 lambda row: row.last_error,
                                 {"status": core.PENDING, "attempts": 0,
                                  "available_at": now})

    def requeue(self, message_id: str, now: float, *,
                also: Callable[[list[str]], object] | None = None) -> dict[str, Any]:
        """Operator: put a ``failed`` row back to ``pending`` (attempts reset, history kept);
        ``also`` runs in the same transaction with its id (what the requeue reopens)."""
        def op() -> dict[str, Any]:
            row = self._requeue_op(message_id, now)
            if also is not None:
                also([message_id])
            return row
        return self.writer.call(op)

    def requeue_where(self, now: float, *, target: str | None = None,
                      kind: str | None = None,
                      also: Callable[[list[str]], object] | None = None) -> list[str]:
        """Operator: requeue every ``failed`` row matching the filter, oldest first; the ids
        requeued (:meth:`requeue_steps`, run to its end)."""
        return [mid for ids in self.requeue_steps(now, target=target, kind=kind, also=also)
                for mid in ids]

    def requeue_steps(self, now: float, *, target: str | None = None,
                      kind: str | None = None,
                      also: Callable[[list[str]], object] | None = None
                      ) -> Iterator[list[str]]:
        """:meth:`requeue_where` one batch at a time: each batch's ids once it committed,
        so a caller that stops between two (an operator's Ctrl-C) knows what went back.

        In batches of :data:`REQUEUE_BATCH` rows, each its own transaction (with ``also``,
        given the batch's ids): in one transaction, 20,000 rows held the write lock (on
        SQLite the whole file's, from the delivering runtime too) for 14 s, and a larger
        requeue outran its caller's wait. A requeue that fails part-way has requeued the
        batches yielded before it; running it again requeues the rest.

        On PostgreSQL another process may end a row between this read and its requeue
        (another operator's cancel or requeue): that row is no longer failed and is left as
        it is now, not a refusal of the whole requeue (which requeued none of the rest)."""
        m = self.t.inbox

        def batch(after: int) -> tuple[int | None, list[str]]:
            q = m.select(m.message_id, m.seq).where((m.status == core.FAILED) & (m.seq > after))
            if target is not None:
                q = q.where(m.target_chat_id == target)
            if kind is not None:
                q = q.where(m.kind == kind)
            found = [(r.message_id, r.seq) for r in q.order_by(m.seq).limit(REQUEUE_BATCH)]
            ids: list[str] = []
            for mid, _seq in found:
                try:
                    self._requeue_op(mid, now)
                except (IllegalTransition, RowNotFound):
                    continue  # refused before any write: it moved on since the read
                ids.append(mid)
            if also is not None and ids:
                also(ids)
            return (found[-1][1] if found else None), ids

        after = 0
        while True:
            last, ids = self.writer.call(lambda after=after: batch(after))
            if last is None:
                return
            yield ids
            after = last

    def _cancel_op(self, message_id: str, now: float, by: str, reason: str) -> dict[str, Any]:
        return self._operator_op(message_id, now, core.Event.CANCEL, "cancelled",
                                 lambda row: f"by {by}: {reason}"[:2000],
                                 {"status": core.CANCELLED, "lease_owner": None,
                                  "lease_until": None})

    def cancel(self, message_id: str, now: float, *, by: str, reason: str,
               also: Callable[[list[str]], object] | None = None) -> dict[str, Any]:
        """Operator: give up on a ``pending`` or ``failed`` row (terminal ``cancelled``);
        ``also`` runs in the same transaction with its id (what the row's end tells).

        Who and why are kept in the row's history. The rows queued behind it
        for the same target move up, so one bad message stops holding its
        session back.
        """
        def op() -> dict[str, Any]:
            row = self._cancel_op(message_id, now, by, reason)
            if also is not None:
                also([message_id])
            return row
        return self.writer.call(op)

    def cancel_pending_now(self, target: str, kind: str, now: float, *, by: str,
                           reason: str, only: Callable[[str], bool] | None = None
                           ) -> list[str]:
        """Give up on every ``pending`` row of ``kind`` to ``target`` (of those, the ids
        ``only`` takes, when given) inside the caller's transaction (a writer operation),
        as :meth:`cancel` does one; the ids cancelled. A row that is running
        (``processing``, on PostgreSQL claimed by another process between the read and
        the write) is left to its turn."""
        m = self.t.inbox
        ids = [r.message_id for r in m.select(m.message_id).where(
            (m.target_chat_id == target) & (m.kind == kind)
            & (m.status == core.PENDING)).order_by(m.seq)
            if only is None or only(r.message_id)]
        cancelled = []
        for message_id in ids:
            try:
                self._cancel_op(message_id, now, by, reason)
            except IllegalTransition:
                continue
            cancelled.append(message_id)
        return cancelled
