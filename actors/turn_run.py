"""The steps every turn takes, whatever started it: one implementation.

An inbox row (:mod:`.session_actor`), a cron run (:mod:`.cron`) and a social
event (:mod:`.social`) all run a turn the same way: register it on the
running-turn board (which gives it its stop flag, so ``agent_stop`` and the
turn timeout work on it), run the turn hooks (the Focal policy), call the
runtime's brain, take a returned string as a reply, and count a turn that
ran past ``turn_timeout`` as failed. What the turn's success commits and
what a failure does stay with the caller: an inbox turn acknowledges rows
and retries with the inbox backoff, a cron run finishes its run record, a
social turn hands its replies to the channel adapter.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

from .context import RuntimeContext
from .running import TIMEOUT, overdue
from .turn import Message, Turn, TurnOutcome


@dataclass(frozen=True)
class BrainRun:
    """How the brain's part of a turn ended."""

    outcome: TurnOutcome
    detail: str | None = None
    """On failure, what to keep as the error: the traceback, or the timeout summary.
    ``outcome.error`` is the one-line summary for observers and logs."""


def start_turn(ctx: RuntimeContext, session_id: str, messages: list[Message],
               fetch_steering: Callable[[], list[Message]]) -> tuple[Turn, float]:
    """Register a running turn of ``session_id`` and build it; the turn and its start time.

    Waits while another turn of the session runs (:meth:`RunningTurns.begin`).
    """
    started = ctx.now()
    stop_flag = ctx.turns.begin(session_id, started)
    return Turn(session_id, messages, lambda: ctx.tools_for(session_id), stop_flag,
                fetch_steering), started


def run_brain(ctx: RuntimeContext, turn: Turn, started: float) -> BrainRun:
    """Run the turn hooks and the brain; the turn is unregistered when this returns.

    An exception from a hook or the brain, or a turn past ``turn_timeout``, is
    the turn's failure, never raised to the caller.
    """
    try:
        for prepare in ctx.turn_hooks:
            prepare(ctx, turn)
        result = ctx.brain(turn)
        if isinstance(result, str) and result:
            turn.reply(result)
    except Exception as exc:
        return _failed(ctx, turn, f"{type(exc).__name__}: {exc}",
                       "".join(traceback.format_exception(exc)))
    if overdue(started, ctx.now(), ctx.turn_timeout):
        summary = (f"TurnTimeout: the turn ran {ctx.now() - started:.1f} s, past "
                   f"turn_timeout={ctx.turn_timeout} s")
        return _failed(ctx, turn, summary, summary)
    return BrainRun(TurnOutcome(True, None, ctx.turns.end(turn.session_id)))


def _failed(ctx: RuntimeContext, turn: Turn, summary: str, detail: str) -> BrainRun:
    stopped_by = ctx.turns.end(turn.session_id)
    return BrainRun(TurnOutcome(False, summary, None if stopped_by == TIMEOUT else stopped_by),
                    detail)
