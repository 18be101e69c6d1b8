"""The steps every turn takes, whatever started it: one implementation.

An inbox row (:mod:`.session_actor`), a cron run (:mod:`.cron`) and a social
event (:mod:`.social`) all start a turn the same way: register it on the
running-turn board (which gives it its stop flag, so ``agent_stop`` works on
it), run the turn hooks (the Focal policy), call the runtime's brain and
take a returned string as a reply. What the turn's success commits and what
a failure does stay with the caller: an inbox turn acknowledges rows and
retries with the inbox backoff, a cron run finishes its run record, a social
turn hands its replies to the channel adapter.
"""

from __future__ import annotations

from collections.abc import Callable

from .context import RuntimeContext
from .turn import Message, Turn, TurnOutcome


def start_turn(ctx: RuntimeContext, session_id: str, messages: list[Message],
               fetch_steering: Callable[[], list[Message]]) -> Turn:
    """Register a running turn of ``session_id`` and build it."""
    stop_flag = ctx.turns.begin(session_id)
    return Turn(session_id, messages, lambda: ctx.tools_for(session_id), stop_flag,
                fetch_steering)


def run_brain(ctx: RuntimeContext, turn: Turn) -> TurnOutcome:
    """Run the turn hooks and the brain; the turn is unregistered when this returns.

    An exception from a hook or the brain is the turn's failure (its text in
    ``error``), never raised to the caller.
    """
    try:
        for prepare in ctx.turn_hooks:
            prepare(ctx, turn)
        result = ctx.brain(turn)
        if isinstance(result, str) and result:
            turn.reply(result)
    except Exception as exc:
        return TurnOutcome(False, f"{type(exc).__name__}: {exc}", ctx.turns.end(turn.session_id))
    return TurnOutcome(True, None, ctx.turns.end(turn.session_id))
