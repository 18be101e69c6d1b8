"""The session actor: runs a session's turns, one claimed row at a time.

A pykka actor on a pool thread (:mod:`.pooled`), and a thin shell around the
delivery protocol (:mod:`.delivery`): it feeds the protocol what happened and
carries out the effects it answers with. It builds the :class:`Turn`, calls
the brain, and commits the outcome through the journal, which applies the
storage rules. The commit of a successful turn writes the transcript
entries, a delivery marker per message and the acks in one transaction,
fenced by the lease; a failed turn is retried with backoff. Whatever
happens, the session's slot frees up at the end (:mod:`.slots`).
An async brain's turns run the same protocol on the event loop
(:mod:`.async_host`), which carries out the same effects of this class: the
ones that write are generators (:data:`.steps.Step`) that yield the writer's reply,
waited for here and awaited there.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, TypeVar

from ..persistence import (
    ClaimedRow,
    LeaseLost,
    PersistenceError,
    Reply,
    WriterClosed,
)
from . import delivery as dp
from . import subagents
from .brain_scope import brain_of
from .context import NO_EFFECTS, RuntimeContext, TurnEffects, gather_effects
from .messages import Deliver
from .pooled import ActorPool, PooledActor
from .running import StopFlag
from .steps import Blocking, Step, Steps, landed, settle, wait_landed
from .turn import Message, Turn
from .turn_run import (
    Judged,
    SyncBrainAwaitable,
    TurnCutShort,
    cut_short,
    error_kind,
    judge,
    new_turn,
    prepare,
    refused_commit,
    refused_start,
    take_result,
)

log = logging.getLogger("kinbox.session")

T = TypeVar("T")

__all__ = ["SessionActor", "SyncBrainAwaitable"]


class SessionActor(PooledActor):
    """Delivers inbox rows to one session by running its brain (on the dispatcher's pool)."""

    def __init__(self, ctx: RuntimeContext, session_id: str, pool: ActorPool) -> None:
        super().__init__(pool)
        self.ctx = ctx
        self.session_id = session_id
        self.turn: Turn | None = None
        """The turn of the current effect (one at a time: the protocol is sequential)."""
        self.judged: Judged | None = None
        self.told_done = False
        """This run freed its slot (it must, exactly once)."""
        self.flag: StopFlag | None = None
        """The stop flag of the current turn while it is on the running-turn board (from its
        start until its commit or failure record is durable)."""

    def _handle_receive(self, message: Any) -> Any:
        # Nearly every message is a Deliver: skip pykka's four checks for its own messages.
        if type(message) is Deliver:
            return self.on_receive(message)
        return super()._handle_receive(message)

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Deliver):
            host = self.ctx.async_host
            if host is not None:
                # An async brain: the turn runs on the event loop and this pool thread
                # is free at once; the loop frees the slot at the end.
                host.start_turns(self, message.row)
                return
            run = self.new_run()
            effects = run.claimed(message.row)
            try:
                while effects:
                    effect = effects.pop(0)
                    if isinstance(effect, dp.RunBrain):
                        effects[:0] = self.brain_ended(run, self.run_turn())
                    else:
                        effects[:0] = self.apply(run, effect)
            except WriterClosed:
                pass  # the runtime stopped or crashed under us: the journal keeps the row
            except Exception:
                # A bug outside the brain (an outbox hook, a driver): this actor lives on,
                # so the rows the slot table hands it are not lost with it; the row keeps
                # its lease and comes back when that runs out.
                log.exception(
                    "the delivery of %s to %s failed outside its brain",
                    message.row.message_id,
                    self.session_id,
                )
            finally:
                if not self.told_done:
                    self.done(True)

    def on_undelivered(self, message: Any) -> None:
        """A row told to this actor after its stop was queued (a send, or a run's end,
        started it as the runtime began to stop): its slot frees and it is handed back,
        as one told to an actor already stopped. Dropped, it stayed leased to the stopped
        runtime until its lease ran out, then was taken over as a suspect (run alone)."""
        if isinstance(message, Deliver) and self.ctx.slots is not None:
            self.ctx.slots.undeliverable(self.actor_ref, message.row)

    def new_run(self) -> dp.Delivery:
        """A delivery run of this session, as the protocol tracks it."""
        self.told_done = False
        return dp.Delivery(closing=self.ctx.closed.is_set())

    def run_turn(self) -> BaseException | None:
        """Run the turn hooks (the Focal policy), then a sync brain, on the started turn;
        the error the attempt ends with."""
        assert self.turn is not None
        try:
            prepare(self.ctx, self.turn)
            with brain_of(self.ctx):
                take_result(self.turn, self.ctx.brain(self.turn))
        except BaseException as exc:  # a brain's SystemExit too fails its attempt, no more
            return exc
        return None

    def brain_ended(self, run: dp.Delivery, error: BaseException | None) -> list[dp.Effect]:
        """Judge the attempt (errors, the timeout, a stop) and tell the protocol."""
        assert self.turn is not None
        unseen = [m.message_id for m in self.turn.close_steering() or []]
        run.steered_in(self.turn.steered_ids[len(run.steered) :])
        handed_back = run.unseen(unseen) if unseen else []
        run.closing = self.ctx.closed.is_set()  # stopping: the commit leases no next row
        # A brain that ended on the runtime's stop having done nothing, returned on the flag
        # or raised on its way out (a model call aborted on it): handed back, uncounted.
        short = cut_short(self.turn)
        if short is not None:
            error = short
        if isinstance(error, TurnCutShort):  # nothing of it is written: it runs again
            self.ctx.turns.settle(self.session_id)
            if self.turn.outbox is not None:
                self.turn.outbox.discard()
            log.info("%s", error)
            return handed_back + run.cut_short()
        self.judged = judge(self.ctx, self.turn, error)
        if self.judged.outcome.ok:
            return handed_back + run.brain_returned()
        return handed_back + run.brain_raised(
            self.judged.outcome.error or "the turn failed", self.judged.kind
        )

    def apply(self, run: dp.Delivery, effect: dp.Effect) -> list[dp.Effect]:
        """Carry out one effect (not RunBrain) on this thread, waiting for its writes; the
        protocol's answer to its outcome."""
        ctx = self.ctx
        if isinstance(effect, dp.StartTurn):
            if not effect.record_start:
                # Nothing to write first (most turns): no step, unless another turn runs.
                effects = self.try_start(run, effect.row)
                if effects is not None:
                    return effects
            return settle(self.start_turn(run, effect.row, effect.record_start))
        if isinstance(effect, dp.Commit):
            return self.commit_now(run, effect)
        if isinstance(effect, dp.Done):
            self.done(effect.claim)
            return []
        if isinstance(effect, dp.RecordFailure):
            return self.record_failure(run, effect)
        if isinstance(effect, dp.Release):
            if not ctx.crashed.is_set():
                try:
                    if effect.backoff:
                        due = ctx.journal.release_later(ctx.owner, effect.message_id, ctx.now())
                        ctx.alarm_in(due - ctx.now())  # claimed as it comes due
                    else:
                        ctx.journal.release(ctx.owner, [effect.message_id], ctx.now())
                except WriterClosed:
                    raise
                except PersistenceError as exc:  # lost meanwhile, or the database is down
                    log.info(
                        "could not hand %s back (%s); it comes back by its lease",
                        effect.message_id,
                        exc,
                    )
            return []
        raise TypeError(f"not an effect this actor carries out: {effect!r}")

    def done(self, claim: bool) -> None:
        """Free the session's slot (unless the runtime crashed); ``claim``: rows may be due
        that nothing else hands over (a row handed back, a failed attempt, messages its
        commit enqueued), so the dispatcher claims."""
        self.end_turn()  # a run cut short (the writer closed, a bug) still ends its turn
        self.turn = self.judged = None
        self.told_done = True
        if self.ctx.slots is not None:
            self.ctx.slots.turn_done(self.session_id, claim)

    def start_turn(self, run: dp.Delivery, row: ClaimedRow, record_start: bool) -> Step:
        """Start the turn of ``row`` once its session is free (a :data:`Step`: it waits
        for the session's cron or social turn, and writes when the row was taken over);
        refused when the journal refuses (the lease is gone).

        A taken-over row's start (``record_start``: its last worker died mid-turn) is
        recorded once its turn holds the session, right before the brain: a takeover
        counts an attempt only for a turn that started. Recorded before the wait, a row
        that parked behind a direct turn and died there was counted unrun, and a few such
        deaths failed the message without its turn ever running."""
        ctx = self.ctx
        started = ctx.now()
        stop_flag = ctx.turns.try_begin(self.session_id, started, row.message_id)
        if stop_flag is None:
            # A cron or social turn of this session runs: the row waits for its end in the
            # slot table, holding no session thread (:meth:`.slots.Slots.wait_for_direct`);
            # or, where the slots cannot keep it, it is waited out here.
            if ctx.slots is not None and ctx.slots.wait_for_direct(row):
                return run.parked()
            turns, sid, now = ctx.turns, self.session_id, ctx.now
            begun = yield Blocking(
                lambda: turns.begin(sid, now, row.message_id),
                on_loop=lambda: turns.begin_async(sid, now, row.message_id),
            )
            if begun is None:  # the runtime stopped while that turn ran: the row goes back
                run.closing = True
                return run.started()
            stop_flag, started = begun
        if record_start and not (run.closing or ctx.closed.is_set()):
            self.flag = stop_flag  # on the board from here: the run's Done takes it off
            refusal = yield from self._record_start(run, row)
            if refusal is not None:
                return refusal
        return self._started(run, row, started, stop_flag)

    def _record_start(self, run: dp.Delivery, row: ClaimedRow) -> Steps[list[dp.Effect] | None]:
        """Note durably that the turn of taken-over ``row`` starts (fenced by its lease);
        None once noted, else the protocol's answer to the refusal (logged): a lost lease
        leaves the row to its new holder, a database error is a failed attempt (recorded
        by :meth:`record_failure`, with no turn)."""
        ctx = self.ctx
        try:
            yield from landed(ctx.journal.submit_turn_started(ctx.owner, row.message_id, ctx.now()))
        except WriterClosed:
            raise
        except LeaseLost:
            log.warning(
                "lost the lease of %s for %s before its turn started",
                row.message_id,
                self.session_id,
            )
            return run.refused()
        except PersistenceError as exc:
            log.error(
                "starting %s for %s failed in the journal: %s",
                row.message_id,
                self.session_id,
                exc,
            )
            self.judged = refused_start(exc)
            return run.refused(self.judged.outcome.error or "")
        return None

    def try_start(self, run: dp.Delivery, row: ClaimedRow) -> list[dp.Effect] | None:
        """Start the turn of ``row`` at once; None when another turn of the session (a cron
        or social one) runs, which :meth:`start_turn` waits out."""
        started = self.ctx.now()
        stop_flag = self.ctx.turns.try_begin(self.session_id, started, row.message_id)
        return None if stop_flag is None else self._started(run, row, started, stop_flag)

    def _started(
        self, run: dp.Delivery, row: ClaimedRow, started: float, stop_flag: StopFlag
    ) -> list[dp.Effect]:
        self.flag = stop_flag
        # A turn that waited for its session's cron or social turn may get the board only
        # after a graceful stop asked every running turn to stop: it hands its row back.
        run.closing = run.closing or self.ctx.closed.is_set()
        if not run.closing:
            self.turn = self._new_turn(row, started, stop_flag)
        return run.started()

    def end_turn(self, flag: StopFlag | None = None) -> None:
        """Take the turn off the running-turn board: its commit (or failure record) is
        durable, or it never will be. The session's next turn may start from here.
        ``flag``: the turn a step belongs to (default: the current one), so a step that
        finishes late (a cancelled async commit, on a worker) never ends a later turn."""
        if flag is None:
            flag, self.flag = self.flag, None
        elif self.flag is flag:
            self.flag = None
        if flag is not None:
            self.ctx.turns.end(self.session_id, flag)

    def _new_turn(self, row: ClaimedRow, started: float, stop_flag: StopFlag) -> Turn:
        ctx = self.ctx
        sid = self.session_id
        last_seq = [row.seq]

        # Leases into the turn are waited for until they land or fail (wait_landed): one
        # taken as refused that then landed left its rows leased outside any turn.
        def fetch_steering() -> list[Message]:
            more = wait_landed(
                ctx.journal.submit_claim_more(
                    ctx.owner, sid, row.message_id, last_seq[0], ctx.now(), lease=ctx.lease_seconds
                )
            )
            if more:
                last_seq[0] = more[-1].seq
            return [Message.from_row(r) for r in more]

        def fetch_row(message_id: str) -> Message | None:
            taken = wait_landed(
                ctx.journal.submit_claim_row(
                    ctx.owner, sid, row.message_id, message_id, ctx.now(), lease=ctx.lease_seconds
                )
            )
            return None if taken is None else Message.from_row(taken)

        turn = new_turn(
            ctx,
            sid,
            [Message.from_row(row)],
            stop_flag,
            fetch_steering,
            outbox_id=row.message_id,
            started=started,
            fetch_row=fetch_row,
            row=row,
        )
        if ctx.observers:
            ctx.emit(
                "turn_started", session_id=sid, message_id=row.message_id, attempt=row.attempts + 1
            )
        return turn

    def commit(self, run: dp.Delivery, effect: dp.Commit) -> Step:
        """Commit the judged turn: entries, markers, acks, its effects, the next lease
        (where ``effect`` asks for it).

        A generator (see :data:`Step`) for the event loop, which awaits the
        commit's writer reply without holding a thread; a pool thread runs the
        same through :meth:`commit_now`. Journal refusals end here too: a lost
        lease (another worker took the row over; nothing of this turn is
        written) and a database error are logged, and the row comes back
        through its lease.
        """
        turn, judged, flag = self.turn, self.judged, self.flag
        assert turn is not None and judged is not None
        try:
            parts = self.ctx.effect_parts(turn, judged.outcome)
            if all(isinstance(part, TurnEffects) for part in parts):
                effects = gather_effects(parts)
            else:  # a hook must read to know them: where blocking is allowed
                effects = yield Blocking(partial(gather_effects, parts))
            following = yield from landed(self._submit(turn, effect, effects))
        except Exception as exc:
            return self._refused(run, turn, flag, exc)
        return self._committed(run, turn, judged, flag, effect, effects, following)

    def commit_now(self, run: dp.Delivery, effect: dp.Commit) -> list[dp.Effect]:
        """:meth:`commit` on this thread, waiting for the commit (no generator to drive:
        its end would raise a StopIteration, on every turn)."""
        turn, judged, flag = self.turn, self.judged, self.flag
        assert turn is not None and judged is not None
        try:
            effects = self.ctx.effects(turn, judged.outcome)
            following = wait_landed(self._submit(turn, effect, effects))
        except Exception as exc:
            return self._refused(run, turn, flag, exc)
        return self._committed(run, turn, judged, flag, effect, effects, following)

    def _submit(
        self, turn: Turn, effect: dp.Commit, effects: TurnEffects
    ) -> Reply[ClaimedRow | None]:
        ctx = self.ctx
        if effect.next_lease and ctx.slots is not None:  # it reads the next row once
            ctx.slots.commit_submitted(self.session_id)
        return ctx.journal.submit_turn(
            ctx.owner,
            self.session_id,
            list(effect.message_ids),
            turn.entries(),
            ctx.now(),
            enqueue=effects.messages,
            also=effects.ops,
            next_lease=ctx.lease_seconds if effect.next_lease else None,
        )

    def _refused(
        self, run: dp.Delivery, turn: Turn, flag: StopFlag | None, exc: Exception
    ) -> list[dp.Effect]:
        """The journal refused the commit of ``turn``: the protocol's answer (or ``exc``
        again when it is no refusal: the writer closed, a bug)."""
        sid = self.session_id
        if turn.outbox is not None:
            # Nothing of the turn was written, whatever the error: a refusal, the writer
            # closed, or a bug (an outbox hook's) before or inside the rolled-back commit.
            # Its writes give back what they took (a family send's place under the pending
            # limit was kept for the life of the process otherwise).
            turn.outbox.discard()
        if isinstance(exc, LeaseLost):
            self.end_turn(flag)
            log.warning(
                "lost the lease of %s for %s: another worker took it over; this "
                "turn's commit wrote nothing",
                turn.row.message_id,
                sid,
            )
            self.ctx.emit(
                "lease_lost", session_id=sid, message_id=turn.row.message_id, error=str(exc)
            )
            return run.lease_lost()
        if isinstance(exc, WriterClosed) or not isinstance(exc, PersistenceError):
            raise exc
        log.error(
            "the journal refused the commit of %s for %s (%s): a failed attempt",
            turn.row.message_id,
            sid,
            exc,
        )
        # The turn stays on the board until its failure record is durable (as a brain's).
        self.judged = refused_commit(exc)
        return run.commit_refused(self.judged.outcome.error or "")

    def _committed(
        self,
        run: dp.Delivery,
        turn: Turn,
        judged: Judged,
        flag: StopFlag | None,
        effect: dp.Commit,
        effects: TurnEffects,
        following: ClaimedRow | None,
    ) -> list[dp.Effect]:
        """The commit of ``turn`` is durable: end it, tell, run what waits for it."""
        ctx = self.ctx
        self.end_turn(flag)
        ctx.activity.bump("turns")
        if ctx.observers:
            ctx.emit(
                "turn_committed",
                session_id=self.session_id,
                message_ids=list(effect.message_ids),
                replies=list(turn.replies),
                stopped_by=judged.outcome.stopped_by,
            )
        self._run_after(effects)
        run.closing = ctx.closed.is_set()  # stopping: the next row is handed back, not run
        return run.committed(following, plain=not (effects.messages or effects.ops))

    def record_failure(self, run: dp.Delivery, effect: dp.RecordFailure) -> list[dp.Effect]:
        """A failed attempt: nothing of the turn is committed; retry later, or ``failed``.

        The row keeps the traceback as ``last_error``; observers get the one-line
        summary, the log above DEBUG its type only (a brain's text may quote the body).
        A taken-over row whose start the journal refused has no turn: no hook hears of
        it (its brain never ran), and a child's task that it leaves ``failed`` is
        reported to its parent as one a claim failed is (:func:`.subagents.report_ended`).
        """
        ctx, turn, judged, flag = self.ctx, self.turn, self.judged, self.flag
        assert judged is not None
        sid = self.session_id
        failed = judged.outcome
        summary = failed.error or "the turn failed"
        effects = NO_EFFECTS
        try:
            # Inside: a hook's read that fails is a refused record (the row goes back);
            # escaping the run, it left the row leased for a whole lease.
            if turn is not None:
                effects = ctx.effects(turn, failed)
            result = wait_landed(
                ctx.journal.submit_retry(
                    ctx.owner,
                    effect.message_id,
                    judged.detail or "",
                    ctx.now(),
                    permanent=effect.kind.permanent,
                    retry_after=effect.kind.retry_after,
                    release=list(effect.release),
                    on_failed=effects.messages,
                    on_failed_also=effects.ops,
                    ran=effect.ran,
                )
            )
        except LeaseLost:
            log.warning(
                "lost the lease of %s for %s: its failed attempt is not recorded here",
                effect.message_id,
                sid,
            )
            return run.journal_failed()
        except WriterClosed:
            raise
        except PersistenceError as exc:
            log.error(
                "recording the failed attempt of %s for %s failed in the journal: %s",
                effect.message_id,
                sid,
                exc,
            )
            return run.journal_failed()
        finally:
            self.end_turn(flag)
        final = result.state.value == "failed"
        # A retried attempt is routine (INFO); giving up on a message is an ERROR. Above
        # DEBUG the error's type only: its text may quote the message's body.
        line = "turn of %s for %s failed (attempt %d%s): %s"
        how = ", giving up: row failed" if final else f", retry at {result.available_at:.3f}"
        log.log(logging.ERROR if final else logging.INFO, line, sid, effect.message_id,
                result.attempts, how, error_kind(summary))
        log.debug(line, sid, effect.message_id, result.attempts, how, summary)
        ctx.emit(
            "turn_failed",
            session_id=sid,
            message_id=effect.message_id,
            error=summary,
            state=result.state.value,
            attempts=result.attempts,
            available_at=result.available_at,
        )
        if final:
            self._run_after(effects)
            if turn is None:
                subagents.report_ended(ctx, [effect.message_id])
        else:  # claimed as its backoff ends, not at the tick after
            ctx.alarm_in(result.available_at - ctx.now())
        return run.failure_recorded()

    def _run_after(self, effects: TurnEffects) -> None:
        for notify in effects.after:
            try:
                notify()
            except Exception:
                log.exception("post-commit notification failed for %s", self.session_id)
