"""Channel adapters: how a social reply leaves for its platform, with retries.

The product registers one adapter per platform
(``rt.social.register_channel("slack", send=post_to_slack)``); kinbox calls
``send(reply_route, text)`` once the turn that produced the reply has
committed, so a reply is sent only if it is in the transcript. ``send`` may
be a plain function or a coroutine function. A failing send is tried again
after each of ``retry_delays``; whatever happens, the outcome (sent, or why
not) is recorded, and a channel that stays down loses nothing: the reply is
in the transcript.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kinbox.social")

Send = Callable[[Mapping[str, Any], str], Any]
"""``send(reply_route, text)``: deliver a reply; raise to have it retried."""

DEFAULT_RETRY_DELAYS: tuple[float, ...] = (1.0, 2.0, 4.0)
"""Seconds to wait before each retry of a failed send (so four attempts in all)."""


@dataclass(frozen=True)
class DeliveryOutcome:
    """What happened to one reply."""

    status: str
    """``sent``, ``failed`` (every attempt raised), ``no_channel`` or ``no_reply``."""
    attempts: int
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON."""
        return {"status": self.status, "attempts": self.attempts, "error": self.error}


def call_send(send: Send, route: Mapping[str, Any], text: str) -> None:
    """Call a sync or async ``send`` to completion on the calling (worker) thread."""
    result = send(route, text)
    if inspect.isawaitable(result):
        async def wait() -> Any:
            return await result
        asyncio.run(wait())


def deliver(send: Send | None, route: Mapping[str, Any], text: str, *,
            retry_delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS,
            wait: Callable[[float], object]) -> DeliveryOutcome:
    """Send ``text`` through ``send``, retrying after each delay; never raises.

    ``wait(seconds)`` is how the caller pauses between attempts (it returns
    early when the runtime stops).
    """
    if not text:
        return DeliveryOutcome("no_reply", 0)
    if send is None:
        return DeliveryOutcome("no_channel", 0, "no channel adapter is registered")
    error = None
    for attempt, delay in enumerate((0.0, *retry_delays), start=1):
        if delay and wait(delay):
            return DeliveryOutcome("failed", attempt - 1, f"stopped before retrying: {error}")
        try:
            call_send(send, route, text)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("channel send attempt %d failed: %s", attempt, error)
            continue
        return DeliveryOutcome("sent", attempt)
    return DeliveryOutcome("failed", 1 + len(retry_delays), error)
