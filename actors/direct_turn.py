"""Turns that no inbox row started: cron runs and social events (C1, SO1).

Cron jobs and social events run their turns directly, not through the
generic inbox, but through the same turn machinery: the rules of
:mod:`.turn_run` (hooks, the brain's result, the timeout, the outcome) and
the async host's brain runner, as an inbox turn does; the outbox hooks
add their effects, and the journal commits the transcript entries, those
effects and the caller's own writes (the cron run record, the social reply
route) in one transaction: :meth:`Journal.submit_turn` with no inbox rows
to acknowledge, waited for until it lands or fails
(:func:`.steps.wait_landed`). A caller's write that refuses (a run taken
over by another runtime) undoes the whole commit.

The turns run on a small, bounded pool of threads owned here; a session
runs one turn at a time (:meth:`RunningTurns.begin` waits). An async brain
runs on the runtime's event loop (:mod:`.async_host`), this pool's thread
waiting for it. Before it runs, a turn marks its session in the database against
other runtimes' inbox turns, and a turn that does not commit gives the mark back
(:mod:`.direct_marking`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from ..persistence import LeaseLost, PersistenceError, WriterClosed
from .brain_tasks import BrainAbandoned
from .context import RuntimeContext, TurnEffects
from .direct_marking import TurnNotStarted, unmark, wait_to_mark
from .outbox import Outbox
from .steps import wait_landed
from .turn import Message, Turn, TurnOutcome
from .turn_run import judge, prepare, take_result, turn_tools

log = logging.getLogger("kinbox.direct")


CommitOps = Callable[[Turn], list[Callable[[], object]]]
"""The caller's writes for a successful turn, run inside the turn's commit."""


@dataclass(frozen=True)
class DirectOutcome:
    """How a direct turn ended."""

    turn: Turn
    outcome: TurnOutcome
    committed: bool
    """True once the transcript entries (and the caller's writes) are durable."""
    error: str | None
    """Why it did not commit: the brain's error, or the refusal of the commit."""
    commit_error: PersistenceError | None = None
    """The commit's own refusal, when the brain's turn was good but nothing of it was
    written (a lost mark, a database error, a caller's write that refused)."""


@dataclass
class _SessionLock:
    """A session's direct-turn lock and how many turns hold or wait for it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


class DirectTurns:
    """Runs direct turns on a bounded pool; ``wait_idle`` waits for all of them."""

    def __init__(self, ctx: RuntimeContext, workers: int = 4) -> None:
        self.ctx = ctx
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kinbox-direct")
        self._cond = threading.Condition()
        self._in_flight = 0
        self._session_locks: dict[str, _SessionLock] = {}
        self._closed = False

    def submit(self, work: Callable[[], object]) -> Future[object] | None:
        """Run ``work`` on the pool; None once the runtime is stopping."""
        with self._cond:
            if self._closed:
                return None
            self._in_flight += 1
        try:
            future = self._pool.submit(self._tracked, work)
        except RuntimeError:  # the pool shut down under us
            self._done()
            return None
        future.add_done_callback(lambda _f: self._done())  # run, failed or cancelled
        return future

    def _tracked(self, work: Callable[[], object]) -> object:
        try:
            return work()
        except WriterClosed:
            return None  # the runtime stopped or crashed: the tables keep the state
        except Exception:
            log.exception("a direct turn's work failed")
            return None

    def _done(self) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def is_idle(self) -> bool:
        """True when no direct turn is queued or running."""
        with self._cond:
            return self._in_flight == 0

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no direct turn is queued or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout)

    def stop(self, *, wait: bool = True, timeout: float = 10.0) -> None:
        """Accept no more work; with ``wait``, give running turns ``timeout`` to finish."""
        with self._cond:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        if wait and not self.wait_idle(timeout):
            log.warning("direct turns still running after %.1fs at stop", timeout)

    @contextmanager
    def _one_at_a_time(self, session_id: str) -> Iterator[None]:
        """Hold the session's lock: one direct turn of a session at a time here. Its entry
        goes once no turn holds or waits for it, so every thread a platform ever opened
        does not keep a lock for the runtime's life."""
        with self._cond:
            entry = self._session_locks.setdefault(session_id, _SessionLock())
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._cond:
                entry.users -= 1
                if entry.users == 0:
                    del self._session_locks[session_id]

    def _start(self, session_id: str, turn_id: str, messages: list[Message],
               fetch_steering: Callable[[], list[Message]], taken: list[str]) -> Turn:
        """Register the running turn (waiting for the session's current one) and build it;
        :class:`TurnNotStarted` when the runtime began to stop meanwhile. ``taken``
        collects the inbox rows the turn takes into itself by name (:meth:`Turn.take`:
        a foreground child's result), leased under the session's mark."""
        ctx = self.ctx
        begun = ctx.turns.begin(session_id, ctx.now, turn_id)
        if begun is None:  # the runtime stopped while the session's turn ran
            raise TurnNotStarted(session_id)
        flag, started = begun
        try:
            # Checked once registered: a stop that came before asks no turn registered
            # after it (its sweep may be past), one that comes after asks this one.
            if ctx.closed.is_set():
                raise TurnNotStarted(session_id)
            def fetch_row(message_id: str) -> Message | None:
                row = ctx.journal.claim_row_into_direct_turn(
                    ctx.owner, session_id, turn_id, message_id, ctx.now(),
                    lease=ctx.lease_seconds)
                if row is None:
                    return None
                taken.append(row.message_id)
                return Message.from_row(row)

            outbox = Outbox(turn_id)
            return Turn(session_id, messages, turn_tools(ctx, session_id, outbox), flag,
                        fetch_steering, started=started, outbox=outbox, fetch_row=fetch_row)
        except BaseException:
            ctx.turns.end(session_id, flag)  # never left on the board by a failed start
            raise

    def run(self, session_id: str, messages: list[Message], *,
            fetch_steering: Callable[[], list[Message]] = list,
            commit_ops: CommitOps = lambda _turn: []) -> DirectOutcome:
        """Run one turn of ``session_id`` now, on the calling thread, and commit it."""
        ctx = self.ctx
        effects: TurnEffects | None = None
        turn_id = messages[0].message_id if messages else f"direct-{ctx.new_id()}"
        taken: list[str] = []
        with self._one_at_a_time(session_id):
            wait_to_mark(ctx, session_id, turn_id)
            try:
                turn = self._start(session_id, turn_id, messages, fetch_steering, taken)
                if ctx.slots is not None:
                    ctx.slots.direct_began(session_id)
                try:
                    done, effects = self._attempt(session_id, turn_id, turn, commit_ops,
                                                  taken)
                finally:
                    # Off the board once the commit is durable (or will never be): the
                    # session's next turn reads what this one wrote.
                    ctx.turns.end(session_id)
                    if ctx.slots is not None:
                        ctx.slots.direct_ended(session_id)
            finally:
                if effects is None:  # no commit (which ends the mark with it): end it here
                    unmark(ctx, session_id, turn_id)
        if effects is None:
            return done
        for notify in effects.after:
            try:
                notify()
            except Exception:
                log.exception("post-commit notification failed for %s", session_id)
        if effects.messages:
            ctx.wake_dispatcher()
        return done

    def _attempt(self, session_id: str, turn_id: str, turn: Turn, commit_ops: CommitOps,
                 taken: list[str]) -> tuple[DirectOutcome, TurnEffects | None]:
        """The brain, then the commit; the outcome and, once committed, its effects. The
        rows ``taken`` into the turn are acknowledged by its commit, or handed back unrun
        when it does not commit (a crash leaves them to their lease)."""
        ctx = self.ctx
        first = turn.messages[0].message_id if turn.messages else None
        ctx.emit("turn_started", session_id=session_id, message_id=first, attempt=1)
        error: BaseException | None = None
        try:
            prepare(ctx, turn)
            if ctx.async_host is not None:  # an async brain runs on the runtime's loop
                error = ctx.async_host.run_brain_blocking(turn)
            else:
                take_result(turn, ctx.brain(turn))
        except BrainAbandoned:  # the loop ended under it: no outcome, as after a kill
            if turn.outbox is not None:
                turn.outbox.discard()
            raise
        except BaseException as exc:  # a brain's SystemExit too fails its attempt, no more
            error = exc
        turn.close_steering()  # what the brain was never handed stays out (the caller's)
        outcome = judge(ctx, turn, error).outcome
        if not outcome.ok:
            if turn.outbox is not None:
                turn.outbox.discard()
            self._hand_back(session_id, taken)
            log.info("direct turn of %s failed: %s", session_id, outcome.error)
            ctx.emit("turn_failed", session_id=session_id, message_id=first,
                     error=outcome.error, state="direct", attempts=1, available_at=None)
            return DirectOutcome(turn, outcome, False, outcome.error), None
        effects = ctx.effects(turn, outcome)
        now = ctx.now()
        ended = partial(ctx.store.end_direct_turn_now, session_id, ctx.owner, turn_id, now)
        try:
            # A commit its batch took and then outran its wait may land yet: its outcome is
            # waited for (a cron run or a social event taken as failed that had landed ran
            # twice, or lost its reply), as an inbox turn's is.
            wait_landed(ctx.journal.submit_turn(ctx.owner, session_id, taken, turn.entries(),
                                                now, enqueue=effects.messages,
                                                also=[*effects.ops, *commit_ops(turn), ended]))
        except WriterClosed:
            raise
        except (LeaseLost, PersistenceError) as exc:
            if turn.outbox is not None:
                turn.outbox.discard()
            self._hand_back(session_id, taken)
            ctx.emit("lease_lost", session_id=session_id, message_id=first, error=str(exc))
            return DirectOutcome(turn, outcome, False, str(exc), exc), None
        ctx.activity.bump("turns")
        ctx.emit("turn_committed", session_id=session_id,
                 message_ids=[m.message_id for m in turn.all_messages],
                 replies=list(turn.replies), stopped_by=outcome.stopped_by)
        return DirectOutcome(turn, outcome, True, None), effects

    def _hand_back(self, session_id: str, taken: list[str]) -> None:
        """Hand the rows a turn that did not commit had taken back unrun, to wake the
        session as any row does (whoever lost their lease hands back nothing; a stopping
        runtime leaves them to their lease)."""
        if not taken:
            return
        try:
            self.ctx.journal.release(self.ctx.owner, taken, self.ctx.now())
        except WriterClosed:
            pass
        except PersistenceError as exc:  # a lost lease too: the rows are another's now
            log.warning("rows taken into a direct turn of %s not handed back: %s",
                        session_id, exc)
