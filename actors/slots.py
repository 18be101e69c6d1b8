"""The delivery slots of a runtime: which sessions have a row in flight here, and the rest.

One :class:`Slots` per delivering runtime, shared by every thread that
starts or ends a turn: a send that leased its row in the enqueue's
transaction (the fast path) starts the turn from the sender's thread, and a
session actor ending its run frees its slot and starts what waited for one
from its own thread. Neither goes through the dispatcher actor: each would
cost two thread hand-offs per message (measured: about a tenth of the
runtime's throughput). The dispatcher actor runs what must be serial and
may wait for the database: claims, lease renewals, passivation by age.

The state lives under one lock, held for a few dictionary operations and
never across a database call or an observer:

- ``busy``: sessions with a row in flight here (at most one each), at most
  ``max_active`` at once (the session threads);
- ``waiting``: leased rows that wait for a free slot or for their session's
  turn to end, oldest first, at most one per session (the journal leases one
  row per target);
- ``live``: the session actors, least recently used first, at most
  ``max_live`` (idle ones are passivated, :mod:`.passivation`); a running
  turn's actor is never passivated, so async turns (as many as
  ``max_active``) may hold more live until they end, when the excess goes;
- ``direct``: sessions a direct turn (a cron run, a social event) of this runtime runs;
  claims leave them out as they leave out ``busy`` ones, so that a row for one (a
  foreground child's result) stays free for that turn to take into itself
  (:meth:`.turn.Turn.take`) instead of being leased to an inbox turn that waits for it
  and runs the brain on it once more (on PostgreSQL claims skip the session's mark in
  the database too, whoever runs it);
- what the next claim must do: claim again (``backlog``, a row handed back),
  hold back suspect rows while one runs (a death during it is that row's);
- ``committing``: sessions whose run's last commit leases their next row, and how many
  claims had begun when it was submitted. A claim leaves busy sessions out, and such a
  commit reads the session's next row once (PostgreSQL: in its statement's snapshot;
  SQLite: in its transaction): a send committed after that read and before the run ends
  is seen by neither, not by the commit and not by a claim that began meanwhile (the one
  the send's notification caused, or a tick's). When a claim began since the submission,
  the run's end claims (:meth:`turn_done`); otherwise the send's own claim comes after the
  session is free and takes its row. The send waited for the next tick before.

It owns the pool the session actors run on (:mod:`.pooled`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from ..persistence import ClaimedRow, ClaimResult, WriterClosed
from . import passivation
from .context import RuntimeContext
from .messages import Deliver
from .pooled import ActorPool
from .session_actor import SessionActor

log = logging.getLogger("kinbox.dispatcher")

STOP_WAIT = 30.0
"""How long a stop waits for all session actors together (one deadline, not one each:
N turns deaf to their stop would otherwise hold the dispatcher's thread N times as long)."""

Started = list[tuple[pykka.ActorRef[Any], ClaimedRow, str]]
"""Turns a locked section started: told and announced once the lock is released."""


class Slots:
    """The slot table and the session actors of one runtime (thread-safe)."""

    def __init__(self, ctx: RuntimeContext, max_active: int, max_live: int,
                 threads: int | None = None) -> None:
        self.ctx = ctx
        self.max_active = max_active
        self.max_live = max_live
        db = ctx.journal.t.db
        # Sync turns each hold a pool thread; async ones only pass through it.
        self.pool = ActorPool(threads or max_active, name="kinbox-session",
                              on_exit=lambda: None if db.is_closed() else db.close())
        self.request_claim: Callable[[], None] = lambda: None
        """Asks the dispatcher to claim (it tells itself ``ClaimNow``); set once it runs."""
        self._lock = threading.Lock()
        self.live: OrderedDict[str, pykka.ActorRef[Any]] = OrderedDict()
        self.last_used: dict[str, float] = {}
        self.busy: set[str] = set()
        self.waiting: OrderedDict[str, ClaimedRow] = OrderedDict()
        self.direct: set[str] = set()
        self.backlog = True
        """Due rows may be left in the journal: claim after the next turn (until a claim
        comes back with room to spare)."""
        self.suspect: str | None = None
        """The session running a suspect row (its last worker died mid-turn), if any."""
        self.suspects_held = False
        """A claim left due suspect rows behind the running one: claim once it is done."""
        self.claim_scheduled = False
        """A ``ClaimNow`` is on its way to the dispatcher (requests before it coalesce)."""
        self.claiming = False
        """The dispatcher is inside a claim (the board shows a claim pending until it ends)."""
        self.claims_begun = 0
        """Claims begun so far (:meth:`claim_window`)."""
        self.committing: dict[str, int] = {}
        """Session -> ``claims_begun`` when its run's last commit that leases the next row
        was submitted (:meth:`commit_submitted`); read and dropped as its run ends."""
        self.stopped = False
        self.peak_live = 0
        ctx.activity.board = self.board

    # -- from any thread -------------------------------------------------------------------

    def offer(self, row: ClaimedRow, how: str = "leased with its send") -> None:
        """Start the turn of a row leased for this runtime, or keep it until a slot frees."""
        started: Started = []
        closed = False
        try:
            with self._lock:
                closed = self._closed()
                if not closed:
                    self._offer(row, how, started)
                    self._changed()
        except Exception:
            # The row stays leased in the journal: its lease runs out and a claim takes it.
            log.exception("could not start the turn of %s", row.message_id)
        if closed:  # a send leased it as the runtime began to stop: it cannot run here
            self._hand_back([row])
            return
        self._tell(started)

    def commit_submitted(self, session_id: str) -> None:
        """A commit of ``session_id``'s run that leases its next row is submitted: should a
        claim begin before the run ends, the claim left the session out, and a send it
        would have taken may be one the commit did not see; the run's end claims then.

        Without the lock: one read of an int and one store in a dict, each atomic (a turn's
        hot path). A claim whose start it reads as earlier began before the submission, so
        it cannot be the claim of a send the commit missed: that claim begins later."""
        self.committing[session_id] = self.claims_begun

    def turn_done(self, session_id: str, claim: bool) -> None:
        """``session_id``'s run ended: free its slot, start what waited; ``claim`` asks for
        a claim (rows may be due that nothing else hands over), and so does a claim that
        began while the run's last commit was on its way (:meth:`commit_submitted`)."""
        started: Started = []
        ask = False
        try:
            with self._lock:
                submitted = self.committing.pop(session_id, None)
                if self._closed():
                    return
                # Under the lock with the slot freed below: a claim that begins after it
                # sees the session free and takes any row a claim before it skipped.
                skipped = submitted is not None and submitted != self.claims_begun
                self.busy.discard(session_id)
                next_suspect = False
                # A suspect row that went to wait for a direct turn is still running here.
                if self.suspect == session_id and session_id not in self.waiting:
                    self.suspect = None
                    next_suspect, self.suspects_held = self.suspects_held, False
                self.last_used[session_id] = self.ctx.now()
                if session_id in self.live:  # used last now: the last to passivate for room
                    self.live.move_to_end(session_id)
                if self.waiting:
                    self._fill(started)
                if len(self.live) > self.max_live:  # async turns ran above the bound
                    for victim in passivation.excess_idle(self.live.keys(), self.busy,
                                                          self.max_live):
                        self._passivate(victim)
                ask = ((claim or self.backlog or next_suspect or skipped)
                       and self._schedule_claim())
                self._changed()
        except Exception:
            log.exception("could not end the run of %s; claiming again", session_id)
            ask = True
        if started:
            self._tell(started)
        if ask:
            self.request_claim()

    def wake(self) -> bool:
        """Rows may be due (a send committed, a nudge): True when a claim must be asked."""
        with self._lock:
            self.backlog = True
            ask = self._schedule_claim()
            self._changed()
        return ask

    def direct_began(self, session_id: str) -> None:
        """A direct turn of ``session_id`` runs here: claims leave the session out."""
        with self._lock:
            self.direct.add(session_id)

    def wait_for_direct(self, row: ClaimedRow) -> bool:
        """The turn of ``row`` could not start: a direct turn of its session holds the
        running-turn board (it took it as the run's last turn ended, and the row is the
        next one that turn's commit leased). True: the row waits here for the direct
        turn's end (:meth:`direct_ended`) as one leased with its send does, and the run
        ends without holding a session thread or a slot (the cron run or social event may
        take minutes). False (the session runs no direct turn, or the runtime is
        stopping): the caller waits for the board itself."""
        with self._lock:
            if self._closed() or row.target not in self.direct:
                return False
            self.waiting[row.target] = row
            if row.taken_over:  # still the one suspect of this runtime while it waits
                self.suspect = row.target
            self._changed()
        return True

    def direct_ended(self, session_id: str) -> None:
        """The direct turn of ``session_id`` ended: start its row that waited for it, and
        claim what the claims left out."""
        started: Started = []
        with self._lock:
            self.direct.discard(session_id)
            self.backlog = True
            closed = self._closed()
            if not closed and session_id in self.waiting:
                self._fill(started)
            ask = not closed and self._schedule_claim()
            self._changed()
        self._tell(started)
        if ask:
            self.request_claim()

    # -- from the dispatcher ---------------------------------------------------------------

    def claim_window(self, requested: bool) -> tuple[int, set[str], int]:
        """A claim starts: what it may take (free slots, sessions to leave out, suspect
        rows). ``requested``: it is the claim asked for, so a request from here on asks
        for another (rows due after this claim's read). End it with :meth:`claimed` or
        :meth:`claim_ended`."""
        with self._lock:
            if requested:
                self.claim_scheduled = False
            self.claiming = True
            self.claims_begun += 1
            self._changed()
            return (self.max_active - len(self.busy),
                    self.busy | self.waiting.keys() | self.direct, 0 if self.suspect else 1)

    def claim_ended(self) -> None:
        """A claim ended with nothing to start (no room, or the journal failed)."""
        with self._lock:
            self.claiming = False
            self._changed()

    def claimed(self, result: ClaimResult, capacity: int) -> bool:
        """Start the claimed rows; True when another claim must follow at once."""
        started: Started = []
        with self._lock:
            self.claiming = False
            try:
                for row in result.rows:
                    self._offer(row, "claimed", started)
            except Exception:
                # The rows not started stay leased, not held here: their leases run out.
                log.exception("could not start every claimed row")
            self.suspects_held = self.suspects_held or result.held_back
            self.backlog = len(result.rows) == capacity
            again = False
            if self.suspects_held and not self.suspect:
                # Held back with none running (the one claimed failed at its takeover): no
                # turn's end would claim them, so claim again now.
                self.suspects_held = False
                again = True
            elif result.acked_by_marker or self.backlog:
                again = True
            again = again and self._schedule_claim()
            self._changed()
        self._tell(started)
        return again

    def board(self) -> tuple[int, bool, int, int]:
        """Rows in flight or waiting here, whether a claim is pending, live actors, and
        the most that were live at once."""
        with self._lock:
            return (len(self.busy) + len(self.waiting), self.claim_scheduled or self.claiming,
                    len(self.live), self.peak_live)

    def held(self) -> list[str]:
        """Sessions whose rows are leased here (running or waiting, or taken into a direct
        turn): their leases renew."""
        with self._lock:
            return sorted(self.busy | self.waiting.keys() | self.direct)

    def passivate_expired(self, now: float, idle_ttl: float) -> None:
        """Stop the session actors idle for ``idle_ttl`` seconds."""
        with self._lock:
            for session_id in passivation.expired_idle(self.last_used, self.busy, now,
                                                       idle_ttl):
                self._passivate(session_id)
            self._changed()

    def stop(self, timeout: float = STOP_WAIT) -> list[str]:
        """Stop every session actor at once, then wait for them, ``timeout`` seconds for
        all together: running turns finish and commit. The sessions whose actor had not
        stopped by then (a sync brain deaf to its stop), named in one warning."""
        with self._lock:
            self.stopped = True
            refs = list(self.live.items())
            self.live.clear()
            unstarted = list(self.waiting.values())
            self.waiting.clear()
        self._hand_back(unstarted)
        stopping = [(session_id, ref.stop(block=False)) for session_id, ref in refs]
        deadline = time.monotonic() + timeout
        lagging = []
        for session_id, future in stopping:
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                lagging.append(session_id)
        if lagging:
            log.warning("%d session actors had not stopped %.0f s into the stop (their "
                        "rows come back by lease): %s", len(lagging), timeout,
                        ", ".join(lagging[:10]) + (" ..." if len(lagging) > 10 else ""))
        self.pool.stop(max(0.0, deadline - time.monotonic()))
        return lagging

    # -- under the lock --------------------------------------------------------------------

    def _closed(self) -> bool:
        return self.stopped or self.ctx.crashed.is_set()

    def _schedule_claim(self) -> bool:
        # Many requests before the dispatcher reads one cost one claim query.
        if self.claim_scheduled:
            return False
        self.claim_scheduled = True
        return True

    def _offer(self, row: ClaimedRow, how: str, started: Started) -> None:
        # A row of a session whose direct turn runs here (leased by its send on SQLite)
        # waits for that turn's end without a slot: started, it waited on a session
        # thread for the whole cron run or social event, as good as a turn.
        if (row.target in self.busy or row.target in self.direct
                or len(self.busy) >= self.max_active):
            self.waiting[row.target] = row
        else:
            self._start(row, how, started)
        if row.taken_over:  # running or waiting, it is the one suspect of this runtime
            self.suspect = row.target

    def _fill(self, started: Started) -> None:
        """Start waiting rows while there are free slots, oldest first."""
        for target in list(self.waiting):
            if len(self.busy) >= self.max_active:
                return
            if target not in self.busy and target not in self.direct:
                self._start(self.waiting.pop(target), "leased with its send", started)

    def _start(self, row: ClaimedRow, how: str, started: Started) -> None:
        try:
            ref = self._actor_for(row.target)  # first: if it raises, no slot is held
        except Exception:
            if self.suspect == row.target:  # a waiting suspect that could not start
                self.suspect = None  # its lease runs out and a claim takes it again
            raise
        self.busy.add(row.target)
        started.append((ref, row, how))

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
            self.peak_live = max(self.peak_live, len(self.live))
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

    def _changed(self) -> None:
        self.ctx.activity.changed()  # under the lock: the waiters read the board (:meth:`board`)

    # -- after the lock --------------------------------------------------------------------

    def _hand_back(self, rows: list[ClaimedRow]) -> None:
        """Hand back unrun (no attempt counted) rows leased here that will not run here: a
        stopping runtime's rows that waited for a slot, a row leased with its send as the
        stop began, one whose actor stopped before it was told. Left leased to a stopped
        runtime, each waited out its lease and was then taken over as a suspect (a row
        whose worker died mid-turn), run alone, one after another, at the next start. A
        crashed runtime writes nothing (its rows come back as a kill leaves them)."""
        if not rows or self.ctx.crashed.is_set():
            return
        try:
            self.ctx.journal.hand_back(self.ctx.owner, [r.message_id for r in rows],
                                       self.ctx.now())
        except WriterClosed:  # stopped under us: the rows come back by their leases
            log.info("could not hand back %d leased rows (the writer is stopped); their "
                     "leases run out instead", len(rows))
        except Exception:
            log.exception("could not hand back %d leased rows; their leases run out instead",
                          len(rows))

    def _tell(self, started: Iterable[tuple[pykka.ActorRef[Any], ClaimedRow, str]]) -> None:
        # Outside the lock: a busy session's actor is never passivated, so its ref holds.
        for ref, row, how in started:
            log.debug("%s %s for %s (attempt %d)", how, row.message_id, row.target,
                      row.attempts + 1)
            if self.ctx.observers:
                self.ctx.emit("claimed", message_id=row.message_id, session_id=row.target,
                              attempt=row.attempts + 1)
            try:
                ref.tell(Deliver(row))
            except pykka.ActorDeadError:
                self.undeliverable(ref, row)

    def undeliverable(self, ref: pykka.ActorRef[Any], row: ClaimedRow) -> None:
        """The session's actor stopped between the start and the tell (or before it
        handled the row, :meth:`.session_actor.SessionActor.on_undelivered`): free the slot
        and hand the row back (:meth:`_hand_back`)."""
        started: Started = []
        with self._lock:
            if self.live.get(row.target) is ref:
                self.live.pop(row.target)
                self.last_used.pop(row.target, None)
            self.busy.discard(row.target)
            if self.suspect == row.target:
                self.suspect = None
            closed = self._closed()
            if not closed:
                self._fill(started)
            ask = not closed and self._schedule_claim()
            self._changed()
        self._hand_back([row])
        if closed:
            return
        self._tell(started)
        if ask:
            self.request_claim()
