"""The state social ingress shares between its parts (SO1), and what they all use.

One lock guards it all: each thread's routing state (:class:`Chat`), the
accepted events no turn has taken yet (what a stop hands to the inbox), those a
running turn took, the counters, and how many events are between acceptance and
the end of their turn (the bound). :class:`SocialState` holds it;
:mod:`.social_chats` runs the chats' turns on it, :mod:`.social_ingress` takes
events into it, and :class:`.social.SocialService` configures, starts and stops
it.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..persistence import DuplicateError, IdempotencyConflict, NewMessage
from . import channels
from . import social_rules as rules
from .context import RuntimeContext
from .delayed import Delayed
from .direct_turn import DirectTurns
from .social_sends import ThreadSends
from .turn import Message

log = logging.getLogger("kinbox.social")

SOCIAL_KIND = "social_message"
"""The kind of the message a social event's turn starts with."""
DEFAULT_QUEUE_BOUND = 256
RECENT_IDS = 10_000
"""How many accepted event ids are remembered, so a platform's retry is not run twice (at
a start, the newest ones the database holds: committed turns' and the inbox's)."""


@dataclass
class Chat:
    """The routing state of one thread (touched under the service lock only)."""

    running_sender: str | None = None
    steering: deque[rules.SocialEvent] = field(default_factory=deque)
    pending: deque[rules.SocialEvent] = field(default_factory=deque)
    stalls: int = 0
    """Turns in a row that could not run at all (each pauses the chat longer)."""


class SocialState:
    """What social ingress keeps in memory, under one lock (``_lock``)."""

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
        self._chats: dict[str, Chat] = {}
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
        self._sends = ThreadSends(self._stop.is_set)
        """Every reply of a thread (its events' turns', its inbox turns', held and kept
        ones), lined up per session: they leave in order."""

    def _handled(self) -> None:
        with self._lock:
            self._handling -= 1

    def _give_back(self, events: list[rules.SocialEvent]) -> None:
        """Make ``events`` (taken for a turn that did not run them) unstarted again, ahead of
        the others: they came first, and a stop hands them over in that order. Under the
        lock."""
        if events:
            self._unstarted = {**{e.event_id: e for e in events}, **self._unstarted}
            for e in events:
                self._in_turn.pop(e.event_id, None)

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

    def _to_inbox(self, event: rules.SocialEvent) -> None:
        """Enqueue ``event`` to its thread's session as an inbox message (its session made
        first): an inbox turn runs it, in the order of the session's rows, and its
        replies leave by its own reply route (:meth:`.social.SocialService.outbox`).
        Idempotent: the same event enqueued twice is one row, and one the inbox holds
        rendered otherwise (handed over by a runtime of another version sharing the
        database) is that row: it runs there, once."""
        sid = self._ensure_session(event)
        message = turn_message(event)
        try:
            self.ctx.journal.enqueue(NewMessage(event.event_id, sid, message.content,
                                                kind=SOCIAL_KIND, payload=message.payload),
                                     self.ctx.now())
        except IdempotencyConflict:
            log.info("social event %s is in the inbox already", event.event_id)


def thread_patch(reply_route: Mapping[str, Any], sender_id: str | None) -> dict[str, Any]:
    """What a thread's session keeps of the last event a turn answered (committed with
    it): its reply route, by which a turn another session starts there (``agent_send``)
    answers, and its sender."""
    return {"social_reply_route": dict(reply_route), "social_last_sender": sender_id}


def turn_message(event: rules.SocialEvent) -> Message:
    """The turn message of a social event: its envelope, and what the turn and its
    replies need to know (platform, sender, thread, the sender's text whole,
    attachments, reply route)."""
    return Message(event.event_id, SOCIAL_KIND, rules.envelope(event), None,
                   {"platform": event.platform, "sender_id": event.sender_id,
                    "sender_name": event.sender_name, "thread_id": event.thread_id,
                    "text": event.text,
                    "attachments": [asdict(a) for a in event.attachments],
                    "reply_route": dict(event.reply_route)})
