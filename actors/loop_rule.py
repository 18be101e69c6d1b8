"""The one rule for the sync Turn and tool API on the event loop of async brains (B1).

Every ``async def`` brain of a runtime runs on one event loop thread: a call made there
that reads or writes the database, or waits (``turn.request`` before it was awaited,
``turn.steering()``, ``turn.take()``, ``turn.wait_stop_requested()``, a sync tool through
``turn.tools.sync``), holds that thread, and with it every other async turn, until it
returns. Such a call is refused there with :class:`RuntimeStateError`
(``state == "event_loop"``), naming its awaitable twin; anywhere else (a sync brain's
thread, a worker an async brain hands work to) it runs as it always did.

Pure: whether the caller is on the loop is asked of ``on_loop``, the async host's.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import EVENT_LOOP, RuntimeStateError


def refuse_on_loop(on_loop: Callable[[], bool] | None, call: str, instead: str) -> None:
    """Raise :class:`RuntimeStateError` (``state="event_loop"``) when ``on_loop()`` says
    the caller is on the event loop of async brains (None: there is none, a sync turn).
    ``call`` names what was called, ``instead`` what an async brain uses."""
    if on_loop is not None and on_loop():
        raise RuntimeStateError(f"{call} blocks (it reads or writes the database, or "
                                f"waits), which would hold the event loop and every async "
                                f"turn on it: use `{instead}` in an async brain",
                                state=EVENT_LOOP)
