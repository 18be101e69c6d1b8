"""A session actor's writing steps, carried out on the event loop of async brains.

A step (:data:`.steps.Step`) is a generator that yields each write it needs and
gets the write's outcome back: a pool thread waits for it; here the write is submitted
and awaited, the writer thread answering through a callback, so neither the loop nor a
thread waits for a commit. A :class:`~.steps.Blocking` request (waiting out
another turn of the session) runs on a blocking worker. A step cancelled during its write
(the runtime stopped and gave up waiting) still finishes on a thread of its own: the
write may commit, and what follows it (observers, after-commit notifications, the
session's slot) must not be lost with the turn.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..persistence import WRITE_TIMEOUT, Reply, WriterClosed
from .loop_calls import call_soon
from .steps import Blocking, Steps, settle_from

log = logging.getLogger("kinbox.async")

T = TypeVar("T")

Blocker = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a blocking call on a worker thread and awaits it (:meth:`.AsyncHost.blocking`)."""


async def settle(loop: asyncio.AbstractEventLoop, blocking: Blocker, step: Steps[T],
                 on_cancel: Callable[[], Exception] | None = None) -> T:
    """Carry out a step (:data:`.steps.Steps`) on the loop: each write is
    submitted here and awaited, the writer thread answering through a callback; a
    :class:`Blocking` request runs on a blocking worker.

    Cancelled while a write is in flight (the runtime stops and gave up waiting), the
    write still commits: the rest of the step (its observers, its after-commit
    notifications, such as a social reply's send) then runs on a thread of its own.
    Cancelled during a :class:`Blocking` request, the step is closed; or, given
    ``on_cancel``, that error is thrown into it, its clean-up running on a thread of its
    own (a direct turn gives back its session's mark, which writes)."""
    try:
        pending = next(step)
        while True:
            try:
                if isinstance(pending, Blocking):
                    value = await (pending.on_loop() if pending.on_loop is not None
                                   else blocking(pending.work))
                else:
                    value = await _answer(loop, pending)
            except asyncio.CancelledError:
                _detach(step, pending, on_cancel)
                raise
            except Exception as exc:
                pending = step.throw(exc)
            else:
                pending = step.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _answer(loop: asyncio.AbstractEventLoop, reply: Reply[T]) -> asyncio.Future[T]:
    """A future the writer settles (from its thread) once ``reply`` is answered, or that
    fails with :class:`WriteTimeout` after :data:`WRITE_TIMEOUT`, as a blocking wait
    would."""
    future: asyncio.Future[T] = loop.create_future()
    timer = loop.call_later(WRITE_TIMEOUT, _time_out, future, reply)

    def answered() -> None:  # on the writer thread
        call_soon(loop, _settle_future, future, reply, timer)
    reply.add_done_callback(answered)
    return future


def _detach(step: Steps[Any], pending: Reply[Any] | Blocking,
            on_cancel: Callable[[], Exception] | None) -> None:
    if isinstance(pending, Blocking) and on_cancel is None:
        # Nothing was written; the row comes back by lease. (A start waiting for
        # another turn of its session is awaited, so cancelling it registers nothing.)
        step.close()
        return
    # A thread of its own, not a blocking worker: the stop that cancelled the turn
    # shuts the workers down next, dropping what they have not started, and the
    # commit's follow-ups (observers, after-commit notifications, the session's
    # slot) would go with it. Rare: only a turn given up on during its write.
    thrown = on_cancel() if isinstance(pending, Blocking) and on_cancel else None
    threading.Thread(target=_finish, args=(step, pending, thrown), name="kinbox-finish",
                     daemon=True).start()


def _settle_future(future: asyncio.Future[T], reply: Reply[T],
                   timer: asyncio.TimerHandle) -> None:
    timer.cancel()
    if future.done():  # cancelled with its turn, or timed out
        return
    try:
        future.set_result(reply.outcome())
    except Exception as exc:
        future.set_exception(exc)


def _time_out(future: asyncio.Future[Any], reply: Reply[Any]) -> None:
    if not future.done():
        future.set_exception(reply.withdraw(WRITE_TIMEOUT))


def _finish(step: Steps[Any], pending: Reply[Any] | Blocking,
            thrown: Exception | None) -> None:
    """The rest of a step whose turn was cancelled during its write, or during a
    :class:`Blocking` request with ``thrown`` (on a thread of its own: see
    :func:`_detach`)."""
    try:
        settle_from(step, pending if thrown is None else step.throw(thrown))
    except StopIteration:
        pass  # it ended on the error thrown in
    except WriterClosed:
        pass  # the runtime crashed before the commit: nothing of it is durable
    except Exception:
        log.exception("finishing a cancelled turn's commit failed; its row is durable as "
                      "committed or comes back by lease")
