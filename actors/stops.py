"""``agent_stop`` wherever the turn runs (T4 across processes).

A turn's stop flag is in the memory of the process running it. Asked in the
same process, the flag is set at once. Asked elsewhere (a send-only ``kinbox
serve`` beside ``kinbox worker``, another worker on the same PostgreSQL, a
paired device's ``stop`` answered by the serving process), the request is
recorded against the row being processed; the process that leases that row
carries it out at its next tick (:func:`carry_out`). Keyed by the row, a
request that arrives late never stops the session's next turn.
"""

from __future__ import annotations

from ..persistence import RowNotFound
from .context import RuntimeContext


def request_stop(ctx: RuntimeContext, session_id: str, by: str | None) -> bool:
    """Ask the running turn of ``session_id`` to stop, wherever it runs; False when the
    session has no turn running (nor a row being processed) anywhere."""
    now = ctx.now()
    if ctx.turns.request_stop(session_id, by, now):
        return True
    processing = ctx.journal.rows(state="processing", target=session_id)
    if not processing:
        return False
    ctx.stops.ask(processing[0]["message_id"], session_id, by, now)
    return True


def carry_out(ctx: RuntimeContext) -> None:
    """At a tick: set the stop flags of this process's turns that others asked to stop,
    and forget requests whose row is no longer processing."""
    asks = ctx.stops.pending()
    if not asks:
        return
    done: list[str] = []
    for ask in asks:
        try:
            row = ctx.journal.get(ask.message_id)
        except RowNotFound:
            row = None
        if row is None or row["status"] != "processing":
            done.append(ask.message_id)  # that turn is over: nothing left to stop
        elif row["lease_owner"] == ctx.owner and ctx.turns.request_stop(
                ask.session_id, ask.asked_by, ctx.now()):
            done.append(ask.message_id)
        # else: another process's turn (it reads this), or not started yet (next tick)
    ctx.stops.forget(done)
