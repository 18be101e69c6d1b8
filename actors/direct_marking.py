"""A direct turn's mark on its session: taken before the turn, given back if it does not commit.

A direct turn (a cron run, a social event) runs outside the inbox, so no lease
orders it against the inbox turns of other runtimes: the session's mark in the
database does (:meth:`SessionStore.take_direct_turn`). The runner
(:mod:`.direct_turn`) takes it first and waits for the other runtimes' inbox
turns of the session to end; a turn that commits ends the mark in its commit,
one that does not ends it here, trying again until it is written, since a mark
left behind would keep the session's messages from ever being claimed.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from ..persistence import PersistenceError, WriterClosed
from .context import RuntimeContext
from .steps import Blocking, Steps

log = logging.getLogger("kinbox.direct")


class TurnNotStarted(WriterClosed):
    """The runtime stopped while a direct turn waited for another turn of its session:
    nothing of it ran (a :class:`WriterClosed`: what ends a direct turn's work when the
    runtime stops)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"the runtime stopped before the turn of {session_id} could start")
        self.session_id = session_id


MARK_RETRY_SECONDS = 0.2
"""How often a direct turn waiting for its session's inbox turn looks again."""


def wait_to_mark(ctx: RuntimeContext, session_id: str, turn_id: str) -> Steps[None]:
    """Mark the session's direct turn (:meth:`SessionStore.take_direct_turn`: once
    no other runtime's direct turn holds it), then wait for the inbox turns other
    runtimes run of it to end; the mark keeps them from starting more. One of this
    process's it waits for in memory (``RunningTurns.begin``); a stop that comes
    meanwhile keeps the turn from starting after it (``DirectTurns._start``). A
    :data:`.steps.Steps`: its reads run where blocking is allowed, its pauses are awaited
    on the event loop (another runtime's turn may last minutes).

    A stop or crash ends this wait with :class:`TurnNotStarted`: nothing of the turn
    ran, the mark is taken back, and the caller keeps its work (a social event goes
    back to be handed to the inbox; a cron run's record stays to be taken over)."""

    def take() -> bool:
        try:
            return ctx.store.take_direct_turn(session_id, ctx.owner, turn_id, ctx.now())
        except WriterClosed:
            raise  # stopping: a mark written is a gone runtime's, cleared by whoever looks
        except PersistenceError:
            # The mark may have committed while its answer was lost with the connection
            # (a server restart, a failover): left, it held the session for as long as
            # this runtime lived (no lease ends it, and no one clears a live runtime's
            # marks), and no process claimed the session's messages.
            unmark(ctx, session_id, turn_id)
            raise

    while not (yield Blocking(take)):
        yield _pause(ctx, session_id)
    try:
        while (yield Blocking(partial(ctx.store.others_processing, session_id, ctx.owner))):
            yield _pause(ctx, session_id)
    except GeneratorExit:  # closed unfinished: its loop is gone, as after a kill
        raise
    except BaseException:
        yield Blocking(partial(unmark, ctx, session_id, turn_id))
        raise


def _pause(ctx: RuntimeContext, session_id: str) -> Blocking:
    """Wait before looking again: another process's turn of the session ends in its own
    time and no signal crosses processes. A stop ends the wait."""

    def wait() -> None:
        if ctx.closed.wait(MARK_RETRY_SECONDS):
            raise TurnNotStarted(session_id)

    async def wait_on_loop() -> None:
        await asyncio.sleep(MARK_RETRY_SECONDS)
        if ctx.closed.is_set():
            raise TurnNotStarted(session_id)
    return Blocking(wait, on_loop=wait_on_loop)


def unmark(ctx: RuntimeContext, session_id: str, turn_id: str) -> None:
    """End the session's direct-turn mark after a turn that did not commit, however it
    ended (a brain's error, a refused commit, a bug, the runtime stopping).

    A mark that stayed would keep the session's messages from being claimed while
    this runtime lives (nobody clears a live runtime's marks), so a failed write is
    tried again until it goes through; only a stopped writer ends that (the mark is
    then a gone runtime's, which the next start or another runtime clears)."""
    while True:
        try:
            ctx.store.end_direct_turn(session_id, ctx.owner, turn_id, ctx.now())
            return
        except WriterClosed:
            log.warning("could not end the direct-turn mark of %s: the runtime stopped",
                        session_id)
            return
        except PersistenceError as exc:
            log.warning("could not end the direct-turn mark of %s (%s); trying again",
                        session_id, exc)
            if ctx.crashed.wait(MARK_RETRY_SECONDS):
                return
