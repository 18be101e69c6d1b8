"""The turns of social chats (SO1): one at a time per thread, each event answered once.

A chat (a thread's session) runs its turns one after another where direct
turns run (:mod:`.direct_pool`: a pool thread, or the event loop of an async
brain): a turn starts from the chat's next event and takes its sender's later
events as steering; when it ends, the events it never handed its brain, then
the sender's steering that came too late, then the others' events, are next.
A turn that could not run at all keeps its events: the chat tries again after
a pause (:func:`.social_rules.stall_pause`), waiting on one shared thread
(:mod:`.delayed`), not where turns run. A turn whose commit the database refused
runs again, up to ``COMMIT_ATTEMPTS`` times. A turn's commit writes its events'
delivery markers and is refused when one has a marker already (:func:`record_events`):
a platform's retry that reached another runtime sharing the database commits once.
A committed turn's replies leave through the channel (:mod:`.channels`). While the
thread has events in the inbox (a stop handed them over), its next event joins them
there instead of starting a turn, so it is not answered before them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from ..persistence import DuplicateError, WriterClosed
from . import channels
from . import social_rules as rules
from .context import RuntimeContext
from .direct_turn import DirectOutcome, DirectTurns, TurnNotStarted
from .social_state import SOCIAL_KIND, SocialState, thread_patch, turn_message
from .steps import Blocking, Steps
from .turn import Message, Turn
from .turn_run import error_kind

log = logging.getLogger("kinbox.social")


class ChatTurns(SocialState):
    """Runs the chats' turns on the state's events."""

    def _run_chat(self, sid: str, event: rules.SocialEvent | None) -> Steps[None]:
        """Run the chat's turns until its queue is empty (one turn at a time per chat); a
        :data:`.steps.Steps`, so with an async brain its turns wait on the event loop."""
        assert self.turns is not None
        while event is not None and self._take(event):
            again, stalled = yield from self._run_one(sid, event)
            with self._lock:
                chat = self._chats[sid]
                # What must run again came first; then steering that came after the turn's
                # last look (it waits for the next turn); then the others' events.
                chat.pending.extendleft(reversed([*again, *chat.steering]))
                chat.steering.clear()
                chat.stalls = chat.stalls + 1 if stalled else 0
                event = chat.pending.popleft() if chat.pending else None
                chat.running_sender = event.sender_id if event else None
                if event is None:
                    del self._chats[sid]  # idle chats keep no state: memory stays bounded
                elif stalled and not self._stop.is_set():
                    self._pause(sid, event, rules.stall_pause(chat.stalls))
                    return

    def _pause(self, sid: str, event: rules.SocialEvent, seconds: float) -> None:
        """Start the stalled chat's next try, from ``event``, in ``seconds``, leaving the
        pool's thread to other chats meanwhile (a stop drops the try: the hand-over takes
        the chat's events)."""
        assert self.turns is not None
        turns = self.turns
        self._pauses.call_in(seconds, sid, lambda: self._resume(turns, sid, event))

    def _resume(self, turns: DirectTurns, sid: str, event: rules.SocialEvent) -> None:
        turns.submit_steps(lambda: self._run_chat(sid, event))  # None: stopping, handed over

    def _take(self, event: rules.SocialEvent) -> bool:
        """Take ``event`` for a turn; False once a stop hands it to the inbox instead."""
        with self._lock:
            if self._stop.is_set() or self._unstarted.pop(event.event_id, None) is None:
                return False
            self._in_turn[event.event_id] = event
            return True

    def _run_one(self, sid: str, event: rules.SocialEvent
                 ) -> Steps[tuple[list[rules.SocialEvent], bool]]:
        """Run a turn of the chat from ``event`` (and its sender's steering); the events to
        run again, ahead of the chat's queue (those fetched for the turn that its brain was
        never handed, or all of them when the turn could not run at all), and whether it
        could not run at all (the chat pauses before its next try). Raises only what a
        stopping runtime raises (:class:`WriterClosed`, :class:`TurnNotStarted`: the
        events were given back for the stop to hand over), so the chat always moves on."""
        assert self.turns is not None
        taken: list[rules.SocialEvent] = [event]

        def fetch_steering() -> list[Message]:
            with self._lock:
                chat = self._chats[sid]
                if self._stop.is_set():  # the stop hands them to the inbox
                    return []
                fresh = list(chat.steering)
                chat.steering.clear()
                for e in fresh:
                    self._unstarted.pop(e.event_id, None)
                    self._in_turn[e.event_id] = e
            taken.extend(fresh)
            return [turn_message(e) for e in fresh]

        def commit_ops(turn: Turn) -> list[Any]:
            unseen = {m.message_id for m in turn.close_steering() or []}
            ran = [e.event_id for e in taken if e.event_id not in unseen]
            last = [e for e in taken if e.event_id not in unseen][-1]
            patch = thread_patch(last.reply_route, last.sender_id)
            now = self.ctx.now()
            text = rules.reply_text(turn.replies)
            # The patch first: on PostgreSQL its row lock makes the commits of a thread's
            # turns one at a time across runtimes, so the marker check below is exact.
            # The reply is kept with the turn until its send ends (:mod:`.channels`).
            return [lambda: self.ctx.store.patch_config_now(sid, patch, now),
                    lambda: record_events(self.ctx, sid, ran, now),
                    lambda: self.channels.keep_now(sid, last.platform, last.reply_route,
                                                   text, last.event_id, now)]

        try:
            yield Blocking(partial(self._ensure_session, event))
            if (yield Blocking(partial(self.ctx.journal.has_open_of_kind, sid, SOCIAL_KIND))):
                # The thread has events in the inbox (a stop handed them over; the next
                # start runs them as inbox turns): this one joins them, behind them, or
                # it would be answered first, by an agent that had not read them.
                yield Blocking(partial(self._to_inbox, event))
                log.info("social event in %s joins its thread's events in the inbox", sid)
                with self._lock:
                    self._in_turn.pop(event.event_id, None)
                    self._refused.pop(event.event_id, None)
                self._handled()
                return [], False
            done = yield from self.turns.run_steps(sid, [turn_message(event)],
                                                   fetch_steering=fetch_steering,
                                                   commit_ops=commit_ops)
        except TurnNotStarted:  # stopping: they were accepted, so they go to the inbox
            with self._lock:
                self._give_back(taken)
            raise
        except WriterClosed:
            raise
        except Exception:
            # Nothing of it committed (the commit's own refusals come back as an outcome):
            # the events stay accepted and run again, rather than being lost with a 202.
            log.exception("social turn in %s could not run; its %d event(s) run again",
                          sid, len(taken))
            with self._lock:
                self._give_back(taken)
            return taken, True
        if done.commit_error is not None and not isinstance(done.commit_error, DuplicateError):
            # The commit failed (a database error, its mark lost): nothing of the turn is
            # written, so its events run again, as when it could not start, up to
            # COMMIT_ATTEMPTS turns; then they fail, concluded below. (A duplicate is
            # another runtime's commit of the same events: concluded below too.)
            with self._lock:
                tries = self._refused[event.event_id] = self._refused.get(event.event_id, 0) + 1
                again = tries < rules.COMMIT_ATTEMPTS
                if again:
                    self._give_back(taken)
            if again:
                log.warning("social turn in %s could not commit (%d of %d); its %d event(s) "
                            "run again: %s", sid, tries, rules.COMMIT_ATTEMPTS, len(taken),
                            done.error)
                return taken, True
        unseen = {m.message_id for m in done.turn.close_steering() or []}
        with self._lock:
            self.counts["turns" if done.committed else "failed_turns"] += 1
            # Fetched for the turn, never handed to its brain: next in line.
            back = [e for e in taken if e.event_id in unseen]
            taken[:] = [e for e in taken if e.event_id not in unseen]
            self._give_back(back)
            for e in taken:  # their turn ended: committed, or failed for good
                self._in_turn.pop(e.event_id, None)
            self._refused.pop(event.event_id, None)
        conclude = partial(self._conclude, sid, event, taken, done)
        try:
            # The replies' send may wait on a platform that is down (retries, pauses): on
            # the direct turns' own threads, never on the event loop's blocking workers,
            # which every async turn's tool calls and reads need.
            yield Blocking(conclude, on_loop=partial(self._conclude_on_pool, conclude))
        except WriterClosed:
            raise
        except Exception:  # the turn is over either way: its chat must not wait on this
            log.exception("the outcome of a social turn in %s could not be recorded", sid)
        finally:
            for _ in taken:
                self._handled()
        return back, False

    async def _conclude_on_pool(self, conclude: Callable[[], None]) -> None:
        """``conclude`` on the direct pool, awaited (an async brain's chat turn)."""
        assert self.turns is not None
        future = self.turns.submit(conclude)
        if future is None:  # stopping: the pool takes no more work, so here
            await asyncio.to_thread(conclude)
            return
        await asyncio.wrap_future(future)

    def _conclude(self, sid: str, event: rules.SocialEvent, ran: list[rules.SocialEvent],
                  done: DirectOutcome) -> None:
        """Send a committed turn's replies, or record why there are none."""
        if done.committed:
            self._send_replies(sid, ran[-1], done.turn)
        elif self.ctx.journal.committed_of([e.event_id for e in ran]):
            # A platform's retry that another runtime ran and committed.
            log.info("social turn in %s not committed: its events ran elsewhere", sid)
            with self._lock:
                self.counts["duplicates"] += 1
        else:  # nothing was committed, so nothing is sent; the outcome says why
            log.warning("social turn in %s failed: %s", sid, error_kind(done.error or ""))
            log.debug("social turn in %s failed: %s", sid, done.error)
            self.channels.record(sid, event.platform, ran[-1].event_id,
                                 channels.DeliveryOutcome("turn_failed", 0, done.error),
                                 durable=False)

    def _send_replies(self, sid: str, event: rules.SocialEvent, turn: Turn) -> None:
        """Send the turn's replies in the thread's line (:mod:`.social_sends`): here, when
        no reply of the thread's inbox turns is on its way, else behind those."""
        assert self.turns is not None
        text = rules.reply_text(turn.replies)
        self._sends.submit(sid, lambda: self.channels.send(
            sid, event.platform, event.reply_route, text, event.event_id),
            self.turns.submit, here=True)


def record_events(ctx: RuntimeContext, sid: str, event_ids: list[str], now: float) -> None:
    """Inside the turn's commit: its events' delivery markers, or :class:`DuplicateError`
    (undoing the commit) when one has a marker already. A platform's retry that reached
    another runtime sharing the database ran there too; one of the two commits, and
    only its replies are sent."""
    done = ctx.journal.committed_of(event_ids)
    if done:
        raise DuplicateError("social event", "event_id", sorted(done)[0])
    ctx.journal.write_turn(sid, event_ids, [], now)
