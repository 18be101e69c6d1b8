"""A write's answer, handed from the group-commit writer to whoever waits for it.

One lock per answer, released when the writer sets it: under load every message waits for
two of these. Event-loop code registers a callback instead, run on the writer thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .errors import WriteTimeout

T = TypeVar("T")

log = logging.getLogger("kinbox.writer")

_CALLBACKS = threading.Lock()
"""Orders a callback's registration against its reply's answer: one lock for all replies,
held for two attribute writes (a lock per reply would cost every send)."""


def _run_callback(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # a waiter's bug must not stop the writer or lose the batch's answers
        log.exception("a writer reply's callback failed")


class Reply(Generic[T]):
    """The answer to one operation, handed over once its batch has committed.

    A lock held until the answer is set: under load every message waits for
    two of these, and a lock costs a fraction of a ``Future``'s condition.
    Event-loop code does not wait on the lock: it registers a callback
    (:meth:`add_done_callback`), run on the writer thread once the answer is in.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_set", "_taken", "_value", "conflicts")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._value: Any = None
        self._error: BaseException | None = None
        self._set = False
        self._callbacks: list[Callable[[], None]] | None = None
        self._taken: bool | None = None
        """None while queued; True once a batch took the operation; False once its waiter
        withdrew it (it timed out first): the writer then never runs it."""
        self.conflicts = 0
        """How many times a deadlock or a serialization failure undid the operation (the
        writer's, which runs it again up to ``CONFLICT_RETRIES`` times)."""

    def take(self) -> bool:
        """The writer starts the operation: False when its waiter withdrew it already."""
        with _CALLBACKS:
            if self._taken is None:
                self._taken = True
            return self._taken

    def withdraw(self, timeout: float | None) -> WriteTimeout:
        """The waiter gives up: the error to raise (the operation is withdrawn unless a
        batch took it first)."""
        with _CALLBACKS:
            if self._taken is None:
                self._taken = False
            return WriteTimeout(timeout, withdrawn=not self._taken)

    def set_result(self, value: T) -> None:
        """Hand over the result (once)."""
        self._value = value
        self._settle()

    def set_exception(self, error: BaseException) -> None:
        """Hand over the error (once)."""
        self._error = error
        self._settle()

    def _settle(self) -> None:
        with _CALLBACKS:
            self._set = True
            callbacks, self._callbacks = self._callbacks, None
        self._done.release()
        for callback in callbacks or ():
            _run_callback(callback)

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the answer is in: at once if it is, else on the writer
        thread right after the commit, in the order of registration. It must be quick and
        must neither block nor write (the writer waits for it)."""
        with _CALLBACKS:
            if not self._set:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        _run_callback(callback)

    def done(self) -> bool:
        """Is the answer in? (A look that gives nothing up: :meth:`result` with a timeout
        withdraws a write still queued when the wait ends.)"""
        return self._set

    def outcome(self) -> T:
        """The answer of a settled reply (raise the operation's error)."""
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def result(self, timeout: float | None = None) -> T:
        """Wait for the answer; raise the operation's error, or :class:`WriteTimeout`."""
        # Positional: a keyword makes the lock parse its arguments (twice a message).
        if not self._done.acquire(True, -1 if timeout is None else timeout):
            late = self.withdraw(timeout)
            if not self._done.acquire(False):  # not answered since the wait ended either
                raise late
        self._done.release()  # so that a later result() sees the answer too
        if self._error is not None:  # outcome(), inline: every send and turn waits here
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def landed(self, timeout: float) -> T:
        """:meth:`result`, waiting on past ``timeout`` while a batch has the write (it may
        land yet: :func:`wait_on`); :class:`WriteTimeout` only for a write withdrawn
        still queued, which never runs. For a write whose outcome must be known: taken as
        failed, one that then committed left rows leased, or a mark set, that nothing
        ran or took back."""
        while True:
            try:
                return self.result(timeout)
            except WriteTimeout as late:
                wait_on(late)


def wait_on(late: WriteTimeout) -> None:
    """After ``late``: raise it when the write was withdrawn (it never runs); otherwise
    say that the write is slow, for the caller to wait on."""
    if late.withdrawn:
        raise late
    log.warning("a write is slow (its batch runs past %s s); waiting for its outcome",
                late.timeout)
