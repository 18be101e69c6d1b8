"""``agent_stop`` wherever the turn runs (T4 across processes).

A turn's stop flag is in the memory of the process running it. Asked in the
same process, the flag is set at once. Asked elsewhere (a send-only ``kinbox
serve`` beside ``kinbox worker``, another worker on the same PostgreSQL, a
paired device's ``stop`` answered by the serving process), the request is
recorded against the turn's own id: the row being processed, or for a direct
turn (a cron run, a social event) the id its session's mark carries. The
process running that turn carries it out at its next tick (:func:`carry_out`).
Keyed by the turn, a request that arrives late never stops the session's next
turn.
"""

from __future__ import annotations

from ..persistence import RowNotFound, StopAsk
from .context import RuntimeContext


def request_stop(ctx: RuntimeContext, session_id: str, by: str | None) -> bool:
    """Ask the running turn of ``session_id`` to stop, wherever it runs; False when the
    session has no turn running (nor a row being processed) anywhere."""
    now = ctx.now()
    if ctx.turns.request_stop(session_id, by, now):
        return True
    processing = ctx.journal.rows(state="processing", target=session_id)
    if processing:
        ctx.stops.ask(processing[0]["message_id"], session_id, by, now)
        return True
    direct = ctx.store.direct_turn(session_id)
    if direct is None or direct[1] is None:  # a mark of a runtime from before turn ids
        return False
    ctx.stops.ask(direct[1], session_id, by, now)
    return True


def carry_out(ctx: RuntimeContext) -> None:
    """At a tick: set the stop flags of this process's turns that others asked to stop,
    and forget requests whose turn is over."""
    asks = ctx.stops.pending()
    if not asks:
        return
    done = [ask.message_id for ask in asks if _settled(ctx, ask)]
    ctx.stops.forget(done)


def _settled(ctx: RuntimeContext, ask: StopAsk) -> bool:
    """Carried out here, or its turn is over: the request can go. False: another
    process's turn (it reads this), or one not started yet (the next tick)."""
    direct = ctx.store.direct_turn(ask.session_id)
    if direct is not None and direct[1] == ask.message_id:
        owner = direct[0]
    else:
        try:
            row = ctx.journal.get(ask.message_id)
        except RowNotFound:
            return True
        if row is None or row["status"] != "processing":
            return True  # that turn is over: nothing left to stop
        owner = row["lease_owner"]
    # By the turn's id: the session may be running another turn here (one that began
    # first, with this one waiting for it), which a late or early request must not stop.
    return owner == ctx.owner and ctx.turns.request_stop(ask.session_id, ask.asked_by,
                                                         ctx.now(), ask.message_id)
