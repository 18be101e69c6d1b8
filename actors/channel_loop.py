"""The one event loop a runtime's ``async def`` channel adapters run on.

An async adapter keeps what a platform's SDK keeps: a client (httpx's
``AsyncClient``, aiohttp's ``ClientSession``) whose pooled connections
belong to the loop that opened them. So every async send of a runtime runs on
one loop, for the runtime's life: a loop per send (``asyncio.run``) closed
the connection's loop after the first send, the next post went out and its
answer could not be read, and every retry posted again.

The loop is its own thread, started by the first async send (a runtime with
plain-function adapters never has it) and ended by :meth:`ChannelLoop.close`
at the runtime's stop or crash. Not the async brains' loop
(:mod:`.async_host`): a sync-brain runtime has none, an adapter that blocks
inside ``async def`` would hold every async turn there (and be blamed on a
brain by its stall watch), and that loop ends later in a stop than the sends
do.

A send still running ``timeout`` seconds in is cancelled on the loop, and
the caller's :class:`TimeoutError` comes only once the cancelled coroutine
has ended, so the retry that follows never runs beside it on the adapter's
connection. Its post may have gone out all the same: the retry may post it
again (at least once, as for a sync adapter whose HTTP client timed out).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

from .daemon_pool import daemon_default_executor
from .errors import RuntimeStateError
from .loop_errors import log_by_type

log = logging.getLogger("kinbox.social")

T = TypeVar("T")

CANCEL_GRACE = 5.0
"""Seconds a timed-out send is given to end once cancelled (it may clean up), and the close
gives the sends it cancels."""


class ChannelLoop:
    """One event loop thread for async channel sends (any thread may call :meth:`run`)."""

    def __init__(self, name: str = "kinbox-channels") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(self, awaitable: Awaitable[T], timeout: float) -> T:
        """Await ``awaitable`` on the loop; its result, or its error. :class:`TimeoutError`
        once a send still running ``timeout`` seconds in has been cancelled and ended (or
        did not end within :data:`CANCEL_GRACE` of it); :class:`.RuntimeStateError` once
        the loop is closed (the runtime stopped)."""
        # Scheduled under the lock a close takes first: a send is either on the loop
        # before the close's cancel-all (which then cancels it), or refused; never put on
        # a loop that is closed, or stopped and never to run again.
        with self._lock:
            loop = self._started()
            future = None if loop is None else asyncio.run_coroutine_threadsafe(
                _bounded(awaitable, timeout), loop)
        if future is None:
            _discard(awaitable)
            raise RuntimeStateError("the runtime stopped: its channel sends have ended",
                                    state="stopped")
        try:
            return future.result(timeout + CANCEL_GRACE)
        except concurrent.futures.TimeoutError:  # the builtin TimeoutError, since 3.11
            if future.done():
                raise  # the send's own: its time ran out on the loop, or the adapter's
            future.cancel()  # a send that swallowed its cancel: cancelled again
            raise TimeoutError(f"the send did not end within {timeout:g} s, nor "
                               f"{CANCEL_GRACE:g} s after it was cancelled") from None

    def _started(self) -> asyncio.AbstractEventLoop | None:
        """The running loop, started on first use; None once closed (under the lock)."""
        if self._closed:
            return None
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            # An adapter's blocking post handed to a thread holds no exit (as a brain's).
            daemon_default_executor(self._loop, "kinbox-channel-thread")
            log_by_type(self._loop, "channel adapters'")
            self._thread = threading.Thread(target=self._loop.run_forever,
                                            name=self._name, daemon=True)
            self._thread.start()
        return self._loop

    def close(self, timeout: float = CANCEL_GRACE) -> None:
        """Cancel the sends still running, give them ``timeout`` to end, end the loop and
        its thread (any thread; later sends are refused)."""
        with self._lock:
            closing, self._closed = not self._closed, True
            loop, thread = self._loop, self._thread
        if not closing or loop is None or thread is None:
            return  # closed before (or by another thread now), or never started
        if thread is threading.current_thread():
            # A send that crashed its runtime, on this loop: waiting here for the loop (or
            # joining its thread) waits for itself. The sends are cancelled and the loop
            # ends once this one returns to it.
            loop.create_task(_cancel_all(timeout)).add_done_callback(lambda _: loop.stop())
            return
        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(timeout), loop).result(timeout + 1)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass  # a loop held by a send that never awaits: the join says so
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            log.error("the channel sends' event loop did not end: a send holds it")
            return
        loop.close()  # its selector's sockets, not left to the garbage collector

    def running(self) -> bool:
        """Is the loop's thread alive?"""
        with self._lock:
            return self._thread is not None and self._thread.is_alive()


async def _bounded(awaitable: Awaitable[T], timeout: float) -> T:
    # The timeout cancels the send and waits for it to end before raising; whether it
    # expired tells its TimeoutError from one the adapter raised of its own.
    limit = asyncio.timeout(timeout)
    try:
        async with limit:
            return await awaitable
    except TimeoutError:
        if not limit.expired():
            raise
        raise TimeoutError(f"the send did not end within {timeout:g} s: cancelled") from None


async def _cancel_all(timeout: float) -> None:
    current = asyncio.current_task()
    sends = [task for task in asyncio.all_tasks() if task is not current]
    for task in sends:
        task.cancel()
    if sends:
        await asyncio.wait(sends, timeout=timeout)


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run (no "never awaited" warning)."""
    close = getattr(awaitable, "close", None)
    if asyncio.iscoroutine(awaitable) and callable(close):
        close()
