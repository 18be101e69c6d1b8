"""The commit of a social turn's events (SO1): their delivery markers.

A turn's commit writes its events' delivery markers and is refused
(:class:`DuplicateError`) when one has a marker already: a platform's retry
that reached another runtime sharing the database commits once, and only its
replies are sent. (A commit whose batch outran its wait is waited for until it
lands or fails, as every turn's is: :func:`.session_actor.wait_landed`.)
"""

from __future__ import annotations

from ..persistence import DuplicateError
from .context import RuntimeContext


def record_events(ctx: RuntimeContext, sid: str, event_ids: list[str], now: float) -> None:
    """Inside the turn's commit: its events' delivery markers, or :class:`DuplicateError`
    (undoing the commit) when one has a marker already. A platform's retry that reached
    another runtime sharing the database ran there too; one of the two commits, and
    only its replies are sent."""
    done = ctx.journal.committed_of(event_ids)
    if done:
        raise DuplicateError("social event", "event_id", sorted(done)[0])
    ctx.journal.write_turn(sid, event_ids, [], now)
