"""A bounded pool of daemon threads with the ``Executor`` interface.

``concurrent.futures.ThreadPoolExecutor``'s workers are not daemons, and the interpreter
joins them at exit: a turn whose brain does not hear its stop (a long model call) held
the process after the runtime's stop had given up on it and the command had said it
stopped. Like every other kinbox thread these are daemons; the journal, not the thread,
keeps what a turn that never ended had not committed.

It is a ``ThreadPoolExecutor`` by type only, so that an event loop takes it as its default
executor (asyncio refuses any other): none of the stdlib pool's threads or queue is used.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(ThreadPoolExecutor):
    """At most ``workers`` daemon threads, started as work arrives, running it in order."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(workers, name)  # its state only: its submit and shutdown are ours
        self._workers = workers
        self._name = name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)``; RuntimeError once shut down (as the stdlib's)."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            future: Future[Any] = Future()
            self._queue.put((future, fn, args, kwargs))
            if self._idle:  # a thread waiting for work takes it
                self._idle -= 1
            elif len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}_{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:
                    future.set_exception(exc)
            # Not held while the thread waits for its next work: what the work referenced
            # (a finished turn) is freed now, by reference counting.
            del item, future, fn, args, kwargs
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more work; ``cancel_futures`` cancels what has not started; ``wait``
        joins the threads (a running piece of work first ends)."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()


LOOP_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Threads of an event loop's default executor: asyncio's default pool's size."""


def daemon_default_executor(loop: asyncio.AbstractEventLoop, name: str) -> None:
    """Give ``loop`` a default executor of daemon threads (:data:`LOOP_THREADS`): what code
    on it hands to a thread (``asyncio.to_thread``, ``run_in_executor(None, ...)``: a model
    SDK's or a platform SDK's blocking call) holds no exit. The stock one's threads are
    joined at exit, for as long as the call runs, after the stop that gave up on it."""
    loop.set_default_executor(DaemonPool(LOOP_THREADS, name))
