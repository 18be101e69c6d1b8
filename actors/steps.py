"""Steps: the session actor's effects that write or may wait, written once for both hosts.

A step is a generator: it yields the writer's reply of each write it makes (or a
:class:`Blocking` request), is resumed with the answer (or has the error thrown in), and
returns the delivery protocol's answer. A pool thread carries it out waiting for each
commit (:func:`settle`); the event loop of async brains awaits each instead
(:mod:`.loop_steps`). So the rules of a turn's start, commit and failure record live in
one place (:mod:`.session_actor`) for sync and async brains alike. A write whose batch
outran its wait is waited for until it lands or fails (:func:`landed`), never taken as
refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..persistence import WRITE_TIMEOUT, Reply, WriteTimeout
from ..persistence.reply import wait_on
from . import delivery as dp

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Blocking:
    """A step's request to run ``work`` where blocking is allowed (this pool thread; a
    blocking worker for the event loop), resuming it with the result. A wait that may last
    (for another turn of the session) also says how to await it: ``on_loop``, which the
    event loop awaits instead, holding no worker."""

    work: Callable[[], Any]
    on_loop: Callable[[], Awaitable[Any]] | None = None


Steps = Generator[Reply[Any] | Blocking, Any, T]
"""Work that writes or may wait, returning a ``T``: it yields the writer's reply of each
write (or a :class:`Blocking` request) and is resumed with the answer (or has the error
thrown in). A direct turn (:mod:`.direct_turn`) is one too."""

Step = Steps[list[dp.Effect]]
"""An effect that writes or may wait: :data:`Steps` returning the protocol's answer."""


def settle(step: Steps[T]) -> T:
    """Carry out a step on this thread, waiting for each commit."""
    try:
        return settle_from(step, next(step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def settle_from(step: Steps[T], pending: Reply[Any] | Blocking) -> T:
    """Go on with ``step`` from its ``pending`` request on this thread."""
    try:
        while True:
            try:
                value = (pending.work() if isinstance(pending, Blocking)
                         else pending.result(WRITE_TIMEOUT))
            except Exception as exc:
                pending = step.throw(exc)
            else:
                pending = step.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def landed(reply: Reply[T]) -> Generator[Reply[T], Any, T]:
    """Wait for the outcome of ``reply`` (within a :data:`Step`): its answer, or its error.

    A write that timed out is refused only when it was withdrawn (still queued: it never
    runs). One a batch had taken (:class:`WriteTimeout`, not ``withdrawn``) may land
    yet, so the wait goes on: taken as refused, a turn's commit that then landed left
    the row it chained into leased to a run that had ended (nothing ran or renewed it
    until its lease ran out, and then only as a suspect), gave back the rate-limit
    tokens of its sends and dropped its after-commit notifications. The wait costs
    nothing a write after it would not: that write queues behind the same batch."""
    while True:
        try:
            return (yield reply)  # type: ignore[no-any-return]
        except WriteTimeout as late:
            wait_on(late)


def wait_landed(reply: Reply[T]) -> T:
    """:func:`landed` on this thread."""
    return reply.landed(WRITE_TIMEOUT)
