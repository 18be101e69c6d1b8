"""The Runtime's life cycle: its start and stop as other threads and its own code see them.

A mixin of :class:`~.runtime.Runtime`, which opens the database and starts the actors
(``_start``). Here: a start that a stop asked meanwhile ends by stopping; the graceful
stop (turns asked to stop and given one deadline, the dispatcher and the writer a floor
past it, the ticker keeping the leases of turns still winding down); a stop from the
runtime's own code (a brain, an observer, a channel send) or from the main thread (a
signal handler) run on a thread of its own; a second caller waiting for the stop under
way; the crash (as a kill would); and the teardown that lets go of the database last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Self

import pykka

from ..persistence import PersistenceError, close_every_connection
from .brain_scope import in_a_turn_of
from .errors import RuntimeStateError
from .running import RUNTIME_STOP

if TYPE_CHECKING:
    import peewee as pw

    from ..persistence import ExclusiveLock, GroupCommitWriter, OwnerLiveness
    from .context import RuntimeContext
    from .health import HealthChecks
    from .peers import PeerService
    from .services import Services
    from .shared_database import SharedDatabase
    from .ticker import Ticker

log = logging.getLogger("kinbox.runtime")

STOP_FLOOR = 1.0
"""Seconds a stop whose deadline the turns spent still gives the dispatcher (to hand back
the rows waiting for a slot) and then the writer (to commit what the turns committed as
they ended): a row or a turn that was done in time should not come back by lease because
a deaf turn spent the deadline."""

STOP_SETTLE = 30.0
"""Seconds past a stop's ``timeout`` a ``stop()`` that does not run it waits for it to end
(a second caller's; the main thread's, whose stop runs on a thread of its own): what a stop
may take after its turns' deadline (the dispatcher's and the writer's floors, the peer
links' close, the release of the database)."""


class LifeCycleApi:
    """Start, stop and crash, on the state the runtime keeps."""

    owner: str
    _state: str
    _ctx: RuntimeContext | None
    _health: HealthChecks
    _services: Services | None
    _peers: PeerService | None
    _ticker: Ticker
    _writer: GroupCommitWriter | None
    _db: pw.Database | None
    _lock: ExclusiveLock | None
    _liveness: OwnerLiveness | None
    _shared: SharedDatabase
    _stop_lock: threading.Lock
    _stopper: threading.Thread | None
    _stop_timeout: float
    _stop_done: threading.Event
    _starting: threading.Thread | None
    _stop_asked: float | None
    _start: Callable[[], None]
    _require: Callable[[], RuntimeContext]
    _stop_listening: Callable[[], None]
    _stop_ticker: Callable[[], None]

    def start(self) -> Self:
        """Open the database, start the actors and replay what was not acknowledged.

        A :meth:`stop` asked while the start runs (a signal handler's, another thread's)
        is carried out as the start ends: the runtime it returns is stopped."""
        with self._stop_lock:
            if self._state != "new" or self._starting is not None:
                state = "starting" if self._starting is not None else self._state
                raise RuntimeStateError(f"a runtime starts once; this one is {state}",
                                        state=state)
            self._starting = threading.current_thread()
        try:
            self._start()
        except BaseException:
            with self._stop_lock:
                self._starting = None
                if self._stop_asked is not None:  # nothing to stop: its callers go on
                    self._stop_asked = None  # (a start tried again is asked anew)
                    self._stop_done.set()
                    self._stop_done.clear()
            raise
        with self._stop_lock:
            self._starting = None
            asked = self._stop_asked
        if asked is not None:  # a stop came while the start ran (a signal handler's)
            self.stop(asked)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop: ask running turns to stop, let them commit, close the database.

        ``timeout`` bounds the stop's waits for turns: direct turns, session actors and
        async turns share one deadline, so turns deaf to their stop hold it ``timeout``
        seconds, not once per kind of turn. Past a spent deadline the dispatcher and the
        writer still get :data:`STOP_FLOOR` each, for the rows and commits of the turns
        that were done in time.

        The ticker runs on until the turns have ended, renewing their leases and nothing
        else (:meth:`_tick` in state ``stopped``): a turn winding down longer than its
        lease's remainder would otherwise be taken over and run again elsewhere.

        Called while another stop is under way (another thread's), it returns once that
        stop has ended. Called from one of this runtime's own turns (its brain, or a tool
        it calls), an observer (on a turn's thread) or a channel send, which the stop
        waits for, it begins the stop on a thread of its own and returns: the turn ends,
        commits, and the stop ends after it. On the main thread (a signal handler's, which
        may have interrupted a frame holding one of the runtime's locks) the stop runs on
        a thread of its own too, waited for at most ``timeout`` + :data:`STOP_SETTLE`."""
        with self._stop_lock:
            if self._starting is not None:  # the start ends by stopping (see start())
                self._stop_asked = timeout
                starter = self._starting
            else:
                starter = None
            state = self._state
            if starter is None and state == "running":
                self._state = "stopped"
                self._stopper = threading.current_thread()
                self._stop_timeout = timeout
        if starter is not None:
            if starter is not threading.current_thread():  # else its signal handler
                self._stop_timeout = max(self._stop_timeout, timeout)
                self._await_stop()
            return
        if state == "stopped":
            self._await_stop()
            return
        if state != "running":
            return
        ctx = self._require()
        own_turn = in_a_turn_of(ctx)
        if own_turn or threading.current_thread() is threading.main_thread():
            # A turn's stop cannot wait for itself. On the main thread the caller may be a
            # signal handler that interrupted a frame holding one of the runtime's locks
            # (rt.statistics() inside the turn board's): run there, the stop would wait
            # for that lock for good; from here, the wait below is bounded, the handler
            # returns, the frame lets go, and the stop ends.
            stopper = threading.Thread(target=self._stop_now, args=(ctx, timeout),
                                       name="kinbox-stop", daemon=True)
            try:
                stopper.start()
            except RuntimeError:  # no new thread at interpreter shutdown: stop here
                self._stop_now(ctx, timeout)
                return
            self._stopper = stopper
            if not own_turn:
                self._await_stop()
            return
        self._stop_now(ctx, timeout)

    def _stop_now(self, ctx: RuntimeContext, timeout: float) -> None:
        try:
            left = self._wind_down(ctx, timeout)
            self._hand_back_unoffered(ctx)
            ctx.emit("stopped", owner=self.owner)
            self._teardown(max(left(), STOP_FLOOR))
            log.info("runtime %s stopped", self.owner)
        finally:
            self._stop_done.set()

    def _hand_back_unoffered(self, ctx: RuntimeContext) -> None:
        """Hand back the rows of the fast-path sends the stop got ahead of (their commit
        leased the row, their sender had not offered it to the slots yet: a signal
        handler's stop, on the very thread that waited for the commit), before the writer
        stops: offered late, their hand-back met a closed writer, and each stayed leased
        to this stopped runtime, to be taken over at the next start as a suspect."""
        ids = list(ctx.handing_over)
        if not ids:
            return
        try:
            ctx.journal.hand_back(self.owner, ids, ctx.now())  # rows leased no more: refused
        except PersistenceError as exc:  # WriterClosed too: their leases run out instead
            log.warning("could not hand back %d rows of sends under way at the stop: %s",
                        len(ids), type(exc).__name__)

    def _await_stop(self) -> None:
        """Wait for the stop under way to end; not on its own thread (a signal handler that
        interrupted it), nor in a turn it waits for."""
        if threading.current_thread() is self._stopper or (
                self._ctx is not None and in_a_turn_of(self._ctx)):
            return
        if not self._stop_done.wait(self._stop_timeout + STOP_SETTLE):
            log.warning("runtime %s still stopping %.1f s into its stop", self.owner,
                        self._stop_timeout + STOP_SETTLE)

    def _wind_down(self, ctx: RuntimeContext, timeout: float) -> Callable[[], float]:
        """Stop what runs, turns first (a graceful stop's, and a start's that failed late:
        its dispatcher, session threads and schedules ran on otherwise); the time left of
        ``timeout``, for the teardown."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())
        ctx.closed.set()
        ctx.turns.close()
        if self._services is not None:
            self._services.stop_schedule()
        self._stop_listening()
        try:
            if self._peers is not None:
                self._peers.stop()
            for session_id in ctx.turns.running():
                ctx.turns.request_stop(session_id, RUNTIME_STOP, ctx.now())
            if ctx.async_host is not None:  # cancels, past the grace, direct turns' brains too
                ctx.async_host.begin_stop(timeout)
            if self._services is not None:  # before the async host: their brains may run there
                self._services.stop(wait=True, timeout=left())
            if ctx.dispatcher is not None:
                try:
                    # It stops its session actors, and hands back the rows waiting for one.
                    ctx.dispatcher.stop(timeout=max(left(), STOP_FLOOR))
                except pykka.Timeout:  # a sync brain that ignores its stop: it keeps its thread
                    log.warning("turns still running %.1f s into the stop; what they commit "
                                "after it is refused, and their rows come back by lease", timeout)
            if ctx.async_host is not None:
                ctx.async_host.stop(timeout)  # by begin_stop's deadline: the same one
        finally:  # the turns have ended (or are given up on): no lease left to keep
            self._ticker.stop()
        return left

    def crash(self) -> None:
        """Stop abruptly, as a kill would: nothing queued is committed, no goodbyes."""
        if self._state != "running":
            raise RuntimeStateError(f"cannot crash a runtime that is {self._state}",
                                    state=self._state)
        ctx = self._require()
        self._state = "crashed"
        # The writer first: after a kill nothing is written, and a turn that notices the
        # crash (its tools refuse once the runtime is closed) must not get its failed
        # attempt, and the backoff with it, committed while the rest shuts down.
        if self._writer is not None:
            self._writer.abort()
        ctx.crashed.set()
        ctx.closed.set()
        ctx.turns.close()
        if self._services is not None:
            self._services.stop_schedule()
        self._stop_ticker()
        if self._services is not None:
            self._services.stop(wait=False)
        if ctx.async_host is not None:
            ctx.async_host.crash()
        if self._peers is not None:
            self._peers.stop()
        if ctx.dispatcher is not None:
            ctx.dispatcher.stop(block=False)
        ctx.emit("crashed", owner=self.owner)
        self._health.close()
        self._release_ownership()

    def _teardown(self, timeout: float = 10.0) -> None:
        self._health.close()
        if self._writer is not None:
            self._writer.stop(timeout)  # the stop's timeout bounds this wait too
        self._release_ownership()
        # Every thread's connection, not the caller's alone: the thread that started the
        # runtime (or called it since) may not be the one stopping it (a signal handler's),
        # and its connection would stay open (a server connection, the file's handles)
        # as long as that thread lives.
        if self._db is None:
            return
        if self._writer is not None and self._writer.alive:
            # Its batch outlived the stop's wait: closing its connection under it would
            # end the transaction mid-batch. The caller's alone; the writer's ends with it.
            log.warning("the writer was still committing when the runtime stopped; its "
                        "database connection is left to it")
            if not self._db.in_transaction():
                self._db.close()
            return
        close_every_connection(self._db)

    def _release_ownership(self) -> None:
        self._shared.close()
        # What proves this runtime alive goes last, as with a killed process.
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._liveness is not None:
            self._liveness.release()
            self._liveness = None

    def __enter__(self) -> Self:
        return self.start() if self._state == "new" else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
