"""The registry of running turns: who is active now, since when, and their stop flags.

Stop requests are ephemeral control (not journaled): ``agent_stop`` sets the
running turn's flag and the brain sees ``turn.stop_requested``. Shared by the
session actors and the direct turns of cron and social (which register
their turn), the tools (which ask) and the dispatcher (which stops turns
past the runtime's ``turn_timeout``).

A session runs one turn at a time whoever started it: ``begin`` waits while
another turn of the same session runs (an inbox turn and a cron run, say),
so their transcript entries never interleave.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from .loop_calls import call_soon

TIMEOUT = "kinbox:turn_timeout"
"""Who "stopped" a turn that ran past the runtime's turn timeout."""
RUNTIME_STOP = "runtime"
"""Who stopped the turns still running when the runtime stopped gracefully."""


def overdue(started: float, now: float, timeout: float | None) -> bool:
    """A turn that started at ``started`` has run past ``timeout`` seconds at ``now``."""
    return timeout is not None and now - started > timeout


class StopFlag:
    """A turn's stop flag, which threads can wait for and async turns can await.

    Every turn has one and almost none is ever waited for, so it is a bool until
    someone waits: the ``threading.Event`` (or the loop's ``asyncio.Event``) a
    waiter needs is made by that waiter, under one lock shared by all flags.
    """

    __slots__ = ("_event", "_set", "_waiters", "by")

    def __init__(self) -> None:
        self._set = False
        self.by: str | None = None
        """Who asked the turn to stop, as the board names them (set under its lock, before
        the flag is raised): read by a brain through ``Turn.runtime_stopping``."""
        self._event: threading.Event | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] | None = None

    def is_set(self) -> bool:
        """True once the flag is raised."""
        return self._set

    def set(self) -> None:
        """Raise the flag and wake every waiter, threads and event loops alike."""
        with _WAITERS:
            self._set = True
            event, waiters, self._waiters = self._event, self._waiters, None
        if event is not None:
            event.set()
        for loop, async_event in waiters or ():
            call_soon(loop, async_event.set)  # its loop may have closed: no waiter then

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the flag is raised or ``timeout`` passes; return the flag."""
        with _WAITERS:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Await the flag (or ``timeout``) on the running loop; return whether it is set."""
        event = asyncio.Event()
        with _WAITERS:
            if self._set:
                return True
            if self._waiters is None:
                self._waiters = []
            loop = asyncio.get_running_loop()
            self._waiters.append((loop, event))
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:  # a waiter that stopped waiting leaves no entry behind
            with _WAITERS:
                if self._waiters is not None and (waiter := (loop, event)) in self._waiters:
                    self._waiters.remove(waiter)
        return self._set


_WAITERS = threading.Lock()
"""Orders a waiter's registration against its flag's raising: one lock for every flag
(held for a few attribute writes; a lock per flag would cost every turn)."""


class _Running:
    """One session's registered turn: its flag, and where it is in its life."""

    __slots__ = ("flag", "started", "stop_asked", "stop_asked_at", "stopped_by", "turn_id")

    def __init__(self, flag: StopFlag, started: float, turn_id: str | None) -> None:
        self.flag = flag
        self.turn_id = turn_id
        """The turn's own id (its first row's, a cron run's, a social event's): what a
        stop asked from another process names."""
        self.started: float | None = started
        """When it started; None once judged (settling: past stopping and the timeout)."""
        self.stop_asked = False
        self.stop_asked_at: float | None = None
        self.stopped_by: str | None = None


class RunningTurns:
    """Thread-safe map of session id -> its running turn (stop flag, start, stop request).

    One record per turn (a turn begins, settles and ends with one dictionary operation
    each, under a plain lock entered in C: every turn takes it three times)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        """Waited on by :meth:`begin` for a session's turn to end."""
        self._beginning = 0
        """Threads in :meth:`begin` waiting for a session's turn to end (rare: a cron or
        social turn meeting an inbox turn), so ending a turn notifies only when needed."""
        self._awaiting: dict[str, list[tuple[asyncio.AbstractEventLoop,
                                             asyncio.Future[None]]]] = {}
        """Coroutines in :meth:`begin_async` waiting for a session's turn to end."""
        self._turns: dict[str, _Running] = {}
        self._closed = False
        """The runtime is stopping: :meth:`begin` waits for no turn any more."""

    def close(self) -> None:
        """The runtime is stopping: a :meth:`begin` waiting for a session's turn gives up,
        and none waits from now on (that turn may never end: a brain deaf to the stop
        would keep the waiting thread, one the interpreter joins at exit, for good)."""
        with self._lock:
            self._closed = True
            self._ended.notify_all()
            awaiting = [w for waiters in self._awaiting.values() for w in waiters]
            self._awaiting.clear()
        for loop, ended in awaiting:
            _wake_soon(loop, ended)

    def begin(self, session_id: str, clock: Callable[[], float],
              turn_id: str | None = None) -> tuple[StopFlag, float] | None:
        """Register the turn ``turn_id`` of ``session_id`` once the session's running turn
        ended, blocking this thread meanwhile; its stop flag and its start on ``clock``
        (read once the wait is over: a turn's timeout does not count its wait; read
        outside the board's lock, which every turn takes: a database's clock may wait).
        None, registering nothing, when the board closed while the session's turn ran."""
        while True:
            with self._lock:
                self._beginning += 1
                try:
                    self._ended.wait_for(lambda: session_id not in self._turns
                                         or self._closed)
                finally:
                    self._beginning -= 1
                if session_id in self._turns:  # closed: stop waiting
                    return None
            started = clock()
            with self._lock:
                if session_id not in self._turns:  # else another turn came first: wait again
                    return self._register(session_id, started, turn_id), started

    async def begin_async(self, session_id: str, clock: Callable[[], float],
                          turn_id: str | None = None) -> tuple[StopFlag, float] | None:
        """:meth:`begin` for the event loop: the wait holds no thread (a worker the loop's
        turns need for their tool calls, say, while the turn waited for needs one too)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                free = session_id not in self._turns
                if not free and self._closed:
                    return None
                if not free:
                    ended: asyncio.Future[None] = loop.create_future()
                    waiter = (loop, ended)
                    self._awaiting.setdefault(session_id, []).append(waiter)
            if free:
                started = clock()
                with self._lock:
                    if session_id not in self._turns:
                        return self._register(session_id, started, turn_id), started
                continue
            try:
                await ended
            finally:  # cancelled: leave no entry behind
                with self._lock:
                    waiters = self._awaiting.get(session_id)
                    if waiters is not None and waiter in waiters:
                        waiters.remove(waiter)
                        if not waiters:
                            del self._awaiting[session_id]

    def try_begin(self, session_id: str, now: float = 0.0, turn_id: str | None = None
                  ) -> StopFlag | None:
        """:meth:`begin` if no turn of ``session_id`` runs now, else None (never waits: for
        the event loop, which must not block on another turn)."""
        with self._lock:
            return (None if session_id in self._turns
                    else self._register(session_id, now, turn_id))

    def _register(self, session_id: str, now: float, turn_id: str | None) -> StopFlag:
        flag = StopFlag()
        self._turns[session_id] = _Running(flag, now, turn_id)
        return flag

    def settle(self, session_id: str) -> str | None:
        """The turn is judged and its commit on its way: it stays the session's turn until
        :meth:`end`, but is past stopping. Who stopped it (None if nobody did)."""
        with self._lock:
            turn = self._turns.get(session_id)
            if turn is None:
                return None
            turn.started = None
            return turn.stopped_by

    def end(self, session_id: str, flag: StopFlag | None = None) -> str | None:
        """Unregister the turn (with ``flag``: only if it is still the turn of that flag, so
        a late second end never ends a later turn); return who stopped it (None if nobody
        did)."""
        with self._lock:
            turn = self._turns.get(session_id)
            if turn is None or (flag is not None and turn.flag is not flag):
                return None
            del self._turns[session_id]
            if self._beginning:
                self._ended.notify_all()
            awaiting = self._awaiting.pop(session_id, None) if self._awaiting else None
            stopped_by = turn.stopped_by
        for loop, ended in awaiting or ():
            _wake_soon(loop, ended)
        return stopped_by

    def stop_overdue(self, now: float, timeout: float | None) -> list[str]:
        """Ask every turn running past ``timeout`` to stop; the sessions asked. Each by its
        turn's id: one that ended since it was listed may have its session's next turn
        running by then, which is not past its timeout."""
        with self._lock:
            late = [(sid, turn.turn_id) for sid, turn in self._turns.items()
                    if turn.started is not None and not turn.stop_asked
                    and overdue(turn.started, now, timeout)]
        return [sid for sid, turn_id in late if self.request_stop(sid, TIMEOUT, now, turn_id)]

    def ignoring_stop(self, now: float, grace: float) -> list[str]:
        """Sessions whose turn was asked to stop more than ``grace`` seconds ago, still
        running (listed at every tick: the async host cancels each brain once)."""
        with self._lock:
            return sorted(sid for sid, turn in self._turns.items()
                          if turn.started is not None and turn.stop_asked_at is not None
                          and now - turn.stop_asked_at > grace)

    def stop_asked(self, session_id: str) -> bool:
        """True while the running turn of ``session_id`` was asked to stop (a turn that
        started since the ask was not)."""
        with self._lock:
            turn = self._turns.get(session_id)
            return turn is not None and turn.stop_asked

    def stopped_by(self, session_id: str) -> str | None:
        """Who asked the running turn of ``session_id`` to stop, if anyone."""
        with self._lock:
            turn = self._turns.get(session_id)
            return None if turn is None else turn.stopped_by

    def turn_id(self, session_id: str) -> str | None:
        """The id of the turn of ``session_id`` registered now (None: none, or one
        registered without an id)."""
        with self._lock:
            turn = self._turns.get(session_id)
            return None if turn is None else turn.turn_id

    def is_running(self, session_id: str) -> bool:
        """True while a turn of ``session_id`` runs in this runtime."""
        with self._lock:
            return session_id in self._turns

    def request_stop(self, session_id: str, by: str | None, now: float | None = None,
                     turn_id: str | None = None) -> bool:
        """Set the stop flag of the running turn (only if it is ``turn_id``, when given);
        False when none runs."""
        with self._lock:
            turn = self._turns.get(session_id)
            if turn is None or turn.started is None:  # none, or judged: past stopping
                return False
            if turn_id is not None and turn.turn_id != turn_id:
                return False  # another turn of the session: the one asked for is not here
            turn.stop_asked = True
            if turn.stopped_by is None or (
                    turn.stopped_by in (TIMEOUT, RUNTIME_STOP) and by != RUNTIME_STOP):
                # A caller's stop stays named: a runtime stopping meanwhile must not turn
                # it into a failed attempt, retried (turn_run.judge). Nor does the runtime's
                # stop rename a turn past its timeout: handed back uncounted, a message that
                # always times out would run at every start for ever.
                turn.stopped_by = by
            if now is not None and turn.stop_asked_at is None:
                turn.stop_asked_at = now
            flag = turn.flag
            flag.by = turn.stopped_by
        flag.set()
        return True

    def running(self) -> list[str]:
        """Ids of the sessions whose turn runs now (judged ones waiting for their commit
        included)."""
        with self._lock:
            return sorted(self._turns)


def _wake_soon(loop: asyncio.AbstractEventLoop, ended: asyncio.Future[None]) -> None:
    """Wake a :meth:`RunningTurns.begin_async` waiting on ``loop`` (any thread)."""
    call_soon(loop, _wake, ended)


def _wake(ended: asyncio.Future[None]) -> None:
    if not ended.done():  # not cancelled meanwhile
        ended.set_result(None)
