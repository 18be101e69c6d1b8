"""Stops asked across processes: one small table, read by whoever runs the turn.

A turn's stop flag lives in the memory of the process running it. When the
caller of ``agent_stop`` (or a peer's ``stop``) is another process (a
send-only ``kinbox serve`` beside a worker, or another worker on the same
PostgreSQL), it records the request here against the row being processed;
the process that leases that row finds it at its next tick, sets the flag,
and forgets the request. Requests for rows no longer processing are
forgotten too, and a claim that takes a row over (its worker died mid-turn)
drops the requests of that dead turn in its own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from .conflicts import unless_present
from .models import Tables
from .writer import GroupCommitWriter


@dataclass(frozen=True)
class StopAsk:
    """A stop asked for the turn of ``message_id`` in ``session_id``."""

    message_id: str
    session_id: str
    asked_by: str | None


class StopRequests:
    """The ``stop_requests`` table."""

    def __init__(self, tables: Tables, writer: GroupCommitWriter) -> None:
        self.t = tables
        self.writer = writer

    def ask(self, message_id: str, session_id: str, asked_by: str | None, now: float) -> None:
        """Record a stop for the turn of ``message_id`` (the first asker's name stays)."""
        s = self.t.stop
        self.writer.call(lambda: unless_present(
            s.insert(message_id=message_id, session_id=session_id, asked_by=asked_by,
                     asked_at=now), s.message_id).execute())

    def pending(self) -> list[StopAsk]:
        """Every recorded request (a handful at most: each lives until the next tick)."""
        s = self.t.stop
        return [StopAsk(r.message_id, r.session_id, r.asked_by)
                for r in s.select().order_by(s.asked_at)]

    def forget(self, message_ids: list[str]) -> None:
        """Drop requests that were carried out or whose row is no longer processing."""
        if message_ids:
            self.writer.call(lambda: forget_now(self.t, message_ids))


def forget_now(tables: Tables, message_ids: list[str]) -> None:
    """Drop the requests naming ``message_ids``, inside the caller's transaction (a
    takeover's claim, the end of a dead runtime's direct-turn marks: turns that are over)."""
    if message_ids:
        s = tables.stop
        s.delete().where(s.message_id.in_(message_ids)).execute()
