"""Turns that no inbox row started: cron runs and social events (C1, SO1).

Cron jobs and social events run their turns directly, not through the
generic inbox, but through the same turn machinery: the rules of
:mod:`.turn_run` (hooks, the brain's result, the timeout, the outcome) and
the async host's brain runner, as an inbox turn does; the outbox hooks
add their effects, and the journal commits the transcript entries, those
effects and the caller's own writes (the cron run record, the social reply
route) in one transaction: :meth:`Journal.submit_turn` with no inbox rows
to acknowledge, waited for until it lands or fails
(:func:`.steps.landed`). A caller's write that refuses (a run taken
over by another runtime) undoes the whole commit.

A turn is a :data:`.steps.Steps`, and so is the caller's work around it (a cron
run's records, a social chat's turns): with a sync brain a small pool of threads
carries it out, with an async brain the runtime's event loop, where the brain,
the waits for the session's other turns and the commit are awaited, so
thousands of cron runs and social events may wait on a model at once with a
few threads (B1) (:mod:`.direct_pool`). A session runs one direct turn at a
time here (:mod:`.direct_gate`), and one turn of any kind at a time
(:meth:`RunningTurns.begin` waits). Before it runs, a turn marks its session in
the database against other runtimes' inbox turns, and a turn that does not
commit gives the mark back (:mod:`.direct_marking`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..persistence import LeaseLost, PersistenceError, WriterClosed
from .brain_failure import ORDINARY, FailureKind
from .brain_scope import brain_of
from .brain_tasks import BrainAbandoned
from .context import RuntimeContext, TurnEffects, gather_effects
from .direct_gate import SessionGate
from .direct_marking import TurnNotStarted, unmark, wait_to_mark
from .direct_pool import DirectPool
from .steps import Blocking, Steps, landed, settle, wait_landed
from .turn import Message, Turn, TurnOutcome
from .turn_run import cut_short, error_kind, judge, new_turn, prepare, take_result

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
    kind: FailureKind = ORDINARY
    """When the brain failed, how its exception asks to be retried (a cron run's
    retry; a social event's turn is never retried: :mod:`.brain_failure`)."""


class DirectTurns(DirectPool):
    """Runs direct turns (:class:`.direct_pool.DirectPool`: where, and waiting for them)."""

    def __init__(self, ctx: RuntimeContext, workers: int = 4) -> None:
        super().__init__(ctx, workers)
        self._gate = SessionGate()

    def _start(
        self,
        session_id: str,
        turn_id: str,
        messages: list[Message],
        fetch_steering: Callable[[], list[Message]],
        taken: list[str],
    ) -> Steps[Turn]:
        """Register the running turn (waiting for the session's current one: awaited on
        the event loop) and build it; :class:`TurnNotStarted` when the runtime began to
        stop meanwhile. ``taken`` collects the inbox rows the turn takes into itself by
        name (:meth:`Turn.take`: a foreground child's result), leased under the
        session's mark."""
        ctx = self.ctx
        begun = yield Blocking(
            partial(ctx.turns.begin, session_id, ctx.now, turn_id),
            on_loop=partial(ctx.turns.begin_async, session_id, ctx.now, turn_id),
        )
        if begun is None:  # the runtime stopped while the session's turn ran
            raise TurnNotStarted(session_id)
        flag, started = begun
        try:
            # Checked once registered: a stop that came before asks no turn registered
            # after it (its sweep may be past), one that comes after asks this one.
            if ctx.closed.is_set():
                raise TurnNotStarted(session_id)

            def fetch_row(message_id: str) -> Message | None:
                row = wait_landed(
                    ctx.journal.submit_claim_row_into_direct_turn(
                        ctx.owner,
                        session_id,
                        turn_id,
                        message_id,
                        ctx.now(),
                        lease=ctx.lease_seconds,
                    )
                )
                if row is None:
                    return None
                taken.append(row.message_id)
                return Message.from_row(row)

            return new_turn(
                ctx,
                session_id,
                messages,
                flag,
                fetch_steering,
                outbox_id=turn_id,
                started=started,
                fetch_row=fetch_row,
            )
        except BaseException:
            ctx.turns.end(session_id, flag)  # never left on the board by a failed start
            raise

    def run(
        self,
        session_id: str,
        messages: list[Message],
        *,
        fetch_steering: Callable[[], list[Message]] = list,
        commit_ops: CommitOps = lambda _turn: [],
    ) -> DirectOutcome:
        """Run one turn of ``session_id`` now, on the calling thread, and commit it."""
        return settle(
            self.run_steps(
                session_id, messages, fetch_steering=fetch_steering, commit_ops=commit_ops
            )
        )

    def run_steps(
        self,
        session_id: str,
        messages: list[Message],
        *,
        fetch_steering: Callable[[], list[Message]] = list,
        commit_ops: CommitOps = lambda _turn: [],
    ) -> Steps[DirectOutcome]:
        """One turn of ``session_id``, committed, as a :data:`.steps.Steps`: a pool
        thread carries it out (:meth:`run`), or the event loop of async brains
        (:meth:`submit_steps`), where its waits and its brain hold no thread."""
        ctx = self.ctx
        effects: TurnEffects | None = None
        turn_id = messages[0].message_id if messages else f"direct-{ctx.new_id()}"
        taken: list[str] = []
        place = self._gate.enter(session_id)
        try:
            yield Blocking(place.result, on_loop=partial(asyncio.wrap_future, place))
            yield from wait_to_mark(ctx, session_id, turn_id)
            closing = False
            # Before the turn takes the board: whenever a direct turn holds it, the slot
            # table knows, and keeps the session's rows waiting without a thread.
            if ctx.slots is not None:
                ctx.slots.direct_began(session_id)
            try:
                try:
                    turn = yield from self._start(
                        session_id, turn_id, messages, fetch_steering, taken
                    )
                    try:
                        done, effects = yield from self._attempt(
                            session_id, turn_id, turn, commit_ops, taken
                        )
                    finally:
                        # Off the board once the commit is durable (or will never be): the
                        # session's next turn reads what this one wrote.
                        ctx.turns.end(session_id)
                finally:
                    if ctx.slots is not None:
                        ctx.slots.direct_ended(session_id)
            except GeneratorExit:  # closed unfinished: its loop is gone, as after a kill
                closing = True
                raise
            finally:
                if effects is None and not closing:  # no commit (which ends the mark)
                    yield Blocking(partial(unmark, ctx, session_id, turn_id))
        finally:
            self._gate.leave(session_id, place)
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

    def _attempt(
        self, session_id: str, turn_id: str, turn: Turn, commit_ops: CommitOps, taken: list[str]
    ) -> Steps[tuple[DirectOutcome, TurnEffects | None]]:
        """The brain, then the commit; the outcome and, once committed, its effects. The
        rows ``taken`` into the turn are acknowledged by its commit, or handed back unrun
        when it does not commit (a crash leaves them to their lease)."""
        ctx = self.ctx
        first = turn.messages[0].message_id if turn.messages else None
        ctx.emit("turn_started", session_id=session_id, message_id=first, attempt=1)
        error: BaseException | None = None
        try:
            yield Blocking(partial(prepare, ctx, turn))
            error = yield self._brain(turn)
            short = cut_short(turn)
            if short is not None:  # it ended on the runtime's stop (raising or not), idle
                raise BrainAbandoned(str(short))
        except GeneratorExit:
            raise
        except BrainAbandoned:  # the stop cut it short, or the loop ended under it
            if turn.outbox is not None:
                turn.outbox.discard()
            # What it took (a foreground child's result) goes back unrun with the turn's
            # other rows, as an inbox turn's do: left leased to a runtime that stopped, the
            # next start took it over as a dead worker's, suspect.
            if turn.close_steering(wait=False) is None:
                yield Blocking(turn.close_steering)
            yield Blocking(partial(self._hand_back, session_id, taken))
            raise
        except BaseException as exc:  # a brain's SystemExit too fails its attempt, no more
            error = exc
        if turn.close_steering(wait=False) is None:  # a fetch in flight: wait for it
            yield Blocking(turn.close_steering)  # what the brain never got is the caller's
        judged = judge(ctx, turn, error)
        outcome = judged.outcome
        if not outcome.ok:
            if turn.outbox is not None:
                turn.outbox.discard()
            yield Blocking(partial(self._hand_back, session_id, taken))
            error = outcome.error or ""
            log.info("direct turn of %s failed: %s", session_id, error_kind(error))
            log.debug("direct turn of %s failed: %s", session_id, error)
            ctx.emit(
                "turn_failed",
                session_id=session_id,
                message_id=first,
                error=outcome.error,
                state="direct",
                attempts=1,
                available_at=None,
            )
            return DirectOutcome(turn, outcome, False, outcome.error, kind=judged.kind), None
        try:
            parts = ctx.effect_parts(turn, outcome)
            if all(isinstance(part, TurnEffects) for part in parts):
                effects = gather_effects(parts)
            else:  # a hook must read to know them: where blocking is allowed
                effects = yield Blocking(partial(gather_effects, parts))
        except Exception:
            _drop_writes(turn)
            raise
        now = ctx.now()
        ended = partial(ctx.store.end_direct_turn_now, session_id, ctx.owner, turn_id, now)
        try:
            # A commit its batch took and then outran its wait may land yet: its outcome is
            # waited for (a cron run or a social event taken as failed that had landed ran
            # twice, or lost its reply), as an inbox turn's is.
            yield from landed(
                ctx.journal.submit_turn(
                    ctx.owner,
                    session_id,
                    taken,
                    turn.entries(),
                    now,
                    enqueue=effects.messages,
                    also=[*effects.ops, *commit_ops(turn), ended],
                )
            )
        except WriterClosed:
            raise
        except (LeaseLost, PersistenceError) as exc:
            if turn.outbox is not None:
                turn.outbox.discard()
            yield Blocking(partial(self._hand_back, session_id, taken))
            ctx.emit("lease_lost", session_id=session_id, message_id=first, error=str(exc))
            return DirectOutcome(turn, outcome, False, str(exc), exc), None
        except Exception:
            _drop_writes(turn)
            raise
        ctx.activity.bump("turns")
        ctx.emit(
            "turn_committed",
            session_id=session_id,
            message_ids=[m.message_id for m in turn.all_messages],
            replies=list(turn.replies),
            stopped_by=outcome.stopped_by,
        )
        return DirectOutcome(turn, outcome, True, None), effects

    def _brain(self, turn: Turn) -> Blocking:
        """The request to run the brain: a sync one on this thread; an async one awaited
        on the event loop (from a thread: waited for there)."""
        host = self.ctx.async_host
        if host is None:
            return Blocking(partial(_run_sync_brain, self.ctx, turn))
        return Blocking(
            partial(host.run_brain_blocking, turn), on_loop=partial(host.await_direct_brain, turn)
        )

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
            log.warning("rows taken into a direct turn of %s not handed back: %s", session_id, exc)


def _run_sync_brain(ctx: RuntimeContext, turn: Turn) -> BaseException | None:
    """A sync brain on this thread: the error the attempt ends with, or None."""
    try:
        with brain_of(ctx):
            take_result(turn, ctx.brain(turn))
    except BaseException as exc:  # a brain's SystemExit too fails its attempt, no more
        return exc
    return None


def _drop_writes(turn: Turn) -> None:
    """A bug outside the journal (an outbox hook's) ended the turn before or inside its
    commit, which wrote nothing: its tool writes give back what they took (a family
    send's place under the pending limit stayed taken for the life of the process)."""
    if turn.outbox is not None:
        turn.outbox.discard()
