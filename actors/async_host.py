"""The event loop async brains run on, and its bridge to the runtime's threads.

A runtime whose brain is ``async def`` owns one asyncio loop on one thread.
A session actor that receives a claimed row hands it here and frees its
pool thread at once; the turn then holds no thread while it awaits a model,
so thousands can wait at the same time. The steps that touch the journal
(starting the turn, committing it, recording a failed attempt) are the
session actor's own, so the rules of a turn live in one place for sync and
async brains alike. The writing ones are generators
(:data:`.steps.Step`): a pool thread waits for each write, the loop
submits it and awaits the writer's answer, so the loop never waits for a
commit (only the turn that asked does) and no thread is held meanwhile. What
may block otherwise (a turn hook's work, recording a failed attempt, tool
calls) runs on a small pool of blocking workers. Nothing waits for another
turn on one: a row whose session runs a cron or social turn awaits its end,
since that turn's tool calls may need every worker. The outbox hooks run on
the loop with the commit, none writing or waiting for a commit; those that
must read to know the turn's effects (a sub-agent's report to its parent, a
social thread's reply route) hand that read back as work, which runs on a
blocking worker (:data:`.context.OutboxHook`).

Per session nothing changes: the slot table still keeps one row in flight
per target (the slot frees from here when the turn and its chained
successors are done), leases are renewed while the turn runs, and a
target's rows run in order.

Stopping: ``agent_stop`` raises the turn's flag (``await turn.stopped()``
wakes). A turn still running ``stop_grace`` seconds after a stop request is
cancelled: when it was stopped by a caller, what it had replied is
committed as the stopped turn (as a sync turn that returns on the flag),
even past ``turn_timeout``; when the timeout stopped it, the attempt fails
(``TurnCancelled``). A brain that swallows the cancel too is given up on
``stop_grace`` seconds later: its turn ends as a cancelled one without it
(its later replies and tool calls are refused), so its row and session are
not held for good. Either way the row has exactly one outcome. A graceful
stop of the runtime asks every turn to stop and cancels, past the same grace, the
brains that ignore it, those of cron and social turns too: their turns commit what
they said as stopped by the runtime, and one that said nothing yet (a model call
outlasting the grace) is handed back, to run at the next start. A direct turn's
driven on this loop (a cron run, a social event: :meth:`BrainTasks.drive_direct`) is
cancelled with it as an inbox turn is, and gets :class:`BrainAbandoned` on a thread of
its own: it commits nothing and gives its session's mark back. A brain that never
awaits (a CPU loop, a blocking call) holds the loop, where no cancel reaches it: the
runtime's tick finds the loop stalled and says whose brain holds it
(:meth:`AsyncHost.watch`), and a stop lets go of the direct turns waiting on it. Only
the runtime ends the loop: a brain's ``loop.stop()``, or a KeyboardInterrupt or SystemExit
of a task it spawned, is logged and the loop runs on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ..persistence import ClaimedRow, WriterClosed
from . import delivery as dp
from .async_tools import AsyncTools
from .brain_tasks import BrainTasks, build_tools, tools_unread
from .daemon_pool import DaemonPool, daemon_default_executor
from .loop_errors import log_by_type
from .loop_steps import settle
from .loop_watch import LoopWatch
from .session_actor import SessionActor
from .turn_run import hook_work

if TYPE_CHECKING:
    from .context import RuntimeContext

log = logging.getLogger("kinbox.async")

T = TypeVar("T")


COMMIT_AFTER_CANCEL = 2.0
"""Seconds a stopping runtime leaves the turns whose brains it cancelled to commit, when its
stop's timeout is already spent."""
LAST_CANCELS = 2.0
"""Seconds the stop's drain waits for the turns it cancelled whole to end."""
STOP_SLACK = COMMIT_AFTER_CANCEL + LAST_CANCELS + 1.0
"""Seconds past its timeout a stop waits, in all, for the drain and the loop's end: a free
loop's drain ends by then; a loop a brain holds never runs it, so waiting longer only
delays the process's exit."""
LOOP_END_WAIT = 0.5
"""Seconds the stop always gives the loop to end once asked, its slack spent or not."""


class AsyncHost(BrainTasks):
    """One event loop thread for async turns, and the blocking workers they use."""

    def __init__(self, ctx: RuntimeContext, workers: int) -> None:
        self.ctx = ctx
        self.loop = asyncio.new_event_loop()
        # Daemon threads: a tool call waiting on a database that stopped answering, or what
        # a brain hands to a thread (asyncio.to_thread: the loop's default executor, a model
        # SDK's call deaf to the stop that gave up on its turn), holds no exit.
        self.executor = DaemonPool(workers, "kinbox-blocking")
        daemon_default_executor(self.loop, "kinbox-brain-thread")
        log_by_type(self.loop, "async brains'")
        self._thread = threading.Thread(target=self._run, name="kinbox-async", daemon=True)
        # The brains' state (:class:`.brain_tasks.BrainTasks` says what each holds).
        self._brains = {}
        self._owners = weakref.WeakKeyDictionary()
        self.loop.set_task_factory(self._new_task)
        self._cancelled = weakref.WeakKeyDictionary()
        self._gave_up = {}
        self._direct = set()
        self._waiting = set()
        self._ended = False
        self._ending = False
        """The runtime asked the loop to end (:meth:`stop`, :meth:`crash`): its
        ``run_forever`` returning is the end, not a ``loop.stop()`` of a brain's."""
        self._drivers = set()
        self._watch = LoopWatch(self.loop, ctx.stop_grace, self._holder)
        self._draining: concurrent.futures.Future[None] | None = None
        self._stop_by = 0.0
        """When a stop's wait for running turns ends (:meth:`begin_stop`), on the loop's
        clock."""
        self._lock = threading.Lock()
        self.running = 0
        self.peak_running = 0

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            while True:
                try:
                    self.loop.run_forever()
                    if self._ending:
                        return  # stopped: by stop() or crash()
                    # Code on it called ``loop.stop()`` (a brain, a library it uses): the
                    # loop's end would leave every async turn, this one's and the next
                    # ones', ``processing`` for good. Only the runtime ends it.
                    log.error("code on the async brains' loop stopped it (loop.stop()); "
                              "the loop goes on")
                except (SystemExit, KeyboardInterrupt) as exc:
                    # A task a brain spawned raised it: asyncio lets it out of the loop,
                    # which would end every async turn this runtime runs. The brain's own
                    # task turns it into that turn's failure; a stray task's is logged,
                    # and the loop goes on.
                    log.error("a task on the async brains' loop raised %s; the loop goes on",
                              type(exc).__name__)
        finally:
            self._let_go()
            self._end_tasks()

    def _end_tasks(self) -> None:
        """The loop has ended (a stop, a crash, or once a brain that held it let go after a
        stop gave up on it): cancel every task still on it, a turn's driver, a direct
        turn's, a brain, and run the loop until they have ended (at most
        :data:`LAST_CANCELS`), then close it. Left pending, each was destroyed so when
        collected ("Task was destroyed but it is pending!"), its clean-up never run.
        On the loop's thread."""
        loop = self.loop
        try:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            if left:
                _, deaf = loop.run_until_complete(asyncio.wait(left, timeout=LAST_CANCELS))
                if deaf:
                    log.error("%d task(s) of async turns ignored their cancel as the loop "
                              "ended: they never end", len(deaf))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        except Exception:
            log.exception("ending the tasks left on the async brains' loop failed")

    def _let_go(self) -> None:
        """The loop has ended (or never will): a brain on it never ends now, and the
        threads of direct turns awaiting one would wait for good (and keep the process
        from exiting). They get :class:`BrainAbandoned`; the direct turns driven on it
        stop counting as in flight."""
        with self._lock:
            self._ended = True
            waiting, self._waiting = self._waiting, set()
        for future in waiting:
            future.cancel()

    def begin_stop(self, timeout: float = 10.0) -> None:
        """Start the stop's wait for running turns (they were asked to stop; any thread):
        the brains of direct turns run here too, and the runtime waits for those turns
        before it calls :meth:`stop`, so the brains ignoring the stop are cancelled past
        the grace meanwhile."""
        if self._thread.is_alive() and self._draining is None:
            self._stop_by = self.loop.time() + timeout  # the loop's clock: monotonic
            self._draining = self._submit(lambda: self._drain(self._stop_by))

    def stop(self, timeout: float = 10.0) -> None:
        """Let running turns finish (they were asked to stop), cancel the rest, end the loop.
        A brain that never awaits holding the loop keeps it ``timeout`` +
        :data:`STOP_SLACK` + :data:`LOOP_END_WAIT` seconds after the stop began
        (:meth:`begin_stop`), no longer; turns that began during the stop may add one more
        :data:`STOP_SLACK` to let the brains it cancels commit."""
        if not self._thread.is_alive():
            return
        self.begin_stop(timeout)
        assert self._draining is not None
        give_up = self._stop_by + STOP_SLACK  # the loop's clock: monotonic, any thread

        def left() -> float:
            return max(0.0, give_up - self.loop.time())
        waits = [self._draining]
        try:
            self._draining.result(left())
            # And the turns that started since (a row handed over as the stop began, which
            # hands it back), by the same deadline; a drain that starts past it still
            # gives the brains it cancels their time to commit.
            waits.append(self._submit(lambda: self._drain(self._stop_by)))
            waits[-1].result(max(left(), STOP_SLACK))
        except Exception:
            log.warning("async turns did not finish in time; their rows come back by lease")
            for wait in waits:  # a loop held meanwhile builds neither when it gets free
                wait.cancel()
        self._ending = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(max(left(), LOOP_END_WAIT))
        if self._thread.is_alive():
            log.error("the event loop of async brains did not end: %s; the turns on it "
                      "never commit here, their rows come back by lease", self._holder())
            self._let_go()
        else:
            self.loop.close()  # its selector's sockets, not left to the garbage collector
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _submit(self, make: Callable[[], Coroutine[Any, Any, T]]
                ) -> concurrent.futures.Future[T]:
        """Run the coroutine ``make`` builds as a task on the loop (from any thread); its
        outcome, as ``asyncio.run_coroutine_threadsafe`` gives it (cancelling the future
        cancels the task). Built on the loop, not here: a loop that ends before it gets
        to it (a stop racing the loop's end) leaves no coroutine never awaited behind,
        only a future its waiter's timeout, or :meth:`_let_go`, ends."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def start() -> None:
            if future.cancelled():
                return
            task = self.loop.create_task(make())
            task.add_done_callback(functools.partial(_copy_outcome, future))
            future.add_done_callback(
                lambda f: self.loop.call_soon_threadsafe(task.cancel)
                if f.cancelled() and not self.loop.is_closed() else None)
        self.loop.call_soon_threadsafe(start)
        return future

    def on_loop(self) -> bool:
        """Is the caller running on the loop's thread (where a blocking wait holds every
        async turn)?"""
        return threading.current_thread() is self._thread

    def watch(self) -> None:
        """At every tick (any thread): is the loop held by code that never awaits? Logged
        once per stall, naming the session whose brain holds it (:mod:`.loop_watch`)."""
        self._watch.tick()

    async def _drain(self, deadline: float) -> None:
        """Every running turn was asked to stop. The ticker that cancels a brain past
        its grace has stopped: a brain still running ``stop_grace`` seconds in (or at
        ``deadline``, on the loop's clock) is cancelled here, an inbox turn's or a
        direct turn's, so its turn commits as stopped by the runtime, as one stopped by
        a caller does (or, having said nothing yet, hands its row back:
        ``TurnCutShort``). Only a turn that still has not ended by ``deadline`` (its
        commit held up, say) is cancelled whole: its row comes back by lease (a direct
        turn's thread is let go with :class:`BrainAbandoned`)."""
        running = self._drivers | self._direct
        if not running:
            return
        _, late = await asyncio.wait(
            running, timeout=max(0.0, min(deadline - self.loop.time(), self.ctx.stop_grace)))
        if late:
            # Whether or not a brain is cancelled now (one may be committing, or cleaning
            # up after an earlier cancel), every late turn has until the stop's timeout.
            self._cancel_brains(list(self._brains))
            _, late = await asyncio.wait(
                late, timeout=max(deadline - self.loop.time(), COMMIT_AFTER_CANCEL))
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=LAST_CANCELS)

    def crash(self) -> None:
        """Abandon every turn as a kill would: cancel, commit nothing, end the loop."""
        if not self._thread.is_alive():
            return

        def cancel_all() -> None:
            for task in [*self._drivers, *self._direct]:
                task.cancel()
            self.loop.call_later(0.05, self.loop.stop)
        self._ending = True
        self.loop.call_soon_threadsafe(cancel_all)
        if not self.on_loop():  # a brain that crashed its runtime: the loop ends after it
            self._thread.join(5)
        self.executor.shutdown(wait=False, cancel_futures=True)

    # -- bridges ---------------------------------------------------------------------------

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking ``fn`` (a tool call, a hook's work) on a worker; suspend only the
        caller."""
        return await self.loop.run_in_executor(self.executor,
                                               functools.partial(fn, *args, **kwargs))

    def tools(self, sync_tools: Any) -> AsyncTools:
        """The awaitable view of a session's tools."""
        return AsyncTools(sync_tools, self)

    def start_turns(self, actor: SessionActor, row: ClaimedRow) -> None:
        """Run ``row``'s turn (and the session's next due rows) on the loop (any thread)."""
        self.loop.call_soon_threadsafe(self._spawn, actor, row)

    def _spawn(self, actor: SessionActor, row: ClaimedRow) -> None:
        task = self.loop.create_task(self._drive(actor, row))
        self._drivers.add(task)
        task.add_done_callback(self._drivers.discard)

    # -- a session's turns -----------------------------------------------------------------

    async def _drive(self, actor: SessionActor, row: ClaimedRow) -> None:
        """The session's delivery run (:mod:`.delivery`) on the loop. The turn's start and
        commit are submitted here and awaited (the writer answers through a callback: no
        thread waits), the brain is awaited; only what may block runs on a blocking
        worker: a turn hook's work, recording a failed attempt, a release."""
        run = actor.new_run()
        effects = run.claimed(row)
        try:
            while effects:
                effect = effects.pop(0)
                if isinstance(effect, dp.StartTurn):
                    effects[:0] = await settle(
                        self.loop, self.blocking,
                        actor.start_turn(run, effect.row, effect.record_start))
                elif isinstance(effect, dp.RunBrain):
                    effects[:0] = actor.brain_ended(run, await self._turn(actor))
                elif isinstance(effect, dp.Commit):
                    effects[:0] = await settle(self.loop, self.blocking,
                                                 actor.commit(run, effect))
                elif isinstance(effect, dp.Done):
                    actor.apply(run, effect)
                else:
                    effects[:0] = await self.blocking(actor.apply, run, effect)
        except WriterClosed:
            pass  # stopped or crashed under us: the journal keeps the row
        except asyncio.CancelledError:
            pass  # the runtime crashed or gave up waiting: the row comes back by lease
        except Exception:
            log.exception("an async turn of %s failed outside its brain", actor.session_id)
        finally:
            if not actor.told_done:
                actor.done(True)

    async def _turn(self, actor: SessionActor) -> BaseException | None:
        """The hooks' work, then the brain: the error the attempt ends with, or None."""
        turn = actor.turn
        assert turn is not None
        turn.on_event_loop(self.blocking, self.on_loop)
        try:
            for work in hook_work(self.ctx, turn):
                await self.blocking(work)
            if tools_unread(self.ctx, turn):
                await self.blocking(build_tools, turn)
            error = await self._run_brain(turn)
        except Exception as exc:
            error = exc
        if turn.close_steering(wait=False) is None:  # a fetch in flight: wait, off the loop
            await self.blocking(turn.close_steering)
        return error

    def statistics(self) -> dict[str, int]:
        """Running and peak async turns."""
        with self._lock:
            return {"async_turns": self.running, "peak_async_turns": self.peak_running}



def _copy_outcome(future: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    """Hand a task's outcome to the thread waiting on ``future`` (see ``_submit``); a
    future cancelled meanwhile keeps its cancellation."""
    try:
        if task.cancelled():
            future.cancel()
        elif (error := task.exception()) is not None:
            future.set_exception(error)
        else:
            future.set_result(task.result())
    except concurrent.futures.InvalidStateError:
        pass  # cancelled by its waiter
