"""Recording a takeover's failed attempt: one write for both claims that count one.

The dispatcher's claim takes over a row whose turn was interrupted (its worker died or
stalled past its lease mid-turn) and runs it itself; a peer link's window claim takes over
a row a dead link never answered for, and leaves it to wait out its backoff. What the
attempt does to the row is decided in :func:`.inbox_core.after_takeover`; writing it (the
row's attempts, error and suspect mark, its lease when it ends, the history event) is
here, so the two claims cannot drift apart. Each caller says what fences its write.
"""

from __future__ import annotations

from typing import Any

from . import inbox_core as core
from .inbox_records import TakenOver
from .models import Tables


def record_takeover(t: Tables, message_id: str, status: str, decision: core.Takeover,
                    now: float, fence: Any = None) -> TakenOver | None:
    """Write ``decision`` for the row ``message_id`` (read as ``status`` under its lock);
    None, writing nothing, when ``fence`` (an extra condition on the row) no longer holds.

    A row the claim runs keeps its ``processing`` state, for the claim's own lease; one
    that failed or goes back to wait leaves its lease."""
    core.transition(message_id, status, decision.event)
    out = decision.outcome
    m = t.inbox
    changes: dict[str, Any] = {"attempts": out.attempts, "last_error": decision.error,
                               "turn_started_at": None, "suspect": True, "updated_at": now}
    if out.state is not core.State.PROCESSING:
        changes.update(status=out.state.value, available_at=out.available_at,
                       lease_owner=None, lease_until=None)
    where = m.message_id == message_id
    if not m.update(**changes).where(where if fence is None else where & fence).execute():
        return None
    t.event.insert(message_id=message_id, at=now, attempts=out.attempts,
                   event=decision.history, detail=decision.error).execute()
    return TakenOver(message_id, out.attempts, decision.failed, decision.error)
