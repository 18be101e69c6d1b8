"""The family rate-limit buckets (F6), kept where every process sees them.

A bucket per sender -> target pair held in one process's memory gives a pair
a fresh bucket in every process that shares the database: with three workers
on one PostgreSQL, a sender whose turns land on each in turn would get three
bursts. So a pair's bucket is a row, changed in the writer's transaction under
the row's lock (``FOR UPDATE`` on PostgreSQL; on SQLite the writer's
``BEGIN IMMEDIATE`` already serializes every process's writes).

The rule (capacity, refill rate) is the caller's (``actors/rate_limit.py``):
this module only stores a pair's ``(tokens, updated_at)`` and applies a rule
to it atomically.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .conflicts import unless_present
from .database import is_postgres
from .models import Tables
from .writer import GroupCommitWriter

T = TypeVar("T")

BucketState = tuple[float, float]
"""A pair's tokens and the time they were counted."""

BucketRule = Callable[[BucketState | None], tuple[BucketState | None, T]]
"""Given the pair's state (None: never used), its new state (None: unchanged) and an
answer for the caller."""


class RateBuckets:
    """The ``rate_buckets`` table."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    def change(self, sender_id: str, target_id: str, rule: BucketRule[T]) -> T:
        """Apply ``rule`` to the pair's bucket atomically; its answer once committed. A
        change whose batch outruns the wait is waited for (``call_landed``): taken as
        failed, a take that then committed spent a token on a send that never was."""
        return self.writer.call_landed(lambda: self._apply(sender_id, target_id, rule))

    def change_later(self, sender_id: str, target_id: str,
                     rule: BucketRule[object]) -> None:
        """:meth:`change` without waiting for it (a refund: nobody waits on its answer,
        and it may come from the event loop, which must not block on the writer)."""
        self.writer.submit(lambda: self._apply(sender_id, target_id, rule))

    def state(self, sender_id: str, target_id: str) -> BucketState | None:
        """The pair's bucket as last written (None: never used)."""
        b = self.t.bucket
        row = (b.select(b.tokens, b.updated_at)
               .where((b.sender_id == sender_id) & (b.target_id == target_id)).first())
        if row is None or row.tokens is None:
            return None
        return row.tokens, row.updated_at

    def _apply(self, sender_id: str, target_id: str, rule: BucketRule[T]) -> T:
        b = self.t.bucket
        key = (b.sender_id == sender_id) & (b.target_id == target_id)
        # The row first, so that there is always one to lock.
        unless_present(b.insert(sender_id=sender_id, target_id=target_id),
                       b.sender_id, b.target_id).execute()
        query = b.select(b.tokens, b.updated_at).where(key)
        if is_postgres(self.t.db):
            query = query.for_update()
        row = query.get()
        new, answer = rule(None if row.tokens is None else (row.tokens, row.updated_at))
        if new is not None:
            b.update(tokens=new[0], updated_at=new[1]).where(key).execute()
        return answer
