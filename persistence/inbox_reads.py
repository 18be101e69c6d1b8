"""The read side of the inbox: rows, history, counts and the idle check.

Reads run on the caller's thread with its own connection; they never wait
for the writer, so an operator's listing does not slow deliveries down.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import peewee as pw

from . import inbox_core as core
from . import paging
from .errors import RowNotFound
from .hot_path import HotPath, is_open
from .models import InboxMessage, Tables
from .read_snapshot import read_snapshot

FAILED_ATTEMPT_EVENTS = ("retry", "failed", "interrupted")
"""The history events of a failed attempt (the others are an operator's)."""

FAILURE_COUNT_CHUNK = 500
"""Message ids per query of :meth:`InboxReads.failure_counts`."""


def row_to_dict(row: InboxMessage) -> dict[str, Any]:
    """An inbox row as a plain dict (payload decoded)."""
    data = {f.name: getattr(row, f.name) for f in row._meta.sorted_fields}
    data["payload"] = json.loads(row.payload or "{}")
    return data


class InboxReads:
    """Queries over ``agent_inbox_messages`` and its history."""

    t: Tables
    hot: HotPath

    def get(self, message_id: str) -> dict[str, Any]:
        """One row as a dict; :class:`RowNotFound` if absent."""
        m = self.t.inbox
        row = m.get_or_none(m.message_id == message_id)
        if row is None:
            raise RowNotFound("inbox row", message_id)
        return row_to_dict(row)

    def history(self, message_id: str) -> list[dict[str, Any]]:
        """The failures and operator actions recorded for a row, oldest first."""
        e = self.t.event
        return [{"at": x.at, "event": x.event, "attempts": x.attempts, "detail": x.detail}
                for x in e.select().where(e.message_id == message_id).order_by(e.id)]

    def get_with_history(self, message_id: str) -> dict[str, Any]:
        """One row as a dict (:meth:`get`) with its ``history`` (:meth:`history`), both
        read in one snapshot: a change committed between the two reads (a requeue, a
        failed attempt) would show the row as it was beside the history of what it
        became. :class:`RowNotFound` if absent."""
        with read_snapshot(self.t.db):
            row = self.get(message_id)
            row["history"] = self.history(message_id)
        return row

    def failure_counts(self, message_ids: Iterable[str]) -> dict[str, int]:
        """Failed attempts in each row's history, by message id (rows with none left out).

        A requeue resets a row's ``attempts``; its history keeps every failed attempt
        (``retry``, ``failed``, and ``interrupted``: a turn a takeover counted). Read in
        chunks, so that the query's parameters stay few however many rows."""
        e = self.t.event
        ids = list(message_ids)
        counts: dict[str, int] = {}
        for start in range(0, len(ids), FAILURE_COUNT_CHUNK):
            q = (e.select(e.message_id, pw.fn.COUNT(e.id).alias("n"))
                 .where(e.message_id.in_(ids[start:start + FAILURE_COUNT_CHUNK])
                        & e.event.in_(FAILED_ATTEMPT_EVENTS))
                 .group_by(e.message_id))
            counts.update({r.message_id: r.n for r in q})
        return counts

    def rows(self, *, state: str | None = None, target: str | None = None,
             limit: int | None = None, offset: int = 0,
             before_seq: int | None = None) -> list[dict[str, Any]]:
        """Rows in journal order, filtered by state and target; with ``limit``, the newest
        ``limit`` of them (an operator looks for what happened last) but the ``offset``
        newest (the page before: paging goes back in time, by ``seq``, which is unique).
        ``before_seq`` keeps only rows older than it: the page before one whose oldest
        row has that ``seq``, found through the primary order without reading the rows
        an offset would skip. Without ``limit``, every matching row is read. A bound
        outside :mod:`.paging`'s is :class:`~.errors.InvalidArgument`."""
        limit, offset = paging.limit(limit), paging.offset(offset)
        before_seq = paging.position(before_seq)
        m = self.t.inbox
        q = m.select().order_by(m.seq.desc())
        if state:
            q = q.where(m.status == state)
        if target is not None:
            q = q.where(m.target_chat_id == target)
        if before_seq is not None:
            q = q.where(m.seq < before_seq)
        return [row_to_dict(r) for r in reversed(list(paging.cut(q, limit, offset)))]

    def counts(self) -> dict[str, int]:
        """Rows per state."""
        m = self.t.inbox
        q = m.select(m.status, pw.fn.COUNT(m.message_id).alias("n")).group_by(m.status)
        return {r.status: r.n for r in q}

    def has_due(self, now: float, transport: str = "local") -> bool:
        """True when something can run now: a turn is in flight, or a target's head is due.

        Only heads count: a row waiting behind its target's head (in backoff,
        say) cannot run before the head, so it does not make the runtime busy.
        """
        return self.hot.has_runnable(transport, now)

    def next_due(self, transport: str = "local") -> float | None:
        """The earliest time a pending row becomes due (a backoff running out), or None."""
        m = self.t.inbox
        return m.select(pw.fn.MIN(m.available_at)).where(
            m.transport == transport, m.status == core.PENDING).scalar()

    def pending_count(self, target: str) -> int:
        """Rows addressed to ``target`` waiting to be delivered (``pending``; not those its
        turn is handling now). The open rows' condition is repeated for their index."""
        m = self.t.inbox
        return m.select().where(m.target_chat_id == target, pw.SQL(is_open()),
                                m.status == core.PENDING).count()

    def has_open_of_kind(self, target: str, kind: str) -> bool:
        """``target`` has an open row (pending or in a turn) of ``kind``."""
        m = self.t.inbox
        return m.select().where(m.target_chat_id == target, pw.SQL(is_open()),
                                m.kind == kind).exists()

    def has_open_from(self, sender: str, target: str, *,
                      created_by: float | None = None) -> bool:
        """``target`` has an open row from ``sender`` (created at or before ``created_by``,
        when given)."""
        m = self.t.inbox
        since = () if created_by is None else (m.created_at <= created_by,)
        return m.select().where(m.target_chat_id == target, pw.SQL(is_open()),
                                m.sender_chat_id == sender, *since).exists()
