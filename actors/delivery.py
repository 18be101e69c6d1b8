"""The delivery protocol of one session: events in, effects out (sans-I/O).

Like websockets' ``protocol.py``: no threads, no database, no clock. A session actor
(sync turns on its pool thread, async turns on the event loop) feeds it what happened
and carries out the effects it answers with, in order. The exactly-once rules of a
delivery run live here, once, for both kinds of turns:

========================  ===========  ===================================================
event                     in phase     effects, next phase
========================  ===========  ===================================================
``claimed(row)``          IDLE         closing: Release(row), Done(claim) -> DONE;
                                       else StartTurn(row) -> STARTING
``started()``             STARTING     RunBrain() -> RUNNING; closing (the runtime began
                                       stopping while the turn waited to start): Release(row),
                                       Done(claim) -> DONE
``refused(error)``        STARTING     Done(claim) -> DONE  (the lease was lost); an
                                       ``error`` (the journal failed: the row is still this
                                       worker's): RecordFailure(row id, e, ORDINARY,
                                       ran=False) -> FAILING
``parked()``              STARTING     Done(claim) -> DONE  (a direct turn of the session
                                       holds it: the row waits in the slot table)
``steered(ids)``          RUNNING      (the rows join the turn: committed or released
                                       with it) -> RUNNING
``unseen(ids)``           RUNNING      Release(each): rows fetched for the turn that its
                                       brain was never handed -> RUNNING
``brain_returned()``      RUNNING      Commit(ids, next_lease unless this is the run's
                                       CHAIN_LIMIT-th turn, its row was taken over, or
                                       closing) -> COMMITTING
``brain_raised(e, k)``    RUNNING      RecordFailure(row id, release=steered, e, k) -> FAILING
                                       (``k``: the exception's FailureKind, carried as data:
                                       permanent, or the least wait before the retry)
``cut_short()``           RUNNING      Release(row, each steered), Done(claim) -> DONE  (the
                                       runtime's stop cancelled the brain before it
                                       replied: nothing written, no attempt counted)
``committed(next, p)``    COMMITTING   a next row within CHAIN_LIMIT turns: StartTurn(next)
                                       -> STARTING; past it, after a taken-over row or
                                       closing: Release(next),
                                       Done(claim) -> DONE; none: Done(claim if the commit
                                       leased nothing or some turn was not plain) -> DONE
``lease_lost()``          COMMITTING   Release(each steered), Done(claim) -> DONE  (nothing
                                       of the turn written; the steered rows are still
                                       this worker's, and no one renews them any more)
``commit_refused(e)``     COMMITTING   RecordFailure(row id, release=steered, e, ORDINARY)
                                       -> FAILING
                                       (the journal refused the commit, a database error:
                                       nothing of the turn was written; a failed attempt)
``journal_failed()``      FAILING      Release(row, backoff), Release(each steered),
                                       Done(claim) -> DONE (the failure record was refused
                                       too: the rows go back unrun, the failed one due
                                       after a backoff; should the release fail too, they
                                       come back by lease)
``failure_recorded()``    FAILING      Done(claim) -> DONE
========================  ===========  ===================================================

Any other (phase, event) pair is a bug in the shell and raises :class:`ProtocolError`.
``Done(claim=True)`` asks the dispatcher to claim: rows may be due that no commit of this
run leased (a row handed back, a failed attempt, messages a commit enqueued). A commit
leases the session's next row in its own transaction (``Commit.next_lease``), so one row
is in flight per session and a busy session keeps going without the dispatcher. The
run's last turn (the ``CHAIN_LIMIT``-th, or one that ends while the runtime stops) leases
nothing: the row would only be handed back (a write for the lease, another for the
release), and the claim its ``Done`` asks for finds it where it is.

A taken-over row's turn (its last worker died during it) ends its run too: a runtime
runs one such row at a time, so that a death during it is that row's, and the rest wait
for this run's ``Done``. Chaining the session's next 15 turns first kept every other
taken-over row waiting for them (measured after a SIGKILL of one of two workers, 40
sessions, 0.3 s turns: the last session resumed 53 s later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from .brain_failure import ORDINARY, FailureKind
from .errors import KinboxError

CHAIN_LIMIT = 16
"""Turns a session runs back to back before it hands its slot back (fairness)."""


class Row(Protocol):
    """What the protocol reads of a leased row (``persistence.Row``)."""

    @property
    def message_id(self) -> str: ...

    @property
    def taken_over(self) -> bool: ...


class Phase(StrEnum):
    """Where a session's delivery run is."""

    IDLE = "idle"
    STARTING = "starting"
    RUNNING = "running"
    COMMITTING = "committing"
    FAILING = "failing"
    DONE = "done"


# Module constants: every event checks and sets phases, and a global reads faster than a member.
_IDLE, _STARTING, _RUNNING = Phase.IDLE, Phase.STARTING, Phase.RUNNING
_COMMITTING, _FAILING, _DONE_PHASE = Phase.COMMITTING, Phase.FAILING, Phase.DONE


class ProtocolError(KinboxError):
    """An event the delivery protocol does not allow in its current phase (a bug)."""

    def __init__(self, event: str, phase: Phase) -> None:
        super().__init__(f"delivery protocol: {event!r} is not allowed in phase {phase}")
        self.event = event
        self.phase = phase


# Every turn makes a StartTurn and a Commit: slotted, not frozen (a frozen dataclass sets
# each field through a call; see persistence.inbox_records). Values all the same: nothing
# assigns to them. The effects shared by every run (_RUN_BRAIN, _DONE) stay frozen.
@dataclass(slots=True)
class StartTurn:
    """Start the turn of ``row``; record its start first when it was taken over."""

    row: Row
    record_start: bool


@dataclass(frozen=True)
class RunBrain:
    """Call the brain on the started turn."""


@dataclass(slots=True)
class Commit:
    """Commit the turn: entries, markers and acks of ``message_ids``, leasing the next row."""

    message_ids: tuple[str, ...]
    next_lease: bool = True
    """Lease the session's next due row in the same transaction (False on a run's last
    turn: it could not run here)."""


@dataclass(frozen=True)
class RecordFailure:
    """Record a failed attempt of ``message_id`` (backoff or ``failed``) and hand the
    steered rows back unrun, in one transaction; nothing of the turn is written."""

    message_id: str
    release: tuple[str, ...]
    error: str
    kind: FailureKind = ORDINARY
    """How the failure asks to be retried: ``permanent`` makes the row ``failed`` at once,
    ``retry_after`` is the least wait before its retry (:mod:`.brain_failure`)."""
    ran: bool = True
    """The turn ran (False: its start was refused): a suspect row stays suspect unless its
    turn ran, since only a turn that ran and ended shows the row did not kill its process."""


@dataclass(frozen=True)
class Release:
    """Hand a leased row back unrun (no attempt counted)."""

    message_id: str
    backoff: bool = False
    """Due again only after a backoff: the row's failed attempt could not be recorded.
    Due at once, its next claim ran its brain again straight away, round and round for
    as long as the database refused the record."""


@dataclass(frozen=True)
class Done:
    """The run is over: the session's slot is free; ``claim`` asks for a claim."""

    claim: bool


Effect = StartTurn | RunBrain | Commit | RecordFailure | Release | Done

_RUN_BRAIN = RunBrain()
_DONE = {True: Done(True), False: Done(False)}
"""The effects without a row: immutable, so every run shares one of each (a turn's start
and end allocate nothing for them)."""


@dataclass(slots=True)
class Delivery:
    """One delivery run of one session: from a claimed row to ``Done``."""

    closing: bool = False
    """The runtime is stopping: rows are handed back, no turn starts."""
    phase: Phase = Phase.IDLE
    turns: int = 0
    row: Row | None = None
    steered: list[str] = field(default_factory=list)
    claim: bool = False
    leasing: bool = True
    """The current commit leases the session's next row."""

    def _expect(self, event: str, *phases: Phase) -> None:
        if self.phase not in phases:
            raise ProtocolError(event, self.phase)

    def _start(self, row: Row) -> list[Effect]:
        self.row, self.steered, self.phase = row, [], _STARTING
        return [StartTurn(row, row.taken_over)]

    def _done(self, claim: bool) -> list[Effect]:
        self.phase = _DONE_PHASE
        return [_DONE[claim or self.claim]]

    def claimed(self, row: Row) -> list[Effect]:
        """A row leased for this session (by a claim, or by its send)."""
        self._expect("claimed", _IDLE)
        if self.closing:
            self.phase = _DONE_PHASE
            return [Release(row.message_id), _DONE[True]]
        return self._start(row)

    def started(self) -> list[Effect]:
        """The turn started (its start recorded where asked). Closing by now (it waited for
        another turn of its session while the runtime began to stop), its brain does not
        run: the stop asked the running turns to stop before this one was on the board, so
        it would run unasked, and a stop does not wait for a turn it never asked."""
        self._expect("started", _STARTING)
        if self.closing:
            assert self.row is not None
            self.phase = _DONE_PHASE
            return [Release(self.row.message_id), _DONE[True]]
        self.phase = _RUNNING
        return [_RUN_BRAIN]

    def parked(self) -> list[Effect]:
        """Another turn of the session (a direct one) holds it: the row went to wait in the
        slot table for that turn's end, still leased here, and this run ends."""
        self._expect("parked", _STARTING)
        return self._done(False)

    def refused(self, error: str | None = None) -> list[Effect]:
        """The turn could not start: the lease was lost (the row is its new holder's), or
        (``error``) the journal failed and the row is still this worker's. That row's
        attempt fails, recorded with its backoff as a refused commit's is
        (:meth:`commit_refused`), its brain not run. Left leased, with its run over and
        nothing renewing it, it and every later row of its session waited out a whole
        lease; handed straight back (still suspect, still due), the run's claim took it
        again at once, and while the database refused that write the row went round claim,
        refused start, release at full speed, counted toward nothing."""
        self._expect("refused", _STARTING)
        if error is None:
            return self._done(True)
        assert self.row is not None
        self.phase = _FAILING
        return [RecordFailure(self.row.message_id, (), error, ran=False)]

    def steered_in(self, message_ids: list[str]) -> list[Effect]:
        """Rows taken into the running turn by ``steering()`` (or by name: a foreground
        child's result, :meth:`.turn.Turn.take`)."""
        self._expect("steered", _RUNNING)
        self.steered.extend(message_ids)
        return []

    def unseen(self, message_ids: list[str]) -> list[Effect]:
        """Rows ``steering()`` leased for the running turn that its brain never took (it
        stopped waiting for them): not part of the turn, handed back for a turn of their
        own, before the turn commits (its commit may lease them next)."""
        self._expect("unseen", _RUNNING)
        return [Release(mid) for mid in message_ids]

    def brain_returned(self) -> list[Effect]:
        """The brain returned and its outcome is to be committed."""
        self._expect("brain_returned", _RUNNING)
        assert self.row is not None
        self.phase = _COMMITTING
        self.leasing = self.turns + 1 < CHAIN_LIMIT and not self.closing and not self.row.taken_over
        return [Commit((self.row.message_id, *self.steered), self.leasing)]

    def brain_raised(self, error: str, kind: FailureKind = ORDINARY) -> list[Effect]:
        """The attempt failed (the brain raised, timed out, or returned what it may not);
        ``kind`` is how its exception asks to be retried (:func:`.brain_failure.classify`),
        recorded with it."""
        self._expect("brain_raised", _RUNNING)
        assert self.row is not None
        self.phase = _FAILING
        return [RecordFailure(self.row.message_id, tuple(self.steered), error, kind)]

    def cut_short(self) -> list[Effect]:
        """The runtime's stop cancelled the brain past its grace before it replied: the
        turn's rows go back unrun, no attempt counted, for the next start. Committed, the
        message would be acknowledged unanswered; as a failed attempt, a deploy would cost
        it an attempt and a backoff (and a few deploys, the message)."""
        self._expect("cut_short", _RUNNING)
        assert self.row is not None
        return [*(Release(mid) for mid in (self.row.message_id, *self.steered)), *self._done(True)]

    def committed(self, following: Row | None, plain: bool) -> list[Effect]:
        """The commit is durable; ``following`` is the next row it leased, ``plain`` says
        it enqueued nothing besides."""
        self._expect("committed", _COMMITTING)
        self.turns += 1
        self.claim = self.claim or not plain
        if following is None:  # a commit that leased nothing may leave a row due
            return self._done(not self.leasing)
        if not self.leasing or self.closing:  # past the limit, after a taken-over row
            self.phase = _DONE_PHASE
            return [Release(following.message_id), _DONE[True]]
        return self._start(following)

    def lease_lost(self) -> list[Effect]:
        """The commit was refused: another worker holds the row now; nothing was written.
        The rows ``steering()`` leased into the turn go back unrun: their leases are still
        this worker's, and once the run is done nothing renews them; left to run out, they
        would wait a whole lease and then be taken over as suspects (run alone, as rows
        that may have killed their process). A release refused (that lease was lost too)
        leaves the row to its lease."""
        self._expect("lease_lost", _COMMITTING)
        return [*(Release(mid) for mid in self.steered), *self._done(True)]

    def commit_refused(self, error: str) -> list[Effect]:
        """The journal refused the commit (a database error; nothing of the turn was
        written): a failed attempt, recorded with its backoff as when the brain raised.
        Handed straight back, a commit that can never succeed (a value the database will
        not store, a hook's write that conflicts) ran its brain again at once, for ever; a
        blip of the database costs an attempt and the first backoff (2 s), where leaving
        the row to its lease stalled the session for the whole lease. A commit that timed
        out is refused only when it was withdrawn (still queued: it never runs); one a
        batch had taken (:class:`~kinbox.persistence.WriteTimeout`, not ``withdrawn``) may
        land yet, so the shell waits for its outcome and reports that instead."""
        self._expect("commit_refused", _COMMITTING)
        assert self.row is not None
        self.phase = _FAILING
        return [RecordFailure(self.row.message_id, tuple(self.steered), error)]

    def journal_failed(self) -> list[Effect]:
        """The failure record did not happen (a database error, or the lease was lost):
        the turn's rows go back unrun, so the session does not wait for a lease to run out
        (no one renews a row its run has let go of); the failed one is due again after the
        backoff its attempt would have cost, uncounted, so a record the database keeps
        refusing does not rerun its brain at once, for ever. A release refused leaves the
        row to its lease."""
        self._expect("journal_failed", _FAILING)
        assert self.row is not None
        mine = Release(self.row.message_id, backoff=True)  # the steered rows never failed
        return [mine, *(Release(mid) for mid in self.steered), *self._done(True)]

    def failure_recorded(self) -> list[Effect]:
        """The failed attempt is recorded (a retry scheduled, or the row ``failed``)."""
        self._expect("failure_recorded", _FAILING)
        self.turns += 1
        return self._done(True)
