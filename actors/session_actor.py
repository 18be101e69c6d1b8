"""The session actor: runs a session's turns, one claimed row at a time.

A pykka actor on a pool thread (:mod:`.pooled`), and a thin shell: it
builds the :class:`Turn`, calls the brain, and commits the outcome through
the journal, which applies the rules. The commit of a successful turn
writes the transcript entries, a delivery marker per message and the acks
in one transaction, fenced by the lease; a failed turn is retried with
backoff. Whatever happens, the dispatcher hears ``TurnDone``
so the session's slot frees up.
"""

from __future__ import annotations

import logging
from typing import Any

import pykka

from ..persistence import ClaimedRow, LeaseLost, PersistenceError, WriterClosed
from .context import RuntimeContext, TurnEffects
from .messages import Deliver, TurnDone
from .outbox import Outbox
from .pooled import ActorPool, PooledActor
from .turn import Message, Turn, TurnOutcome
from .turn_run import SyncBrainAwaitable, judge, prepare, take_result, turn_tools

log = logging.getLogger("kinbox.session")

__all__ = ["CHAIN_LIMIT", "SessionActor", "SyncBrainAwaitable"]

CHAIN_LIMIT = 16
"""Turns a session actor runs back to back before it hands its slot back (fairness)."""


class SessionActor(PooledActor):
    """Delivers inbox rows to one session by running its brain (on the dispatcher's pool)."""

    def __init__(self, ctx: RuntimeContext, session_id: str, pool: ActorPool) -> None:
        super().__init__(pool)
        self.ctx = ctx
        self.session_id = session_id
        self.claim_after = False
        """Rows may be due that no commit of this actor leased (a row handed back, a failed
        attempt, messages a commit enqueued): the dispatcher claims when told so."""

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Deliver):
            host = self.ctx.async_host
            if host is not None:
                # An async brain: the turn runs on the event loop and this pool thread
                # is free at once; the loop tells the dispatcher TurnDone at the end.
                host.start_turns(self, message.row)
                return
            row: ClaimedRow | None = message.row
            try:
                chained = 0
                # Keep delivering the session's next rows while they are due, up to a
                # fair share, before handing the slot back to the dispatcher.
                while row is not None and chained < CHAIN_LIMIT:
                    row = self._deliver(row)
                    chained += 1
                self.hand_back(row)
            except WriterClosed:
                pass  # the runtime stopped or crashed under us: the journal keeps the row
            finally:
                self.done()

    def hand_back(self, row: ClaimedRow | None) -> None:
        """Release a row leased for a turn this actor will not run now (fairness)."""
        if row is not None:
            self.claim_after = True
            self.ctx.journal.release(self.ctx.owner, [row.message_id], self.ctx.now())

    def done(self) -> None:
        """Tell the dispatcher the session's slot is free (unless the runtime crashed)."""
        claim, self.claim_after = self.claim_after, False
        if not self.ctx.crashed.is_set() and self.ctx.dispatcher is not None:
            try:
                self.ctx.dispatcher.tell(TurnDone(self.session_id, claim))
            except pykka.ActorDeadError:
                pass  # the runtime is stopping

    def _deliver(self, row: ClaimedRow) -> ClaimedRow | None:
        """Run the row's turn; return the session's next row if it was leased with the ack."""
        turn = self.begin(row)
        if turn is None:
            return None
        try:
            self.prepare(turn)
            take_result(turn, self.ctx.brain(turn))
        except Exception as exc:
            return self.end(turn, exc)
        return self.end(turn, None)

    def begin(self, row: ClaimedRow) -> Turn | None:
        """Start the turn of ``row``: None when the runtime is closing (row handed back)."""
        ctx = self.ctx
        try:
            if ctx.closed.is_set():  # stopping: hand the row back; crashed: touch nothing
                if not ctx.crashed.is_set():
                    ctx.journal.release(ctx.owner, [row.message_id], ctx.now())
                return None
            if row.taken_over:  # its last worker died mid-turn: is this message the cause?
                ctx.journal.mark_turn_started(ctx.owner, row.message_id, ctx.now())
        except WriterClosed:
            raise
        except LeaseLost:
            log.warning("lost the lease of %s for %s before its turn started",
                        row.message_id, self.session_id)
            self.claim_after = True
            return None
        except PersistenceError as exc:
            log.error("starting %s for %s failed in the journal: %s", row.message_id,
                      self.session_id, exc)
            self.claim_after = True
            return None
        sid = self.session_id
        started = ctx.now()
        stop_flag = ctx.turns.begin(sid, started)
        steered: list[str] = []
        last_seq = [row.seq]

        def fetch_steering() -> list[Message]:
            more = ctx.journal.claim_more(ctx.owner, sid, last_seq[0], ctx.now(),
                                          lease=ctx.lease_seconds)
            if more:
                last_seq[0] = more[-1].seq
                steered.extend(r.message_id for r in more)
            return [Message.from_row(r) for r in more]

        outbox = Outbox(row.message_id)
        turn = Turn(sid, [Message.from_row(row)], turn_tools(ctx, sid, outbox), stop_flag,
                    fetch_steering, row=row, started=started, steered=steered, outbox=outbox)
        ctx.emit("turn_started", session_id=sid, message_id=row.message_id,
                 attempt=row.attempts + 1)
        return turn

    def prepare(self, turn: Turn) -> None:
        """Run the turn hooks (the Focal policy); an error here fails the attempt."""
        prepare(self.ctx, turn)

    def end(self, turn: Turn, error: BaseException | None) -> ClaimedRow | None:
        """Commit the turn, or record the failed attempt; the session's next row, if leased.

        Journal refusals end here too: a lost lease (another worker took the
        row over; nothing of this turn is written) and a database error are
        logged, and the row comes back through its lease.
        """
        ctx = self.ctx
        row = turn.row
        sid = self.session_id
        plain = False
        try:
            judged = judge(ctx, turn, error)
            if not judged.outcome.ok:
                return self._fail(turn, judged.outcome, judged.detail or "")
            done = judged.outcome
            ids = [row.message_id, *turn.steered_ids]
            effects = ctx.effects(turn, done)
            following = self._commit(ids, turn, effects)
            plain = not (effects.messages or effects.ops)
            ctx.activity.bump("turns")
            ctx.emit("turn_committed", session_id=sid, message_ids=ids,
                     replies=list(turn.replies), stopped_by=done.stopped_by)
            self._run_after(effects)
            return following
        except LeaseLost as exc:
            log.warning("lost the lease of %s for %s: another worker took it over; this "
                        "turn's commit wrote nothing", row.message_id, sid)
            ctx.emit("lease_lost", session_id=sid, message_id=row.message_id, error=str(exc))
        except WriterClosed:
            raise
        except PersistenceError as exc:
            log.error("delivery of %s to %s failed in the journal: %s", row.message_id, sid, exc)
        finally:
            ctx.turns.end(sid)
            if not plain:
                self.claim_after = True
        return None

    def _fail(self, turn: Turn, failed: TurnOutcome, detail: str) -> None:
        """A failed attempt: nothing of the turn is committed; retry later, or ``failed``.

        ``detail`` (the traceback) is what the row keeps as ``last_error``;
        observers and logs get the one-line ``summary``, never a message body.
        """
        ctx = self.ctx
        sid = self.session_id
        row = turn.row
        summary = failed.error or "the turn failed"
        effects = ctx.effects(turn, failed)
        result = ctx.journal.retry(ctx.owner, row.message_id, detail, ctx.now(),
                                   release=turn.steered_ids, on_failed=effects.messages,
                                   on_failed_also=effects.ops)
        final = result.state.value == "failed"
        # A retried attempt is routine (INFO); giving up on a message is an ERROR.
        log.log(logging.ERROR if final else logging.INFO,
                "turn of %s for %s failed (attempt %d%s): %s", sid, row.message_id,
                result.attempts, ", giving up: row failed" if final else
                f", retry at {result.available_at:.3f}", summary)
        ctx.emit("turn_failed", session_id=sid, message_id=row.message_id, error=summary,
                 state=result.state.value, attempts=result.attempts,
                 available_at=result.available_at)
        if final:
            self._run_after(effects)

    def _run_after(self, effects: TurnEffects) -> None:
        for notify in effects.after:
            try:
                notify()
            except Exception:
                log.exception("post-commit notification failed for %s", self.session_id)

    def _commit(self, ids: list[str], turn: Turn, effects: TurnEffects) -> ClaimedRow | None:
        ctx = self.ctx
        return ctx.journal.complete_turn(ctx.owner, self.session_id, ids, turn.entries(),
                                         ctx.now(), enqueue=effects.messages,
                                         also=effects.ops, next_lease=ctx.lease_seconds)
