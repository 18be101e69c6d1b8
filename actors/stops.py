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
    turn_id = _running_elsewhere(ctx, session_id)
    if turn_id is None:
        return False
    ctx.stops.ask(turn_id, session_id, by, now)
    return True


def _running_elsewhere(ctx: RuntimeContext, session_id: str) -> str | None:
    """The id of the turn of ``session_id`` that runs (or is about to) as the database
    shows it: the direct turn its mark names, unless that turn waits for another
    runtime's inbox turn of the session (:func:`.direct_marking.wait_to_mark`), or the
    row being processed. The rows of the mark's own runtime are not the running turn:
    one its direct turn took by name (a foreground child's result), or one leased
    behind it (on SQLite a send leases its target's head at once), which waits for it;
    asked for such a row, the direct turn ran on and the request stopped the next
    turn. (A direct turn still waiting for its runtime's own inbox turn looks the same
    from here: that runtime tells them apart, :func:`_settled`.)"""
    processing = ctx.journal.rows(state="processing", target=session_id)
    direct = ctx.store.direct_turn(session_id)
    if direct is not None and direct[1] is not None:  # None: a mark from before turn ids
        owner, turn_id = direct
        others = [r["message_id"] for r in processing if r["lease_owner"] != owner]
        return others[0] if others else turn_id
    return processing[0]["message_id"] if processing else None


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
    is_direct = False
    if direct is not None and direct[1] == ask.message_id:
        is_direct, owner = True, direct[0]
    else:
        try:
            row = ctx.journal.get(ask.message_id)
        except RowNotFound:
            return True
        if row is None or row["status"] != "processing":
            return True  # that turn is over: nothing left to stop
        owner = row["lease_owner"]
    if owner != ctx.owner:
        return False
    # By the turn's id: the session may be running another turn here (one that began
    # first, with this one waiting for it), which a late or early request must not stop.
    if ctx.turns.request_stop(ask.session_id, ask.asked_by, ctx.now(), ask.message_id):
        return True
    running = ctx.turns.turn_id(ask.session_id)
    if is_direct and running is not None:
        # Asked by its mark, the direct turn has not started: it waits for the session's
        # inbox turn here (``RunningTurns.begin``), the one that ran when the stop was
        # asked (from the database a direct turn waiting and one running look alike).
        ctx.turns.request_stop(ask.session_id, ask.asked_by, ctx.now(), running)
        return True
    return False
