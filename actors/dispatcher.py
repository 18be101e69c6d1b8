"""The dispatcher actor: claims due rows by lease and hands them to session actors.

Its mailbox mirror is the set of due rows in the journal; its own messages
(``Wake``, ``Tick``, ``TurnDone``) are ephemeral nudges. Rows come to it two
ways: its own claims (recovery, retries that came due, rows other processes
wrote, every row on PostgreSQL), and ``Claimed`` rows a send leased in its own
transaction (the fast path, see ``RuntimeContext.fast_lease``), which need no
claim; a plain committed turn needs no claim after it either. It keeps one row in
flight per target (the journal enforces that across processes, the ``busy``
set within this one), delivers to different targets concurrently (at most
``max_active`` turns at once: the size of the session actors' thread pool),
renews the leases of running turns, and keeps the number of live session
actors within ``max_live`` by passivating idle ones (rules in
``passivation``). It owns the pool its session actors run on.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import pykka

from ..persistence import ClaimedRow, PersistenceError, WriterClosed
from . import passivation
from .context import RuntimeContext
from .messages import Claimed, ClaimNow, Deliver, Tick, TurnDone, Wake
from .pooled import ActorPool
from .session_actor import SessionActor

log = logging.getLogger("kinbox.dispatcher")


class Dispatcher(pykka.ThreadingActor):
    """Claims due inbox rows and routes each to its session actor."""

    # A daemon, like every kinbox thread: a program that never calls stop() still
    # reaches atexit, where the runtime stops cleanly.
    use_daemon_thread = True

    def __init__(self, ctx: RuntimeContext, max_active: int, idle_ttl: float,
                 max_live: int, threads: int | None = None) -> None:
        super().__init__()
        self.ctx = ctx
        self.max_active = max_active
        self.max_live = max_live
        db = ctx.journal.t.db
        # Sync turns each hold a pool thread; async ones only pass through it.
        self.pool = ActorPool(threads or max_active, name="kinbox-session",
                              on_exit=lambda: None if db.is_closed() else db.close())
        self.idle_ttl = idle_ttl
        self.live: OrderedDict[str, pykka.ActorRef[Any]] = OrderedDict()
        self.last_used: dict[str, float] = {}
        self.busy: set[str] = set()
        self.waiting: OrderedDict[str, ClaimedRow] = OrderedDict()
        """Rows leased for this runtime outside a claim that wait for a free slot, or for
        their session's last turn to be done: at most one per session."""
        self.backlog = True
        """Due rows may be left in the journal: claim after the next turn (until a claim
        comes back with room to spare)."""
        self.suspect: str | None = None
        """The session running a suspect row (its last worker died mid-turn), if any: one
        at a time, so a death during it is that row's."""
        self.suspects_held = False
        """A claim left due suspect rows behind the running one: the next claims once it is
        done (a restart after a crash replays them back to back, not one per tick)."""
        self.claim_scheduled = False
        self.last_renewal = 0.0

    def on_receive(self, message: Any) -> None:
        if self.ctx.crashed.is_set():
            return
        try:
            self._handle(message)
        except Exception:
            # A bug or an unexpected driver error must not stop the runtime's only
            # dispatcher: the journal still holds every row, the next nudge or tick
            # claims again, and rows leased just before the error come back when
            # their lease runs out.
            log.exception("the dispatcher failed on %s; carrying on", type(message).__name__)

    def _handle(self, message: Any) -> None:
        if isinstance(message, Claimed):
            row = message.row
            if row.target in self.busy or len(self.busy) >= self.max_active:
                self.waiting[row.target] = row
            else:
                self._start(row, "leased with its send")
            self._publish()
        elif isinstance(message, TurnDone):
            self.busy.discard(message.session_id)
            next_suspect = False
            if self.suspect == message.session_id:
                self.suspect = None
                next_suspect, self.suspects_held = self.suspects_held, False
            self.last_used[message.session_id] = self.ctx.now()
            self._fill()
            self._publish()
            if message.claim or self.backlog or next_suspect:
                self._schedule_claim()
        elif isinstance(message, Wake):
            self.ctx.wake_pending = False  # before the claim: later sends nudge again
            self.backlog = True
            self._schedule_claim()
        elif isinstance(message, ClaimNow):
            self.claim_scheduled = False
            self._claim()
        elif isinstance(message, Tick):
            now = self.ctx.now()
            for session_id in self.ctx.turns.stop_overdue(now, self.ctx.turn_timeout):
                log.warning("the turn of %s ran past turn_timeout=%ss; asked it to stop",
                            session_id, self.ctx.turn_timeout)
            if self.ctx.async_host is not None:
                lingering = self.ctx.turns.ignoring_stop(now, self.ctx.stop_grace)
                if lingering:
                    self.ctx.async_host.cancel(lingering)
            self._renew_leases()
            self._passivate_expired()
            self._claim()

    def on_stop(self) -> None:
        # Stop every session actor at once, then wait: running turns finish and commit.
        futures = [ref.stop(block=False) for ref in self.live.values()]
        for future in futures:
            try:
                future.get(timeout=30)
            except Exception:
                log.warning("a session actor did not stop in time")
        self.live.clear()
        self.pool.stop()
        self.ctx.journal.t.db.close()

    def _schedule_claim(self) -> None:
        # Many wakes queued behind each other cost one claim query.
        if not self.claim_scheduled:
            self.claim_scheduled = True
            self._publish()
            self.actor_ref.tell(ClaimNow())

    def _publish(self) -> None:
        self.ctx.activity.publish(busy=len(self.busy) + len(self.waiting),
                                  claim_pending=self.claim_scheduled, live=len(self.live))

    def _start(self, row: ClaimedRow, how: str) -> None:
        """Run ``row``'s turn on its session actor (its session is not busy here)."""
        log.debug("%s %s for %s (attempt %d)", how, row.message_id, row.target,
                  row.attempts + 1)
        if row.taken_over:
            self.suspect = row.target
        self.busy.add(row.target)
        self._actor_for(row.target).tell(Deliver(row))
        self.ctx.emit("claimed", message_id=row.message_id, session_id=row.target,
                      attempt=row.attempts + 1)

    def _fill(self) -> None:
        """Start waiting rows while there are free slots, oldest first."""
        for target in list(self.waiting):
            if len(self.busy) >= self.max_active:
                return
            if target not in self.busy:
                self._start(self.waiting.pop(target), "leased with its send")

    def _claim(self) -> None:
        capacity = self.max_active - len(self.busy)
        if capacity <= 0:
            return
        ctx = self.ctx
        try:
            result = ctx.journal.claim(ctx.owner, ctx.now(), limit=capacity,
                                       lease=ctx.lease_seconds,
                                       exclude=self.busy | self.waiting.keys(),
                                       suspects=0 if self.suspect else 1)
        except WriterClosed:
            return
        except PersistenceError as exc:
            log.error("claim failed: %s", exc)
            return
        for message_id in result.acked_by_marker:
            log.debug("acknowledged %s by its committed marker (no second turn)", message_id)
            ctx.emit("acked_by_marker", message_id=message_id)
        for row in result.rows:
            self._start(row, "claimed")
        self.suspects_held = self.suspects_held or result.held_back
        self.backlog = len(result.rows) == capacity
        if self.suspects_held and not self.suspect:
            # Held back with none running (the one claimed failed at its takeover): no
            # turn's end would claim them, so claim again now.
            self.suspects_held = False
            self._schedule_claim()
        elif result.acked_by_marker or self.backlog:
            self._schedule_claim()
        self._publish()

    def _actor_for(self, session_id: str) -> pykka.ActorRef[Any]:
        ref = self.live.get(session_id)
        if ref is not None and not ref.is_alive():  # it failed outside a turn: start anew
            self.live.pop(session_id)
            ref = None
        if ref is None:
            for victim in passivation.evictions_for(self.live.keys(), self.busy, session_id,
                                                    self.max_live):
                self._passivate(victim)
            ref = SessionActor.start(self.ctx, session_id, self.pool)
            self.live[session_id] = ref
            self.ctx.activity.bump("activations")
        self.live.move_to_end(session_id)
        self.last_used[session_id] = self.ctx.now()
        return ref

    def _passivate(self, session_id: str) -> None:
        ref = self.live.pop(session_id, None)
        self.last_used.pop(session_id, None)
        if ref is not None:
            ref.stop(block=False)
            self.ctx.activity.bump("passivations")

    def _passivate_expired(self) -> None:
        for session_id in passivation.expired_idle(self.last_used, self.busy, self.ctx.now(),
                                                   self.idle_ttl):
            self._passivate(session_id)
        self._publish()

    def _renew_leases(self) -> None:
        now = self.ctx.now()
        held = self.busy | self.waiting.keys()
        if not held or now - self.last_renewal < self.ctx.lease_seconds / 3:
            return
        self.last_renewal = now
        try:
            self.ctx.journal.renew(self.ctx.owner, sorted(held),
                                   now + self.ctx.lease_seconds, now)
        except PersistenceError as exc:
            log.error("lease renewal failed: %s", exc)
            return
        log.debug("renewed the leases of %d running or waiting turns", len(held))
