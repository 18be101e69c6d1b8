"""Which runtime's code the caller runs in: what a stop called from a turn needs.

A brain (or a tool it calls, a thread it hands work to with ``asyncio.to_thread``), an
observer (often on a turn's thread, or the event loop) or a channel adapter's send, that
calls ``rt.stop()`` on its own runtime cannot be waited for by that stop: the stop waits
for the running turns (and sends) to end, and this one ends only once the call returns.
The runtime marks the context its brains, observers and sends run in (a context variable:
the thread of a sync brain, the task of an async one and what it copies its context to),
and :meth:`.runtime.Runtime.stop` asks :func:`in_a_turn_of` before it waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_RUNTIME: ContextVar[object | None] = ContextVar("kinbox_brain_of", default=None)


@contextmanager
def brain_of(runtime: object) -> Iterator[None]:
    """Run the body as ``runtime``'s own code (its context: ``RuntimeContext``)."""
    token = _RUNTIME.set(runtime)
    try:
        yield
    finally:
        _RUNTIME.reset(token)


def in_a_turn_of(runtime: object) -> bool:
    """Is the caller ``runtime``'s own code (a brain, an observer, a channel send, or code
    they called)?"""
    return _RUNTIME.get() is runtime
