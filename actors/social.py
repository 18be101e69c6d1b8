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
message whose turn committed); if not, they run at the next start. Until a
thread's handed-over events have run, its new ones join them in the inbox, behind
them (:mod:`.social_chats`), so the thread is answered in order. A crash
loses what was only in memory (no turn committed it).
A turn's commit writes its events' delivery markers and is refused when one
has a marker already, so a platform's retry that reached another runtime on
the same PostgreSQL commits once, and only once are its replies sent. A commit
whose batch outran its wait (it may land after) is waited for until it lands or
fails: landed, its replies leave; failed, its events run again (never both,
never neither).

After a turn commits, its replies go to the platform's channel adapter
(:mod:`.channels`) with the event's reply route; the outcome is recorded in
the transcript as a hidden ``delivery`` entry and kept in ``outcomes``. The
thread's last reply route is kept in the session's config, so the replies
of a turn another session started there (``agent_send``) leave the same way.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from ..persistence import PersistenceError, WriterClosed
from . import channels
from . import social_rules as rules
from .context import HookReads, RuntimeContext, TurnEffects
from .runtime_options import check_delays, check_seconds
from .social_ingress import SocialIngress
from .social_state import DEFAULT_QUEUE_BOUND, RECENT_IDS, SOCIAL_KIND, thread_patch
from .turn import Message, Turn, TurnOutcome

__all__ = ["DEFAULT_QUEUE_BOUND", "RECENT_IDS", "SOCIAL_KIND", "SocialService"]

log = logging.getLogger("kinbox.social")


class SocialService(SocialIngress):
    """Social ingress of one runtime (``rt.social``): its configuration and life cycle; the
    events go in through :class:`.social_ingress.SocialIngress` and run in
    :class:`.social_chats.ChatTurns`."""

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
        for sender_id in ids:  # each one an event can carry: else it denies in silence
            rules.allowed_sender(sender_id)
        with self._lock:
            self._allow[platform] = ids

    def register_channel(self, platform: str, send: channels.Send, *,
                         secret: str | bytes | None = None) -> None:
        """Register how replies leave for ``platform`` and, for webhooks, its signing secret;
        replies held for it (turns that ran before it was registered) leave now."""
        if not isinstance(platform, str) or not rules.PLATFORM_RE.fullmatch(platform):
            raise rules.InvalidSocialEvent("platform", "1-32 characters of a-z, 0-9 and _")
        if not callable(send) or not channels.takes_route_and_text(send):
            # One that cannot take them failed every reply, retried as if the platform
            # were down, and settled it unsent.
            raise rules.InvalidSocialEvent("send", "give a callable send(reply_route, text)")
        if secret is not None and (not isinstance(secret, str | bytes) or not secret):
            # An empty key signs anything anyone can compute: the webhook would be open
            # (a secret read from an unset environment variable, say).
            raise rules.InvalidSocialEvent("secret", "give a non-empty signing secret, or None "
                                                     "for a platform without a webhook")
        key = secret.encode() if isinstance(secret, str) else secret
        if key is not None and len(key) < rules.MIN_SECRET_BYTES:
            raise rules.InvalidSocialEvent(  # never quoting it
                "secret", f"the signing secret has {len(key)} bytes, fewer than "
                          f"{rules.MIN_SECRET_BYTES}: a short one is guessed by trying "
                          "(`openssl rand -hex 32` makes one)")
        # Those an earlier life's stop or crash cut off first (a thread's earlier replies
        # leave first), looked for before the adapter is set and this life's held replies
        # are taken: a look that fails then raises with nothing registered nor taken, and
        # the product's next registration finds them all (taken first, they were lost).
        left = self.channels.left_kept(platform) if self.turns is not None else []
        held = left + self.channels.register(platform, send, key)
        for reply in held:  # replies that ran before the product registered this channel
            self._send_later(platform, reply)

    def take_over_the_gone(self) -> None:
        """PostgreSQL, on the runtime's tick: send the replies that runtimes which died
        while this one ran kept and never sent (:meth:`.channels.Channels.left_by_the_gone`;
        at registration this runtime took up only those left until then)."""
        if self.turns is not None:
            for platform, reply in self.channels.left_by_the_gone():
                self._send_later(platform, reply)

    def _send_later(self, platform: str, reply: channels.HeldReply) -> None:
        """Send a held reply on the turn pool (a failing send retries for seconds)."""
        assert self.turns is not None  # only a runtime that runs turns has replies
        sender = self.channels
        self._sends.submit(reply.session_id, lambda: sender.send(
            reply.session_id, platform, reply.route, reply.text, reply.cause_id),
            self.turns.submit)

    def webhook_secret(self, platform: str) -> bytes | None:
        """The platform's webhook signing secret (None: its webhook is closed)."""
        channel = self.channels.get(platform)
        return channel.secret if channel else None

    @property
    def retry_delays(self) -> tuple[float, ...]:
        """Seconds before each retry of a failed channel send."""
        return self.channels.retry_delays

    @retry_delays.setter
    def retry_delays(self, delays: Sequence[float]) -> None:
        self.channels.retry_delays = check_delays("retry_delays", delays)

    @property
    def send_timeout(self) -> float:
        """Seconds an ``async def`` send may run before it is cancelled (a failed attempt)."""
        return self.channels.send_timeout

    @send_timeout.setter
    def send_timeout(self, seconds: float) -> None:
        check_seconds("send_timeout", seconds)
        self.channels.send_timeout = float(seconds)

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
        with self._lock:
            allowed = [e for e in events
                       if rules.authorized(self._allow, e.platform, e.sender_id)]
        handed = lost = 0
        for done, event in enumerate(allowed):
            try:
                self._hand_over_one(event)
                handed += 1
            except WriterClosed:  # nothing more can be kept
                lost += len(allowed) - done
                break
            except Exception as exc:  # this event's alone: the others are tried all the same
                lost += 1
                # Its type only above DEBUG: an error's text may quote the event's.
                log.error("social event %s could not be kept (%s)", event.event_id,
                          type(exc).__name__)
                log.debug("social event %s could not be kept", event.event_id, exc_info=True)
        if lost:
            log.error("social ingress stopped: %d accepted events could not be kept", lost)
        if handed:
            log.warning("social ingress stopped: %d accepted events not yet run were handed "
                        "to the inbox; they run at the next start", handed)
        return handed

    def _hand_over_one(self, event: rules.SocialEvent) -> None:
        """:meth:`_to_inbox`, once more after a failed write: a write that timed out or met
        a busy database is withdrawn or may have committed, and the enqueue is idempotent
        (one row however often), so the second try keeps it or finds it kept."""
        try:
            self._to_inbox(event)
        except WriterClosed:
            raise
        except PersistenceError:
            self._to_inbox(event)

    # -- replies of inbox turns --------------------------------------------------------------

    def outbox(self, ctx: RuntimeContext, turn: Turn, outcome: TurnOutcome
               ) -> HookReads | None:
        """Outbox hook: replies of an inbox turn in a social session leave through the
        channel too: an event a stop handed to the inbox by its own reply route, an
        ``agent_send`` to the thread by the thread's last one. Which route reads the
        session: what it returns is that work (:data:`.context.OutboxHook`). A turn on
        handed-over events keeps the last one's reply route with the thread, as a direct
        turn does, for the replies of the thread's later ``agent_send`` turns."""
        events = [m for m in turn.messages if m.kind == SOCIAL_KIND]
        if (not outcome.ok or not (turn.replies or events)
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
        now = ctx.now()
        if events:
            sender = events[-1].payload.get("sender_id")
            patch = thread_patch(route, sender if isinstance(sender, str) else None)
            effects.ops.append(lambda: ctx.store.patch_config_now(session.id, patch, now))
        text, cause = rules.reply_text(turn.replies), turn.messages[0].message_id
        if not text:  # nothing to say (no reply, or only blank ones): nothing to post
            return effects
        turns, platform = self.turns, session.platform
        effects.ops.append(lambda: self.channels.keep_now(session.id, platform, route, text,
                                                          cause, now))
        effects.after.append(lambda: self._sends.submit(session.id, lambda: self.channels.send(
            session.id, platform, route, text, cause), turns.submit))
        return effects
