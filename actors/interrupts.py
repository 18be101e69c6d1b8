"""Ctrl-C and SIGTERM for the long-running commands: first stop gracefully, then at once.

The first SIGINT or SIGTERM raises :class:`Interrupted` in the main thread,
so the command unwinds through its ``finally`` blocks: the runtime stops
(running turns finish or hand their rows back) and the command prints what
was done. A second signal while that is under way exits the process at once
with status 130; nothing is lost, since the journal holds every row that
was not acknowledged. Handlers are installed only from the main thread and
restored on exit.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

EXIT_INTERRUPTED = 130
"""The exit status of a command stopped by a signal (128 + SIGINT)."""


class Interrupted(BaseException):  # like KeyboardInterrupt: no `except Exception` eats it
    """The first stop signal arrived; ``signum`` is which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def _say(text: str) -> None:
    sys.stderr.write(f"\nkinbox: {text}\n")
    sys.stderr.flush()


def exit_now(signum: int) -> None:
    """The second signal's default: say so and exit with :data:`EXIT_INTERRUPTED`."""
    _say(f"second {signal.Signals(signum).name}: stopping now; the journal keeps every "
         "unacknowledged message")
    os._exit(EXIT_INTERRUPTED)


class StopSignals:
    """A context manager: the first signal raises :class:`Interrupted`, the second exits."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_second: Callable[[int], None] = exit_now) -> None:
        self.on_second = on_second
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            self._first(signum)
        else:
            self.on_second(signum)

    def _first(self, signum: int) -> None:
        """The first signal: say so, and unwind the command."""
        _say(f"{signal.Signals(signum).name}: stopping gracefully (again to stop at once)")
        raise Interrupted(signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()


class StopBetweenSteps(StopSignals):
    """:class:`StopSignals` for a command that works in steps, each its own transaction
    (a prune's batches): the first signal raises nothing, it asks (:attr:`asked`) for a
    stop after the step under way, which the command checks between steps, so it can say
    what it did; the second exits at once."""

    def __init__(self, step: str, on_second: Callable[[int], None] = exit_now) -> None:
        super().__init__(on_second)
        self.step = step

    @property
    def asked(self) -> bool:
        """A stop signal arrived."""
        return bool(self.received)

    def _first(self, signum: int) -> None:
        _say(f"{signal.Signals(signum).name}: stopping after {self.step} (again to stop at "
             "once)")
