"""Social ingress (SO1): chat-platform events in, turns run, replies out through channels.

``ingest`` validates a raw event and puts it on an in-memory queue bounded
by ``bound`` events accepted and not yet through their turn: beyond it an
event is refused at once (counted and logged), so a burst cannot grow
memory or stall the webhook. One consumer thread takes events
in order, authorizes the sender by id against the platform's allowlist,
creates the thread's session (``social-<platform>-<thread>``, kind
``social``, project ``social``; listed and addressable like any other once
created where its first turn runs) and routes the event by
:func:`.social_rules.route`: an idle chat starts a direct turn, the running
turn's own sender steers it, anyone else waits in the chat's queue. Social
events never enter the generic inbox. A turn that could not run at all (a
database error creating or marking its session, say) keeps its events: the
chat runs them again, before its later events, after a pause that doubles
from 1 s to 30 s while the error lasts (:func:`.social_rules.stall_pause`);
it waits on one thread for all such chats (:mod:`.delayed`), not on a
thread of the turn pool, so a chat whose error lasts holds up no other.

A graceful stop hands every accepted event that no turn has taken yet (still
queued, waiting for its chat, or waiting for a thread of the pool) to the
durable inbox, as a message of kind ``social_message`` to its thread's
session, so the 202 its platform got still holds: the next start runs it as
an inbox turn, and that turn's replies leave by the event's own reply route.
Once a stop hands over, no turn takes an event (one lock decides). The
events of a turn still running when the stop's wait ends (a brain that
ignores its stop request) are handed over too: if that turn's commit lands
after all, its delivery markers make the inbox skip them (it never runs a
message whose turn committed); if not, they run at the next start. A crash
loses what was only in memory (no turn committed it).
A turn's commit writes its events' delivery markers and is refused when one
has a marker already, so a platform's retry that reached another runtime on
the same PostgreSQL commits once, and only once are its replies sent. A commit
whose waiter gave up while the writer ran it (its outcome unknown: it may land
after) is settled by reading the journal once its batch is over: landed, its
replies leave; not, its events run again (never both, never neither).

After a turn commits, its replies go to the platform's channel adapter
(:mod:`.channels`) with the event's reply route; the outcome is recorded in
the transcript as a hidden ``delivery`` entry and kept in ``outcomes``. The
thread's last reply route is kept in the session's config, so the replies
of a turn another session started there (``agent_send``) leave the same way.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from ..persistence import (
    DuplicateError,
    NewMessage,
    PersistenceError,
    WriterClosed,
    WriteTimeout,
)
from . import channels
from . import social_rules as rules
from .context import HookReads, RuntimeContext, TurnEffects
from .delayed import Delayed
from .direct_turn import DirectOutcome, DirectTurns, TurnNotStarted
from .turn import Message, Turn, TurnOutcome

log = logging.getLogger("kinbox.social")

SOCIAL_KIND = "social_message"
"""The kind of the message a social event's turn starts with."""
DEFAULT_QUEUE_BOUND = 256
RECENT_IDS = 10_000
"""How many accepted event ids are remembered, so a platform's retry is not run twice (at
a start, the newest ones the database holds: committed turns' and the inbox's)."""


@dataclass
class _Chat:
    """The routing state of one thread (touched under the service lock only)."""

    running_sender: str | None = None
    steering: deque[rules.SocialEvent] = field(default_factory=deque)
    pending: deque[rules.SocialEvent] = field(default_factory=deque)
    stalls: int = 0
    """Turns in a row that could not run at all (each pauses the chat longer)."""


class SocialService:
    """Social ingress of one runtime (``rt.social``)."""

    def __init__(self, ctx: RuntimeContext, turns: DirectTurns | None, *,
                 bound: int = DEFAULT_QUEUE_BOUND,
                 retry_delays: tuple[float, ...] = channels.DEFAULT_RETRY_DELAYS) -> None:
        if bound < 1:
            raise ValueError(f"the social queue bound must be >= 1, got {bound}")
        self.ctx = ctx
        self.turns = turns
        self.bound = bound
        self._queue: queue.Queue[rules.SocialEvent | None] = queue.Queue()
        self._lock = threading.Lock()
        self._chats: dict[str, _Chat] = {}
        self._allow: dict[str, frozenset[str]] = {}
        self._stop = threading.Event()
        self.channels = channels.Channels(ctx, self._stop, retry_delays)
        self._consumer: threading.Thread | None = None
        self._handling = 0
        self.counts = {"accepted": 0, "refused": 0, "denied": 0, "steered": 0, "queued": 0,
                       "turns": 0, "failed_turns": 0, "duplicates": 0}
        self._recent: OrderedDict[str, None] = OrderedDict()  # event ids lately accepted
        self._refused: dict[str, int] = {}
        """How many turns from an event (not yet through) had their commit refused."""
        self._unstarted: dict[str, rules.SocialEvent] = {}
        """Accepted events no turn has taken yet, by id, in acceptance order: what a stop
        hands to the inbox (each leaves it under the lock, to a turn or to the inbox)."""
        self._in_turn: dict[str, rules.SocialEvent] = {}
        """Events a turn took that has not ended yet (committed or failed): what a stop
        hands over too when its wait for the turns ends first."""
        self._pauses = Delayed("kinbox-social-pauses")
        """The stalled chats' next tries, by session id, all waiting on one thread."""

    # -- configuration ---------------------------------------------------------------------

    def allow(self, platform: str, sender_ids: Iterable[str]) -> None:
        """Set the platform's allowlist of sender ids (display names never count)."""
        if not isinstance(platform, str) or not rules.PLATFORM_RE.fullmatch(platform):
            raise rules.InvalidSocialEvent("platform", "1-32 characters of a-z, 0-9 and _")
        if isinstance(sender_ids, str | bytes):  # "U123" would allow U, 1, 2 and 3
            raise rules.InvalidSocialEvent("sender_id", "give a list of sender ids, not one "
                                                        "string")
        try:
            ids = frozenset(sender_ids)
        except TypeError:  # not iterable, or an entry that is no id (a dict, a list)
            raise rules.InvalidSocialEvent("sender_id", "give a list of sender ids") from None
        if not all(isinstance(i, str) and i for i in ids):
            raise rules.InvalidSocialEvent("sender_id", "allowlist entries are non-empty ids")
        with self._lock:
            self._allow[platform] = ids

    def register_channel(self, platform: str, send: channels.Send, *,
                         secret: str | bytes | None = None) -> None:
        """Register how replies leave for ``platform`` and, for webhooks, its signing secret;
        replies held for it (turns that ran before it was registered) leave now."""
        if not isinstance(platform, str) or not rules.PLATFORM_RE.fullmatch(platform):
            raise rules.InvalidSocialEvent("platform", "1-32 characters of a-z, 0-9 and _")
        if not callable(send):
            raise rules.InvalidSocialEvent("send", "give a callable send(reply_route, text)")
        if secret is not None and (not isinstance(secret, str | bytes) or not secret):
            # An empty key signs anything anyone can compute: the webhook would be open
            # (a secret read from an unset environment variable, say).
            raise rules.InvalidSocialEvent("secret", "give a non-empty signing secret, or None "
                                                     "for a platform without a webhook")
        held = self.channels.register(platform, send,
                                      secret.encode() if isinstance(secret, str) else secret)
        for reply in held:  # replies that ran before the product registered this channel
            self._send_later(platform, reply)

    def _send_later(self, platform: str, reply: channels.HeldReply) -> None:
        """Send a held reply on the turn pool (a failing send retries for seconds)."""
        assert self.turns is not None  # only a runtime that runs turns has replies
        sender = self.channels
        self.turns.submit(lambda: sender.send(reply.session_id, platform, reply.route,
                                              reply.text, reply.cause_id))

    def webhook_secret(self, platform: str) -> bytes | None:
        """The platform's webhook signing secret (None: its webhook is closed)."""
        channel = self.channels.get(platform)
        return channel.secret if channel else None

    @property
    def retry_delays(self) -> tuple[float, ...]:
        """Seconds before each retry of a failed channel send."""
        return self.channels.retry_delays

    @retry_delays.setter
    def retry_delays(self, delays: tuple[float, ...]) -> None:
        self.channels.retry_delays = tuple(delays)

    @property
    def outcomes(self) -> deque[dict[str, Any]]:
        """The latest reply outcomes (``sent``, ``failed``, ``no_channel``...), oldest first."""
        return self.channels.outcomes

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the consumer (only in a runtime that runs turns), remembering the event
        ids the database already holds, so a platform's retry after a restart runs
        nothing twice either."""
        if self.turns is None or self._consumer is not None:
            return
        held = self.ctx.store.recent_message_ids(SOCIAL_KIND, RECENT_IDS)
        with self._lock:
            self._recent = OrderedDict.fromkeys([*held, *self._recent])
            while len(self._recent) > RECENT_IDS:
                self._recent.popitem(last=False)
        self._consumer = threading.Thread(target=self._consume, name="kinbox-social",
                                          daemon=True)
        self._consumer.start()

    def stop(self) -> None:
        """Stop taking events and starting turns (running ones go on); then, once the turn
        pool has stopped or its wait ended, :meth:`hand_over` what no turn committed."""
        self._stop.set()
        self._pauses.close()  # their chats' events are unstarted: the hand-over takes them
        if self._consumer is None:
            return  # a send-only runtime never queued anything
        self._queue.put(None)
        if self._consumer is not threading.current_thread():
            self._consumer.join(5)

    def hand_over(self) -> int:
        """Write every accepted event no turn has taken, or whose turn has not ended, to
        the inbox (after :meth:`stop` and the turn pool's wait); how many. Denied senders'
        events are dropped, as the consumer would."""
        with self._lock:
            # A turn's events came before those still waiting in its chat.
            events = [*self._in_turn.values(), *self._unstarted.values()]
            self._in_turn.clear()
            self._unstarted.clear()
        handed = 0
        for event in events:
            with self._lock:
                allowed = rules.authorized(self._allow, event.platform, event.sender_id)
            if not allowed:
                continue
            try:
                sid = self._ensure_session(event)
                message = _message(event)
                self.ctx.journal.enqueue(
                    NewMessage(event.event_id, sid, message.content, kind=SOCIAL_KIND,
                               payload=message.payload), self.ctx.now())
                handed += 1
            except PersistenceError as exc:  # the database is gone: nothing more can be kept
                log.error("social ingress stopped: %d accepted events could not be kept "
                          "(%s)", len(events) - handed, exc)
                return handed
        if handed:
            log.warning("social ingress stopped: %d accepted events not yet run were handed "
                        "to the inbox; they run at the next start", handed)
        return handed

    # -- ingress ---------------------------------------------------------------------------

    def ingest(self, event: Mapping[str, Any], *, platform: str | None = None) -> dict[str, Any]:
        """Validate a raw channel event and queue it; a receipt, or a :class:`SocialError`."""
        if self.turns is None:
            raise rules.SocialUnavailable()
        self.ctx.require_running()
        fresh_id = f"social-{self.ctx.new_id()}"
        normalized = rules.normalize(event, fresh_id, platform)
        sid = rules.session_id_for(normalized.platform, normalized.thread_id)
        with self._lock:
            known = normalized.event_id in self._recent
        # A retry another runtime sharing the database ran already (its turn's marker).
        ran_elsewhere = (not known and normalized.event_id != fresh_id
                         and bool(self.ctx.journal.committed_of([normalized.event_id])))
        with self._lock:
            if ran_elsewhere or normalized.event_id in self._recent:  # a platform's retry
                self.counts["duplicates"] += 1
                return {"accepted": True, "duplicate": True, "event_id": normalized.event_id,
                        "session_id": sid}
            # Again under the lock: a stop may have come since the first look (during the
            # read above), and what is accepted after its hand_over would be lost with a
            # 202. The runtime closes before it hands over, so this look sees it.
            self.ctx.require_running()
            # The bound covers every accepted event not yet through its turn (queued,
            # waiting for its chat, steering, running), so memory stays bounded.
            full = self._handling >= self.bound
            if full:
                self.counts["refused"] += 1
            else:
                self.counts["accepted"] += 1
                self._handling += 1
                self._recent[normalized.event_id] = None
                self._unstarted[normalized.event_id] = normalized
                while len(self._recent) > RECENT_IDS:
                    self._recent.popitem(last=False)
            refused = self.counts["refused"]
        if full:
            log.warning("social ingress queue full (%d): refused an event from %s (%d refused)",
                        self.bound, normalized.platform, refused)
            self.ctx.emit("social_refused", platform=normalized.platform, refused=refused)
            raise rules.SocialQueueFull(self.bound, refused)
        self._queue.put(normalized)
        return {"accepted": True, "duplicate": False, "event_id": normalized.event_id,
                "session_id": sid}

    def statistics(self) -> dict[str, Any]:
        """Counters, the queue's depth and bound."""
        with self._lock:
            return {**self.counts, "queued_now": self._queue.qsize(), "bound": self.bound}

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every accepted event was handled and no social turn runs."""
        if self.turns is None:
            return True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                busy = self._handling > 0
            if not busy and self.turns.is_idle():
                return True
            # Between two turns of a chat the pool is briefly idle: wait on it, then look again.
            self.turns.wait_idle(0.02)
            self._stop.wait(0.005)
        return False

    def _consume(self) -> None:
        while not self._stop.is_set():
            event = self._queue.get()
            if event is None:
                break
            try:
                self._route(event)
            except WriterClosed:
                break
            except Exception:
                log.exception("social event %s could not be handled", event.event_id)
                with self._lock:
                    self._unstarted.pop(event.event_id, None)
                self._handled()

    def _handled(self) -> None:
        with self._lock:
            self._handling -= 1

    def _route(self, event: rules.SocialEvent) -> None:
        with self._lock:
            allowed = rules.authorized(self._allow, event.platform, event.sender_id)
            if not allowed:
                self.counts["denied"] += 1
                self._unstarted.pop(event.event_id, None)
        if not allowed:
            log.info("social event from unlisted sender on %s denied", event.platform)
            self.ctx.emit("social_denied", platform=event.platform, sender_id=event.sender_id)
            self._handled()
            return
        # The session is made where the turn runs: a database error there is the turn's,
        # which runs again, where here it would drop an event its platform has a 202 for.
        sid = rules.session_id_for(event.platform, event.thread_id)
        with self._lock:
            chat = self._chats.setdefault(sid, _Chat())
            decision = rules.route(chat.running_sender, event.sender_id)
            if decision is rules.Route.STEER:
                chat.steering.append(event)
                self.counts["steered"] += 1
            elif decision is rules.Route.QUEUE:
                chat.pending.append(event)
                self.counts["queued"] += 1
            else:
                chat.running_sender = event.sender_id
        self.ctx.emit("social_routed", session_id=sid, route=decision.value,
                      event_id=event.event_id)
        if decision is rules.Route.START:
            assert self.turns is not None
            if self.turns.submit(lambda: self._run_chat(sid, event)) is None:
                self._handled()

    def _ensure_session(self, event: rules.SocialEvent) -> str:
        sid = rules.session_id_for(event.platform, event.thread_id)
        if self.ctx.store.session(sid) is None:
            try:
                self.ctx.store.create_session(
                    sid, rules.SOCIAL_PROJECT, f"{event.platform}: {event.sender_name}",
                    "social", self.ctx.now(), platform=event.platform,
                    config={"social_thread_id": event.thread_id})
            except DuplicateError:
                pass
        return sid

    # -- turns -----------------------------------------------------------------------------

    def _run_chat(self, sid: str, event: rules.SocialEvent | None) -> None:
        """Run the chat's turns until its queue is empty (one turn at a time per chat)."""
        assert self.turns is not None
        while event is not None and self._take(event):
            again, stalled = self._run_one(sid, event)
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
        turns.submit(lambda: self._run_chat(sid, event))  # None: stopping, handed over

    def _take(self, event: rules.SocialEvent) -> bool:
        """Take ``event`` for a turn; False once a stop hands it to the inbox instead."""
        with self._lock:
            if self._stop.is_set() or self._unstarted.pop(event.event_id, None) is None:
                return False
            self._in_turn[event.event_id] = event
            return True

    def _run_one(self, sid: str, event: rules.SocialEvent
                 ) -> tuple[list[rules.SocialEvent], bool]:
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
            return [_message(e) for e in fresh]

        watch = _CommitWatch()

        def commit_ops(turn: Turn) -> list[Any]:
            unseen = {m.message_id for m in turn.close_steering() or []}
            ran = [e.event_id for e in taken if e.event_id not in unseen]
            last = [e for e in taken if e.event_id not in unseen][-1]
            patch = {"social_reply_route": dict(last.reply_route),
                     "social_last_sender": last.sender_id}
            now = self.ctx.now()
            watch.event_ids = ran
            # The patch first: on PostgreSQL its row lock makes the commits of a thread's
            # turns one at a time across runtimes, so the marker check below is exact.
            return [lambda: self.ctx.store.patch_config_now(sid, patch, now),
                    lambda: self._record_events(sid, ran, now, watch)]

        try:
            self._ensure_session(event)
            done = self.turns.run(sid, [_message(event)], fetch_steering=fetch_steering,
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
        if _outcome_unknown(done.commit_error):
            done = self._resolve(sid, done, watch)
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
        try:
            self._conclude(sid, event, taken, done)
        except WriterClosed:
            raise
        except Exception:  # the turn is over either way: its chat must not wait on this
            log.exception("the outcome of a social turn in %s could not be recorded", sid)
        finally:
            for _ in taken:
                self._handled()
        return back, False

    def _give_back(self, events: list[rules.SocialEvent]) -> None:
        """Make ``events`` (taken for a turn that did not run them) unstarted again, ahead of
        the others: they came first, and a stop hands them over in that order. Under the
        lock."""
        if events:
            self._unstarted = {**{e.event_id: e for e in events}, **self._unstarted}
            for e in events:
                self._in_turn.pop(e.event_id, None)

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
            log.warning("social turn in %s failed: %s", sid, done.error)
            self.channels.record(sid, event.platform, ran[-1].event_id,
                                 channels.DeliveryOutcome("turn_failed", 0, done.error),
                                 durable=False)

    def _record_events(self, sid: str, event_ids: list[str], now: float,
                       watch: _CommitWatch) -> None:
        """Inside the turn's commit: its events' delivery markers, or :class:`DuplicateError`
        (undoing the commit) when one has a marker already. A platform's retry that reached
        another runtime sharing the database ran there too; one of the two commits, and
        only its replies are sent. ``watch`` learns that this commit wrote them."""
        done = self.ctx.journal.committed_of(event_ids)
        if done:
            raise DuplicateError("social event", "event_id", sorted(done)[0])
        self.ctx.journal.write_turn(sid, event_ids, [], now)
        watch.wrote = True

    def _resolve(self, sid: str, done: DirectOutcome, watch: _CommitWatch) -> DirectOutcome:
        """The outcome of a turn whose commit's waiter gave up while the writer ran it
        (:class:`WriteTimeout`, not withdrawn): it may have landed. Run again, a turn that
        landed found its events' markers and was taken for another runtime's: its reply
        was never sent. The journal decides instead, read on the writer after that commit's
        batch: the markers there and written by this commit, it committed (its replies
        leave); there but not this commit's, another runtime's turn ran the events; absent,
        nothing landed (a refused commit: the events run again). A read that fails too is
        tried again, the chat waiting, until it answers or the runtime stops (the stop hands
        the events to the inbox, which skips them if the commit landed)."""
        journal, ids = self.ctx.journal, list(watch.event_ids)
        tries = 0
        while True:
            try:
                found = journal.writer.call(lambda: journal.committed_of(ids))
                break
            except WriterClosed:
                raise
            except PersistenceError as exc:
                tries += 1
                log.warning("the commit of a social turn in %s has an unknown outcome, and "
                            "reading the journal failed too (%s); trying again", sid, exc)
                if self._stop.wait(rules.stall_pause(tries)):
                    raise WriterClosed("stopping before the outcome of a social turn's "
                                       "commit was known") from exc
        if ids and found == set(ids) and watch.wrote:
            log.info("the commit of a social turn in %s landed after its waiter gave up", sid)
            return replace(done, committed=True, error=None, commit_error=None)
        if found:  # another runtime's turn committed these events: concluded as such
            return replace(done, commit_error=None)
        return done  # nothing of it landed: a refused commit

    def _send_replies(self, sid: str, event: rules.SocialEvent, turn: Turn) -> None:
        self.channels.send(sid, event.platform, event.reply_route, "\n\n".join(turn.replies),
                           event.event_id)

    def outbox(self, ctx: RuntimeContext, turn: Turn, outcome: TurnOutcome
               ) -> HookReads | None:
        """Outbox hook: replies of an inbox turn in a social session leave through the
        channel too: an event a stop handed to the inbox by its own reply route, an
        ``agent_send`` to the thread by the thread's last one. Which route reads the
        session: what it returns is that work (:data:`.context.OutboxHook`)."""
        events = [m for m in turn.messages if m.kind == SOCIAL_KIND]
        if (not outcome.ok or not turn.replies
                or not turn.session_id.startswith(rules.SESSION_PREFIX)
                or (events and turn.row is None) or self.turns is None):
            return None  # a social event's own (direct) turn sends its replies itself
        return partial(self._reply_sends, ctx, turn, events)

    def _reply_sends(self, ctx: RuntimeContext, turn: Turn, events: list[Message]
                     ) -> TurnEffects:
        """:meth:`outbox`'s effects: the send of the turn's replies once it committed."""
        assert self.turns is not None
        effects = TurnEffects()
        session = ctx.store.session(turn.session_id)
        route = (events[-1].payload.get("reply_route") if events
                 else session.config.get("social_reply_route") if session else None)
        if session is None or session.kind != "social" or session.platform is None \
                or not isinstance(route, dict):
            return effects
        text, cause = "\n\n".join(turn.replies), turn.messages[0].message_id
        turns, platform = self.turns, session.platform
        effects.after.append(lambda: turns.submit(
            lambda: self.channels.send(session.id, platform, route, text, cause)))
        return effects


@dataclass
class _CommitWatch:
    """What a social turn's commit wrote, as its writer ran it (read once its batch is
    over): the events whose markers it writes, and whether it wrote them."""

    event_ids: list[str] = field(default_factory=list)
    wrote: bool = False


def _outcome_unknown(error: PersistenceError | None) -> bool:
    """A commit whose waiter gave up once the writer had taken it: it may yet land."""
    return isinstance(error, WriteTimeout) and not error.withdrawn


def _message(event: rules.SocialEvent) -> Message:
    return Message(event.event_id, SOCIAL_KIND, rules.envelope(event), None,
                   {"platform": event.platform, "sender_id": event.sender_id,
                    "sender_name": event.sender_name, "thread_id": event.thread_id,
                    "attachments": [asdict(a) for a in event.attachments],
                    "reply_route": dict(event.reply_route)})
