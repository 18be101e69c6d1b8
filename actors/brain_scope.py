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

from contextvars import ContextVar, Token
from types import TracebackType

_RUNTIME: ContextVar[object | None] = ContextVar("kinbox_brain_of", default=None)


class brain_of:
    """Run the body as ``runtime``'s own code (its context: ``RuntimeContext``).

    A class, not a ``@contextmanager``: it wraps every turn's brain and every observer
    call, and a generator-based one costs several times more a use."""

    __slots__ = ("_runtime", "_token")

    def __init__(self, runtime: object) -> None:
        self._runtime = runtime
        self._token: Token[object | None] | None = None

    def __enter__(self) -> None:
        self._token = _RUNTIME.set(self._runtime)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        assert self._token is not None
        _RUNTIME.reset(self._token)


def in_a_turn_of(runtime: object) -> bool:
    """Is the caller ``runtime``'s own code (a brain, an observer, a channel send, or code
    they called)?"""
    return _RUNTIME.get() is runtime
