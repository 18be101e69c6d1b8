"""The async brains on the host's loop: awaiting one, cancelling one, giving up on one.

A mixin of :class:`~.async_host.AsyncHost`, which owns the loop, its life cycle and the
state declared here. What a brain's outcome means for its turn lives here: a brain
cancelled because its turn was stopped by a caller commits what it said; one cancelled
by the turn timeout, or given up on after swallowing its cancel, fails the attempt
(:class:`TurnCancelled`); one the runtime's stop cancelled commits what it said, or, when
it said nothing, is handed back (:class:`TurnCutShort`); a direct turn whose loop ended
(or whose stop gave up on it) gets :class:`BrainAbandoned` and commits nothing. A direct
turn (a cron run, a social event) and its caller's work are driven here too
(:meth:`drive_direct`), awaiting the brain as an inbox turn does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..persistence import WriterClosed
from .brain_scope import brain_of
from .loop_steps import settle
from .running import TIMEOUT
from .steps import Steps
from .turn import Turn
from .turn_run import TurnCutShort, cut_short, take_result

if TYPE_CHECKING:
    from .context import RuntimeContext

log = logging.getLogger("kinbox.async")

T = TypeVar("T")


class TurnCancelled(Exception):
    """An async turn ignored its stop past the grace period and was cancelled."""


class BrainAbandoned(WriterClosed):
    """The event loop ended (the runtime crashed, or its stop gave up waiting), or the
    runtime's stop cut the brain short (:class:`TurnCutShort`), before the async brain of
    a direct turn ended: nothing of that turn commits (a :class:`WriterClosed`: what ends a
    direct turn's work when the runtime stops; its run is taken over at the next start)."""


class BrainTasks:
    """The brains running on the loop, by session (state set up by ``AsyncHost``)."""

    ctx: RuntimeContext
    loop: asyncio.AbstractEventLoop
    _lock: threading.Lock
    _brains: dict[str, asyncio.Task[BaseException | None]]  # loop thread only
    _owners: weakref.WeakKeyDictionary[asyncio.Task[Any], str]
    """The session whose brain each task on the loop runs for: a brain's own task, and
    every task it (or a framework's run inside it) spawned (written on the loop thread
    only, by :meth:`_new_task`; read by :meth:`_holder` from any)."""
    _cancelled: weakref.WeakKeyDictionary[asyncio.Task[BaseException | None], float]
    """Brains :meth:`cancel` cancelled, and when, on the runtime's clock (loop thread
    only)."""
    _gave_up: dict[str, asyncio.Future[None]]  # loop thread only
    """Per running brain: set when its turn ends without it (:meth:`_cancel_brains`)."""
    _direct: set[asyncio.Task[BaseException | None]]  # loop thread only
    """The brains direct turns (cron, social) await from their threads."""
    _waiting: set[concurrent.futures.Future[Any]]
    """What those threads wait on, and the direct turns driven on the loop (under
    ``_lock``): let go when the loop ends."""
    _drivers: set[asyncio.Task[Any]]  # loop thread only
    """The tasks driving turns: inbox turns' and direct turns' (:meth:`drive_direct`)."""
    _ended: bool  # under _lock
    running: int
    peak_running: int

    if TYPE_CHECKING:
        def _submit(self, make: Callable[[], Coroutine[Any, Any, T]]
                    ) -> concurrent.futures.Future[T]: ...

        def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any
                     ) -> Awaitable[T]: ...

        def on_loop(self) -> bool: ...

    def _holder(self) -> str:
        """Who holds the loop now, as far as can be told from another thread."""
        task = asyncio.current_task(self.loop)
        sid = self._owners.get(task) if task is not None else None
        if sid is not None:
            return f"the async brain of {sid} never awaits"
        return "a task on it never awaits" if task is not None else "it is blocked"

    def _new_task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                  context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        """The loop's task factory: a task spawned by a brain's (an agent framework's run,
        a model client's request, ``asyncio.gather``) belongs to that brain's session, so
        a stall in it names the session (:meth:`_holder`), as a stall of the brain's own
        task does."""
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
        parent = asyncio.current_task(loop)
        sid = self._owners.get(parent) if parent is not None else None
        if sid is not None:
            self._owners[task] = sid
        return task

    def cancel(self, session_ids: list[str]) -> None:
        """Cancel the brains of these sessions' running turns (any thread)."""
        self.loop.call_soon_threadsafe(self._cancel_brains, session_ids)

    def _cancel_brains(self, session_ids: list[str]) -> None:
        """Cancel the running brains of these sessions, each once (loop thread); a brain
        still running ``stop_grace`` seconds after its cancel is given up on."""
        now = self.ctx.now()
        for sid in session_ids:
            task = self._brains.get(sid)
            # Only a brain whose turn was asked to stop: the one listed may have ended
            # since, and its session's next turn started, before this ran on the loop.
            if task is None or task.done() or not self.ctx.turns.stop_asked(sid):
                continue
            cancelled_at = self._cancelled.get(task)
            if cancelled_at is None:
                # Once per brain: its clean-up (an ``except CancelledError`` that awaits)
                # must not be cancelled again by the next tick's list.
                log.warning("cancelling the async turn of %s: it ignored its stop", sid)
                self._cancelled[task] = now
                task.cancel()
            elif now - cancelled_at >= self.ctx.stop_grace:
                # It swallowed the cancel (a bare ``except:`` in a retry loop, 3.11's
                # ``wait_for`` race): waiting on would hold its row and session for good.
                # The turn ends as a cancelled one; what the brain does after is refused.
                gave_up = self._gave_up.get(sid)
                if gave_up is not None and not gave_up.done():
                    log.warning("the async turn of %s ignored its cancel too: it ends "
                                "without its brain", sid)
                    gave_up.set_result(None)

    async def _run_brain(self, turn: Turn) -> BaseException | None:
        """Await the brain; the error the attempt ends with, or None to commit."""
        sid = turn.session_id
        task: asyncio.Task[BaseException | None] = self.loop.create_task(self._call(turn))
        self._owners[task] = sid  # before it first runs: what it spawns is the session's
        self._brains[sid] = task
        gave_up = self._gave_up[sid] = self.loop.create_future()
        with self._lock:
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)
        try:
            # Cancelling the brain must not cancel this driver.
            await asyncio.wait({task, gave_up}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()  # the driver is cancelled (stop, crash): the brain goes with it
            raise
        finally:
            self._brains.pop(sid, None)
            self._gave_up.pop(sid, None)
            with self._lock:
                self.running -= 1
        abandoned = not task.done()
        own = None if abandoned or task.cancelled() else task.result()
        if abandoned or task.cancelled() or isinstance(own, asyncio.CancelledError):
            by = self.ctx.turns.stopped_by(sid)
            if by is None and own is not None:
                return own  # the brain's own CancelledError, and nobody stopped it: its error
            # A brain obeying a stop often cancels its model call and lets that propagate:
            # a stop all the same.
            if by == TIMEOUT or by is None:
                return TurnCancelled("the turn ignored its stop past the grace period and "
                                     "was cancelled" + (" (turn_timeout)" if by else ""))
            # Stopped by a caller (or the runtime's stop after it replied): commit what it
            # said, as a stopped turn.
            return cut_short(turn)
        return own

    async def _call(self, turn: Turn) -> BaseException | None:
        """Await the brain; what it raised, the attempt's error. A KeyboardInterrupt or
        SystemExit must not leave the task: asyncio re-raises those out of the loop, which
        would end every async turn of the runtime with it."""
        try:
            with brain_of(self.ctx):
                take_result(turn, await self.ctx.brain(turn))  # type: ignore[misc]
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # cancelled from outside: a stop past its grace, a timeout, a crash
            return exc  # the brain's own CancelledError: its attempt failed, nobody stopped it
        except BaseException as exc:
            return exc
        return None

    def run_brain_blocking(self, turn: Turn) -> BaseException | None:
        """Run an async brain on ``turn`` from another thread (a cron or social turn) and
        wait for it; the error the attempt ends with, or None to commit.
        :class:`BrainAbandoned` once the loop ended (or ends) before the brain did, or
        the runtime's stop cut it short."""
        turn.on_event_loop(self.blocking, self.on_loop)
        if tools_unread(self.ctx, turn):  # read here, on the turn's thread
            build_tools(turn)
        with self._lock:  # the loop's end lets go of every wait registered before it
            if self._ended:
                raise BrainAbandoned(f"the runtime's event loop has ended: the turn of "
                                     f"{turn.session_id} did not run")
            future = self._submit(lambda: self._run_direct(turn))
            self._waiting.add(future)
        try:
            error = future.result()
        except concurrent.futures.CancelledError:
            raise BrainAbandoned(f"the runtime stopped before the async brain of "
                                 f"{turn.session_id} ended: nothing of its turn "
                                 "commits") from None
        finally:
            with self._lock:
                self._waiting.discard(future)
        return _direct_outcome(error)

    async def await_direct_brain(self, turn: Turn) -> BaseException | None:
        """:meth:`run_brain_blocking` for a direct turn the loop drives
        (:meth:`drive_direct`): awaited, holding no thread."""
        turn.on_event_loop(self.blocking, self.on_loop)
        if tools_unread(self.ctx, turn):  # a read: not on the loop
            await self.blocking(build_tools, turn)
        return _direct_outcome(await self._run_brain(turn))

    def drive_direct(self, make: Callable[[], Steps[Any]]
                     ) -> concurrent.futures.Future[Any] | None:
        """Carry out the steps of a direct turn (and its caller's work) that ``make``
        builds on the loop (any thread); their outcome, or None once the loop has ended.
        A stop waits for them and a crash cancels them as it does the inbox turns'
        (:meth:`AsyncHost._drain`); cancelled, they end on a thread of their own as when
        their loop ended (:class:`BrainAbandoned`), giving back the session's mark."""
        with self._lock:  # the loop's end lets go of every drive registered before it
            if self._ended:
                return None
            try:
                future = self._submit(lambda: self._drive_direct(make))
            except RuntimeError:  # the loop is closed
                return None
            self._waiting.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._waiting.discard(future)

    async def _drive_direct(self, make: Callable[[], Steps[Any]]) -> Any:
        task = asyncio.current_task()
        assert task is not None
        self._drivers.add(task)
        try:
            return await settle(self.loop, self.blocking, make(), on_cancel=_abandoned)
        except WriterClosed:
            return None  # the runtime stopped or crashed: the tables keep the state
        except Exception:
            log.exception("a direct turn's work failed")
            return None
        finally:
            self._drivers.discard(task)

    async def _run_direct(self, turn: Turn) -> BaseException | None:
        """:meth:`_run_brain` for a direct turn, which a stop waits for (:meth:`_drain`)."""
        task = asyncio.current_task()
        assert task is not None
        self._direct.add(task)
        try:
            return await self._run_brain(turn)
        finally:
            self._direct.discard(task)


def _direct_outcome(error: BaseException | None) -> BaseException | None:
    """A direct turn's brain's outcome: a turn the runtime's stop cut short commits nothing
    (:class:`BrainAbandoned`; its run or event waits for the next start)."""
    if isinstance(error, TurnCutShort):
        raise BrainAbandoned(str(error)) from error
    return error


def _abandoned() -> BrainAbandoned:
    return BrainAbandoned("the runtime stopped before the direct turn ended: nothing of it "
                          "commits")


def tools_unread(ctx: RuntimeContext, turn: Turn) -> bool:
    """Is ``turn`` its session's first in this runtime, whose tools read which it holds
    (``RuntimeContext.tool_classes``)? That read must not run on the loop."""
    return turn.session_id not in ctx.tool_classes


def build_tools(turn: Turn) -> None:
    """Build the turn's tools where blocking is allowed (see :func:`tools_unread`): on
    the loop the read would hold up every other turn."""
    _ = turn.tools
