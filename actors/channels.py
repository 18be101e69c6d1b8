"""Channel adapters: how a social reply leaves for its platform, with retries.

The product registers one adapter per platform
(``rt.social.register_channel("slack", send=post_to_slack)``); kinbox calls
``send(reply_route, text)`` once the turn that produced the reply has
committed, so a reply is sent only if it is in the transcript. ``send`` may
be a plain function or a coroutine function: the coroutines of a runtime's
sends all run on one event loop (:mod:`.channel_loop`), so a client the
adapter keeps stays usable; one still running ``send_timeout`` seconds in is
cancelled (a failed attempt, retried as any other). A failing send is tried again
after each of ``retry_delays``; one that raised :class:`.ChannelBusy` (the
platform's 408, 429 or 5xx; :func:`platform_error` maps an HTTP answer) no sooner
than the platform asked (at most ``MAX_RETRY_AFTER``), one that raised
:class:`.ChannelRefused` (a 4xx) not at all. Whatever happens, the outcome
(sent, or why not) is recorded, and a channel that stays down loses nothing:
the reply is in the transcript.

A reply for a platform with no adapter yet (an event a stop handed to the
inbox, run by the next start before the product registered its channels) is
held in memory, the newest ``HELD_PER_PLATFORM`` per platform, and sent when
an adapter for its platform is registered; a stop drops what is held (the
replies stay in the transcript, their outcome ``no_channel``).

A committed reply is durable until its send ended for good: the turn's commit keeps it
in the outbox of social replies (:mod:`kinbox.persistence.social_outbox`), and the send
settles it once the platform accepted or refused it, or every retry failed. A send that
a stop or crash cut off (``interrupted``), or that never began, leaves it kept, and the
next start sends it again once the platform's adapter is registered; on PostgreSQL a live
runtime that registered the platform takes over, within a tick, the replies a runtime
that died beside it kept (:meth:`Channels.left_by_the_gone`). At least once: an
adapter that takes a ``reply_id`` keyword gets the reply's stable id (the message id
that caused it), for a platform that drops a post it already took under that id.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..persistence import KeptReply, PersistenceError, SocialOutbox, TurnEntry, WriterClosed
from . import social_rules as rules
from .brain_scope import brain_of
from .channel_loop import CANCEL_GRACE, ChannelLoop
from .context import RuntimeContext
from .http_failure import retry_after_seconds

log = logging.getLogger("kinbox.social")

OUTCOMES_KEPT = 200
HELD_PER_PLATFORM = 100
"""Replies kept per platform while it has no adapter (the oldest go first)."""

Send = Callable[[Mapping[str, Any], str], Any]
"""``send(reply_route, text)``: deliver a reply; raise to have it retried."""

DEFAULT_RETRY_DELAYS: tuple[float, ...] = (1.0, 2.0, 4.0)
"""Seconds to wait before each retry of a failed send (so four attempts in all)."""
DEFAULT_SEND_TIMEOUT = 30.0
"""Seconds an ``async def`` send may run before it is cancelled (a plain function's own
HTTP client has to bound it: kinbox cannot interrupt a blocking call)."""
MAX_RETRY_AFTER = 60.0
"""The longest wait a platform's ``Retry-After`` gets: the chat's next turn waits for
its reply to leave."""


@dataclass(frozen=True)
class DeliveryOutcome:
    """What happened to one reply."""

    status: str
    """``sent``, ``failed`` (every attempt raised), ``interrupted`` (the runtime stopped
    during the send or before a retry: sent again at the next start), ``no_channel`` or
    ``no_reply``."""
    attempts: int
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON."""
        return {"status": self.status, "attempts": self.attempts, "error": self.error}


def call_send(
    send: Send, route: Mapping[str, Any], text: str, loop: ChannelLoop, timeout: float
) -> None:
    """Call a sync or async ``send`` to completion, the calling (worker) thread waiting; a
    coroutine runs on the runtime's channel loop, cancelled ``timeout`` seconds in."""
    result = send(route, text)
    if inspect.isawaitable(result):
        loop.run(result, timeout)


def platform_error(status: int, retry_after: str | None, now: float) -> rules.SocialError | None:
    """The error a channel adapter raises for a platform's HTTP answer ``status`` (None
    for a 2xx or 3xx): :class:`.ChannelBusy` for 408, 429 and 5xx, with the wait its
    ``Retry-After`` header asks (seconds, or an HTTP date measured from ``now``; None
    when absent or unreadable), :class:`.ChannelRefused` for any other 4xx."""
    if status < 400:
        return None
    if status in (408, 429) or status >= 500:
        return rules.ChannelBusy(retry_after_seconds(retry_after, now), f"HTTP {status}")
    return rules.ChannelRefused(status)


def deliver(
    send: Send | None,
    route: Mapping[str, Any],
    text: str,
    *,
    retry_delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS,
    wait: Callable[[float], object],
    loop: ChannelLoop,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
    stopped: Callable[[], bool] = lambda: False,
) -> DeliveryOutcome:
    """Send ``text`` through ``send``, retrying after each delay (or the longer wait a
    :class:`.ChannelBusy` asked, capped; never after a :class:`.ChannelRefused`); never
    raises.

    ``wait(seconds)`` is how the caller pauses between attempts (it returns
    early when the runtime stops); ``loop`` runs an async ``send``, for at most
    ``send_timeout`` seconds an attempt. An attempt that fails once the runtime is
    ``stopped`` (its stop cut the send off), or a retry a stop came before, ends it
    ``interrupted``.
    """
    if not text:
        return DeliveryOutcome("no_reply", 0)
    if send is None:
        return DeliveryOutcome(
            "no_channel", 0, "no channel adapter is registered (held until one is)"
        )
    error, asked = None, 0.0
    for attempt, delay in enumerate((0.0, *retry_delays), start=1):
        pause = max(delay, asked) if attempt > 1 else 0.0
        if pause and wait(pause):
            return DeliveryOutcome("interrupted", attempt - 1, f"stopped before retrying: {error}")
        asked = 0.0
        try:
            call_send(send, route, text, loop, send_timeout)
        except rules.ChannelRefused as exc:  # never passes: retrying only repeats it
            error = f"{type(exc).__name__}: {exc}"
            log.warning("channel send attempt %d refused for good: %s", attempt, kind_of(exc))
            log.debug("channel send attempt %d: %s", attempt, error)
            return DeliveryOutcome("failed", attempt, error)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, rules.ChannelBusy) and exc.retry_after is not None:
                asked = min(max(exc.retry_after, 0.0), MAX_RETRY_AFTER)
            log.warning("channel send attempt %d failed: %s", attempt, kind_of(exc))
            log.debug("channel send attempt %d: %s", attempt, error)
            if stopped():
                return DeliveryOutcome("interrupted", attempt, error)
            continue
        return DeliveryOutcome("sent", attempt)
    return DeliveryOutcome("failed", 1 + len(retry_delays), error)


def kind_of(exc: Exception) -> str:
    """What a log line above DEBUG says of an adapter's error: its type, and the status or
    wait a platform answered. Never its text: that is the product's, and may name a token
    (a Telegram bot's URL, which requests' ``raise_for_status`` quotes) or quote the reply
    (the outcome and the transcript's delivery entry keep it; DEBUG logs it)."""
    if isinstance(exc, rules.ChannelRefused):
        return f"{type(exc).__name__} (status {exc.status})"
    if isinstance(exc, rules.ChannelBusy) and exc.retry_after is not None:
        return f"{type(exc).__name__} (asked to wait {exc.retry_after:g} s)"
    return type(exc).__name__


@dataclass(frozen=True)
class HeldReply:
    """A committed reply waiting for its platform's adapter."""

    session_id: str
    route: Mapping[str, Any]
    text: str
    cause_id: str


@dataclass(frozen=True)
class Channel:
    """A registered adapter."""

    send: Send
    secret: bytes | None = field(repr=False)
    """The platform's webhook signing secret (None: no webhook); never in a repr, which
    tracebacks with locals and error trackers record."""
    takes_reply_id: bool = False
    """``send`` takes a ``reply_id`` keyword: the reply's dedupe key is passed."""

    def send_of(self, reply_id: str) -> Send:
        """``send(reply_route, text)`` for the reply ``reply_id``."""
        return partial(self.send, reply_id=reply_id) if self.takes_reply_id else self.send


def takes_route_and_text(send: Send) -> bool:
    """Can ``send`` be called as ``send(reply_route, text)``, with ``reply_id=`` too when it
    takes one (:meth:`Channel.send_of`: a required ``reply_id`` keyword is given)? True
    when its signature cannot be read (a builtin): only a call would tell."""
    try:
        signature = inspect.signature(send)
    except (TypeError, ValueError):
        return True
    extra = {"reply_id": ""} if takes_reply_id(send) else {}
    try:
        signature.bind({}, "", **extra)
    except TypeError:
        return False
    return True


def takes_reply_id(send: Send) -> bool:
    """Does ``send`` take a ``reply_id`` keyword (the platform's dedupe key)?"""
    try:
        parameters = inspect.signature(send).parameters
    except (TypeError, ValueError):  # a builtin, a callable without a signature
        return False
    found = parameters.get("reply_id")
    return found is not None and found.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


class Channels:
    """The channel adapters of one runtime, and what happened to each reply sent."""

    def __init__(
        self,
        ctx: RuntimeContext,
        stop: threading.Event,
        retry_delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS,
    ) -> None:
        self.ctx = ctx
        self.retry_delays = retry_delays
        self.send_timeout = DEFAULT_SEND_TIMEOUT
        """Seconds an async send may run before it is cancelled (a failed attempt)."""
        self.loop = ChannelLoop()
        """Where the async sends run, for the runtime's life (:meth:`close` ends it)."""
        self.outcomes: deque[dict[str, Any]] = deque(maxlen=OUTCOMES_KEPT)
        self.kept = SocialOutbox(ctx.store.t, ctx.store.writer)
        """Committed replies until their send ended for good (the module docstring)."""
        self._recovered: set[str] = set()
        """Platforms registered here, whose replies other runtimes left kept are taken up
        (the tick's :meth:`left_by_the_gone` looks at these)."""
        self._looked: set[str] = set()
        """Platforms whose registration's look for those replies succeeded: a failed look
        (the database did not answer) is made again by the next registration."""
        self._unsure: dict[str, str] = {}
        """Replies whose take-over failed (reply id -> platform): it may have committed as
        its answer was lost with the connection, and then they are this runtime's, which
        no other runtime takes over while it lives, and :meth:`_take_left` takes them
        (again) at its next look."""
        self.gone: Callable[[set[str]], set[str]] | None = None
        """On PostgreSQL, which of these runtimes are gone (their life lock is free): the
        replies a live one kept are its own to send. None: every other runtime is (SQLite
        has one delivering runtime at a time)."""
        self._stop = stop
        self._lock = threading.Lock()
        self._channels: dict[str, Channel] = {}
        self._held: dict[str, deque[HeldReply]] = {}

    def register(self, platform: str, send: Send, secret: bytes | None) -> list[HeldReply]:
        """Set the platform's adapter (replacing an earlier one); the replies held for it,
        oldest first, for the caller to send."""
        with self._lock:
            self._channels[platform] = Channel(send, secret, takes_reply_id(send))
            return list(self._held.pop(platform, ()))

    def left_kept(self, platform: str) -> list[HeldReply]:
        """The replies for ``platform`` that an earlier life of this runtime (or another
        runtime) kept and whose send never ended (a stop or crash cut it off), oldest
        first; once per platform (a registration that replaces an adapter gets none), unless
        that look failed: then the next registration looks again (on SQLite nothing else
        does)."""
        with self._lock:
            if platform in self._looked:
                return []
            self._looked.add(platform)
            self._recovered.add(platform)
        try:
            return [reply for _, reply in self._take_left([platform])]
        except BaseException:
            with self._lock:
                self._looked.discard(platform)
            raise

    def left_by_the_gone(self) -> list[tuple[str, HeldReply]]:
        """PostgreSQL, on the runtime's tick: the replies for the platforms this runtime
        recovered at registration that a runtime gone since then kept (it died while this
        one ran), as (platform, reply), oldest first; each taken over once."""
        with self._lock:
            platforms = sorted(self._recovered)
        if self.gone is None or not platforms:
            return []
        return self._take_left(platforms)

    def _take_left(self, platforms: list[str]) -> list[tuple[str, HeldReply]]:
        me = self.ctx.owner
        with self._lock:  # this look's alone: two looks taking one reply both sent it
            unsure = {mid: p for mid, p in self._unsure.items() if p in platforms}
            for mid in unsure:
                del self._unsure[mid]
        tried: list[KeptReply] = []
        try:
            left = self.kept.left_by_others(platforms, me, also=unsure)
            if left and self.gone is not None:
                others = {r.owner for r in left} - {me}
                try:
                    gone = self.gone(others) if others else set()
                except Exception:  # not proven gone: their runtimes may still send them
                    log.exception("could not tell which runtimes that kept replies are gone")
                    gone = set()
                left = [r for r in left if r.owner in gone or r.owner == me]
            # Taken over first: another runtime (or this one's tick) may have found the same.
            tried = left
            taken = self.kept.take_over([r.reply_id for r in left], {r.owner for r in left}, me)
        except BaseException as exc:
            with self._lock:
                self._unsure.update(unsure)
                if isinstance(exc, PersistenceError) and not isinstance(exc, WriterClosed):
                    self._unsure.update((r.reply_id, r.platform) for r in tried)
            raise
        return [(r.platform, HeldReply(r.session_id, r.route, r.text, r.reply_id))
                for r in left if r.reply_id in taken]

    def keep_now(
        self,
        session_id: str,
        platform: str,
        route: Mapping[str, Any],
        text: str,
        cause_id: str,
        now: float,
    ) -> None:
        """Keep a reply inside its turn's commit (on the writer), until its send ends."""
        if text:
            reply = KeptReply(cause_id, session_id, platform, route, text, self.ctx.owner)
            self.kept.keep_now(reply, now)

    def get(self, platform: str) -> Channel | None:
        """The platform's adapter, if one is registered."""
        with self._lock:
            return self._channels.get(platform)

    def send(
        self, session_id: str, platform: str, route: Mapping[str, Any], text: str, cause_id: str
    ) -> DeliveryOutcome:
        """Deliver a committed reply and record the outcome (never raises); hold it when
        its platform has no adapter yet."""
        with self._lock:  # one look decides: a registration takes what is held after it
            channel = self._channels.get(platform)
            if channel is None and text:
                self._hold(platform, HeldReply(session_id, route, text, cause_id))
        with brain_of(self.ctx):  # the adapter's code: a stop it calls must not wait for it
            outcome = deliver(
                channel.send_of(cause_id) if channel else None,
                route,
                text,
                retry_delays=self.retry_delays,
                wait=self._stop.wait,
                loop=self.loop,
                send_timeout=self.send_timeout,
                stopped=self._stop.is_set,
            )
        self.record(session_id, platform, cause_id, outcome, durable=outcome.status != "no_reply")
        if outcome.status in ("sent", "failed"):  # ended for good: no start sends it again
            try:
                self.kept.settle(cause_id)
            except PersistenceError as exc:  # the runtime stopped: sent again, at least once
                log.info("the sent reply to %s stays kept (%s)", session_id, type(exc).__name__)
        return outcome

    def close(self, timeout: float = CANCEL_GRACE) -> None:
        """End the async sends' loop (after the sends' threads stopped or their wait ended:
        a send still running is cancelled, given ``timeout`` to end; a later one is
        refused)."""
        self.loop.close(timeout)

    def _hold(self, platform: str, reply: HeldReply) -> None:
        """Keep ``reply`` for ``platform``'s adapter, dropping the oldest beyond the bound.
        Under the lock."""
        held = self._held.setdefault(platform, deque())
        if len(held) >= HELD_PER_PLATFORM:
            dropped = held.popleft()
            log.warning(
                "no channel for %s: dropped the held reply to %s (it stays in the transcript)",
                platform,
                dropped.session_id,
            )
        held.append(reply)

    def record(
        self,
        session_id: str,
        platform: str,
        cause_id: str,
        outcome: DeliveryOutcome,
        *,
        durable: bool,
    ) -> None:
        """Keep an outcome in ``outcomes`` and, if ``durable``, in the transcript."""
        entry = {
            "session_id": session_id,
            "event_id": cause_id,
            "platform": platform,
            **outcome.to_dict(),
        }
        self.outcomes.append(entry)
        self.ctx.emit("social_delivery", **entry)
        if outcome.status == "failed":  # why, at DEBUG only: the adapter's text (kind_of)
            log.warning(
                "reply to %s on %s not sent after %d attempts",
                session_id,
                platform,
                outcome.attempts,
            )
            log.debug("reply to %s on %s not sent: %s", session_id, platform, outcome.error)
        if not durable:
            return
        # Durable next to the reply it is about, hidden from agent_read.
        note = f"delivery {outcome.status} via {platform} after {outcome.attempts} attempt(s)" + (
            f": {outcome.error}" if outcome.error else ""
        )
        try:
            self.ctx.store.append(
                session_id, [TurnEntry("delivery", note, False, cause_id)], self.ctx.now()
            )
        except WriterClosed:
            pass
        except PersistenceError as exc:
            # A record of the send, not part of it: raised, it cut the send off before it
            # settled the kept reply, which the next start then sent again.
            log.warning("the delivery note of the reply to %s was not written (%s)",
                        session_id, type(exc).__name__)
