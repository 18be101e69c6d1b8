"""What the runtime's actors share: stores, clock, brain, identity and observers.

One :class:`RuntimeContext` per started runtime. It holds no policy; it is
the wiring the composition root (``runtime.py``) hands to each actor, plus
the :class:`Activity` board that ``run_until_idle`` waits on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pykka

from ..persistence import (
    WRITE_TIMEOUT,
    ClaimedRow,
    EnqueueResult,
    Journal,
    Lease,
    NewMessage,
    Reply,
    SessionStore,
    StopRequests,
    TaskChange,
    TaskStore,
    WriteTimeout,
)
from .brain_scope import brain_of
from .clock import Clock
from .errors import RuntimeStateError
from .messages import Wake
from .queued_sends import QueuedSends
from .running import RunningTurns
from .ticker import no_alarm
from .turn import Brain, Turn, TurnOutcome

if TYPE_CHECKING:
    from .slots import Slots

log = logging.getLogger("kinbox.runtime")

@dataclass
class TurnEffects:
    """What a turn's end causes besides its own commit."""

    messages: list[NewMessage] = field(default_factory=list)
    """Messages to enqueue in the turn's commit (a parent's wake-up)."""
    ops: list[Callable[[], object]] = field(default_factory=list)
    """Writes run on the writer thread inside the turn's commit (a task update)."""
    after: list[Callable[[], None]] = field(default_factory=list)
    """Notifications to run once the commit is durable."""

    def extend(self, other: TurnEffects) -> None:
        """Add another hook's effects."""
        self.messages.extend(other.messages)
        self.ops.extend(other.ops)
        self.after.extend(other.after)


NO_EFFECTS = TurnEffects()
"""What most turns cause besides their commit: nothing (shared: never add to it)."""

HookReads = Callable[[], "TurnEffects | None"]
"""An outbox hook's work that reads the database to know the turn's effects."""

OutboxHook = Callable[["RuntimeContext", Turn, TurnOutcome], "TurnEffects | HookReads | None"]
"""Effects of a turn's end (a parent's wake-up), committed with the turn's outcome (None:
none). Runs without blocking (the event loop of async brains runs it): a hook that must
read the database to know them returns that work instead, which the caller runs where
blocking is allowed (:meth:`RuntimeContext.effect_parts`)."""

TurnHook = Callable[["RuntimeContext", Turn], "Callable[[], object] | None"]
"""Runs before a turn's brain, without blocking (the event loop of async brains runs it):
what must happen before the brain that may read or write the database, it returns as
work, which the caller runs where blocking is allowed (or None: nothing to do now)."""

TaskHook = Callable[["RuntimeContext", TaskChange], list[NewMessage]]
"""Messages a task change causes (a Focal notice); run inside the change's transaction."""

Observer = Callable[[str, dict[str, Any]], None]
"""``observer(event, data)``: told of sends, turns, retries, crashes (scenario reports)."""

class Activity:
    """What waiters wait on (a turn ended, a slot freed, a claim ran) and the turn
    counters, with a condition to wait for changes on. The slot table's state is read
    from it on demand (:attr:`board`), not copied here on every change."""

    def __init__(self) -> None:
        self._mutex = threading.RLock()
        self.cond = threading.Condition(self._mutex)
        self._waiters = 0
        """Threads in :meth:`wait`: a change notifies only when someone waits."""
        self._slot_changes = 0
        """Written by :meth:`changed` only, which the slot table calls under its lock."""
        self._bumps = 0
        """Written by :meth:`bump` only, under this board's lock: each counter has one lock
        of its own, so no increment is lost on any interpreter."""
        self.board: Callable[[], tuple[int, bool, int, int]] = _no_board
        """The slot table's (busy, claim pending, live, peak live): set by the slot table."""
        self.activations = 0
        self.passivations = 0
        self.turns = 0

    @property
    def changes(self) -> int:
        """Moves on every change: a waiter that checks something outside the lock waits
        for this to move (nothing is missed between its check and its wait)."""
        return self._slot_changes + self._bumps

    def changed(self) -> None:
        """The slot table changed (called under the slot table's lock): wake the waiters.

        Without this board's lock unless someone waits: a waiter counts itself in under
        the lock before it checks, so either this sees it and notifies (once it waits),
        or its check comes after this change and sees it."""
        self._slot_changes += 1
        if self._waiters:
            with self._mutex:
                self.cond.notify_all()

    def bump(self, name: str, by: int = 1) -> None:
        """Add to a counter and wake every waiter."""
        with self._mutex:
            setattr(self, name, getattr(self, name) + by)
            self._bumps += 1
            if self._waiters:
                self.cond.notify_all()

    def wait(self, timeout: float, until: Callable[[], bool] | None = None) -> bool:
        """Wait for the next change, or ``timeout``; with ``until``, for ``until()`` to
        hold (its last value). ``until`` runs under the board's lock, which every turn's
        start and end takes while someone waits: it must be quick (no database read)."""
        with self.cond:
            self._waiters += 1
            try:
                if until is None:
                    return self.cond.wait(timeout)
                return self.cond.wait_for(until, timeout)
            finally:
                self._waiters -= 1

    def snapshot(self) -> dict[str, Any]:
        """The current values."""
        busy, claim_pending, live, peak_live = self.board()
        with self._mutex:
            return {"busy": busy, "claim_pending": claim_pending, "live": live,
                    "peak_live": peak_live, "activations": self.activations,
                    "passivations": self.passivations, "turns": self.turns}


def gather_effects(parts: list[TurnEffects | HookReads]) -> TurnEffects:
    """One turn's effects from :meth:`RuntimeContext.effect_parts`, running the hooks'
    reads here (read the result, never add to it: most turns share :data:`NO_EFFECTS`)."""
    effects = NO_EFFECTS  # most turns: no tool writes, nothing from any hook
    for part in parts:
        more = part if isinstance(part, TurnEffects) else part()
        if more is not None and (more.messages or more.ops or more.after):
            if effects is NO_EFFECTS:
                effects = TurnEffects()
            effects.extend(more)
    return effects


def _no_board() -> tuple[int, bool, int, int]:
    return 0, False, 0, 0


@dataclass
class RuntimeContext:
    """Everything a runtime actor needs, created by ``Runtime.start``."""

    journal: Journal
    store: SessionStore
    tasks: TaskStore
    stops: StopRequests
    """Stops asked for turns another process runs (:mod:`.stops`)."""
    clock: Clock
    brain: Brain
    owner: str
    lease_seconds: float
    tools_for: Callable[..., Any]
    """``tools_for(session_id, outbox)``: a running turn's tools (``tools.tools_for``)."""
    new_id: Callable[[], str]
    tool_classes: dict[str, type] = field(default_factory=dict)
    """Which tools each session seen holds (``tools.tools_for``): decided by its id and
    kind, which never change, so a turn builds them without a database read (an async
    turn builds them on the event loop, where a read would hold up every other turn)."""
    turns: RunningTurns = field(default_factory=RunningTurns)
    activity: Activity = field(default_factory=Activity)
    crashed: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)
    observers: list[Observer] = field(default_factory=list)
    outbox_hooks: list[OutboxHook] = field(default_factory=list)
    turn_hooks: list[TurnHook] = field(default_factory=list)
    task_hooks: list[TaskHook] = field(default_factory=list)
    dispatcher: pykka.ActorRef[Any] | None = None
    slots: Slots | None = None
    """The delivery slots (:mod:`.slots`): where turns start and end, from any thread."""
    queued_sends: QueuedSends = field(default_factory=QueuedSends)
    """Family sends checked against the pending limit, not yet durable (:mod:`.queued_sends`)."""
    starting_children: QueuedSends = field(default_factory=QueuedSends)
    """Sub-agents checked against the running-children limit, per parent, not yet durable
    (:data:`.validation.CHILD_LIMIT`)."""
    buckets: Any = None
    """Family rate-limit buckets (``family.Buckets``, shared through the database), set by
    the runtime."""
    focal: Any = None
    """The Focal service (``focal.Focal``), set by the runtime."""
    peers: Any = None
    """The peer service (``peers.PeerService``), set by the runtime."""
    wake_pending: bool = False
    """A ``Wake`` is on its way to the dispatcher, so senders need not send another."""
    max_active: int = 64
    """Turns that can run at once (the session threads)."""
    turn_timeout: float | None = None
    """Seconds a turn may run before it is stopped and counted a failed attempt."""
    foreground_waits: int = 0
    """Turns blocked in a foreground ``agent(...)`` call, each holding a session thread."""
    stop_grace: float = 10.0
    """Seconds an async turn may ignore a stop request before it is cancelled."""
    async_host: Any = None
    """The event loop of async brains (``async_host.AsyncHost``), when the brain is async."""
    now: Callable[[], float] = field(init=False, repr=False)
    """The runtime clock's time: ``clock.now`` itself (one call, not two)."""
    alarm_in: Callable[[float], None] = no_alarm
    """Asks for a claim in so many seconds, when a row comes due that nothing will hand
    over (a claim saw it not yet due; a failed attempt's backoff ends): the runtime's
    ticker (:mod:`.ticker`); none in a runtime that does not deliver (send-only, or not
    started yet) or whose clock is moved by hand."""
    fast_lease: Lease | None = None
    """Set where this runtime provably owns every target (it holds the SQLite file's
    exclusive lock, and write transactions there are serial across processes): a send
    whose row is its target's head leases it in the enqueue's transaction and starts its
    turn at once (the slot table), with no claim query. None on PostgreSQL, where several
    processes deliver, and in a send-only runtime."""
    handing_over: set[str] = field(default_factory=set)
    """Ids of the fast-path sends (:attr:`fast_lease`) between their submit and the offer
    of the row they leased to the slots: leased, held by no session yet, and not to be
    taken back as unheld (:mod:`.unheld_leases`): the sending thread runs it."""

    def __post_init__(self) -> None:
        self.now = self.clock.now

    def enqueue(self, msg: NewMessage) -> EnqueueResult:
        """Commit ``msg``, tell observers it was ``sent``, then start its turn (the fast
        path) or nudge the dispatcher.

        A fast-path send that leased nothing needs no nudge: its target's older row is in
        flight here (its commit leases the next one), or waits out a backoff (the tick
        claims it when due)."""
        lease = None if self.closed.is_set() else self.fast_lease
        late = False
        if lease is not None:  # before its commit: no look sees its lease without this
            self.handing_over.add(msg.message_id)
        try:
            reply = self.journal.submit_enqueue(msg, self.now(), lease=lease)
            try:
                result = reply.result(WRITE_TIMEOUT)
            except WriteTimeout as timed_out:
                if not timed_out.withdrawn:  # its batch runs: it may yet commit, leasing its row
                    late = True
                    reply.add_done_callback(lambda: self._sent_late(msg, reply))
                raise
            self.emit_sent(msg, result)
            if result.claimed is not None:
                self.hand_over(result.claimed)
            elif lease is None:
                self.wake_dispatcher()
            return result
        finally:
            if not late:  # a late one's id goes once its answer is carried out
                self.handing_over.discard(msg.message_id)

    def _sent_late(self, msg: NewMessage, reply: Reply[EnqueueResult]) -> None:
        """A send whose sender stopped waiting (``WriteTimeout``, not withdrawn) has its
        answer (on the writer thread). Committed, it goes on as a send answered in time:
        observers hear ``sent``, and the row its send leased (the fast path) starts its
        turn, or the dispatcher is nudged. Left alone, that row stayed leased to this
        runtime with nothing to run or renew it: it waited out its lease, then ran as a
        suspect. On a thread of its own: a reply's callback must not block the writer,
        and starting a turn may start a session actor. A fast-path send's id stays in
        :attr:`handing_over` until its row is offered (a discard of any other is nothing)."""
        try:
            result = reply.outcome()
        except Exception:
            self.handing_over.discard(msg.message_id)
            return  # not committed: the sender was told it may not have been

        def go_on() -> None:
            try:
                self.emit_sent(msg, result)
                if result.claimed is not None:
                    self.hand_over(result.claimed)
                else:
                    self.wake_dispatcher()
            finally:
                self.handing_over.discard(msg.message_id)
        threading.Thread(target=go_on, name="kinbox-late-send", daemon=True).start()

    def emit_sent(self, msg: NewMessage, result: EnqueueResult) -> None:
        """Observers hear of a committed send."""
        if self.observers:
            self.emit("sent", message_id=result.message_id, sender=msg.sender,
                      target=msg.target, kind=msg.kind, created=result.created)

    def hand_over(self, row: ClaimedRow) -> None:
        """Start the turn of a row leased for this runtime outside a claim (or keep it
        until a slot frees), on this thread."""
        if self.slots is not None:
            self.slots.offer(row)

    def effects(self, turn: Turn, outcome: TurnOutcome) -> TurnEffects:
        """What commits with this outcome, the hooks' reads made here: see
        :meth:`effect_parts`."""
        return gather_effects(self.effect_parts(turn, outcome))

    def effect_parts(self, turn: Turn, outcome: TurnOutcome
                     ) -> list[TurnEffects | HookReads]:
        """What commits with this outcome, without blocking: the turn's own tool writes
        when it succeeded (never when it failed: its outbox is discarded, giving back what
        it took), then what every outbox hook adds, in order, or the read that tells it
        (:func:`gather_effects` makes them one)."""
        parts: list[TurnEffects | HookReads] = []
        box = turn.outbox
        if box is not None and not outcome.ok:
            box.discard()
        elif box is not None and (own := box.close()) is not None:
            parts.append(own)  # the tool calls' writes, in call order
        for hook in self.outbox_hooks:
            more = hook(self, turn, outcome)
            if more is not None:
                parts.append(more)
        return parts

    def require_running(self) -> None:
        """Raise :class:`RuntimeStateError` once the runtime stopped or crashed."""
        if self.closed.is_set():
            state = "crashed" if self.crashed.is_set() else "stopped"
            raise RuntimeStateError(f"the runtime is {state}; it accepts no more work")

    def emit(self, event: str, **data: Any) -> None:
        """Tell observers; an observer that raises is logged, never fatal. They run as the
        runtime's own code (:mod:`.brain_scope`): often on a turn's thread, which a stop
        they call must not wait for."""
        if not self.observers:
            return
        for observer in list(self.observers):
            try:
                with brain_of(self):
                    observer(event, data)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit too: out of here, it ended the turn's
                # thread after its commit, the session's next rows held for a lease.
                # Its type above DEBUG, its traceback at DEBUG: an observer's exception
                # quotes what it was given (a turn_committed event carries the replies).
                log.error("observer failed on %s: %s", event, type(exc).__name__)
                log.debug("observer failed on %s", event, exc_info=True)

    def wake_dispatcher(self) -> None:
        """Nudge the dispatcher (after a send committed).

        One nudge serves every send committed before the dispatcher reads it
        (it clears ``wake_pending`` before it claims), so under load senders
        skip the actor message. Setting and reading a bool is atomic here.
        """
        if self.dispatcher is not None and not self.crashed.is_set() and not self.wake_pending:
            self.wake_pending = True
            try:
                self.dispatcher.tell(Wake())
            except pykka.ActorDeadError:
                pass  # stopping: the journal keeps the row for the next start
