"""What kinbox's event loops log of an exception nothing handled.

Code on the async brains' loop and on the channel adapters' loop is the product's: a
task a brain spawned and never awaited, a callback it scheduled. asyncio's own handler
logs such an exception at ERROR with its text and the callback's arguments, which may
quote a message's body or a model's answer. Here the line above DEBUG names the loop and
the exception's type; the whole context (asyncio's message, the traceback) is at DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("kinbox.loop")


def log_by_type(loop: asyncio.AbstractEventLoop, name: str) -> None:
    """Have ``loop`` (named ``name`` in the lines) log unhandled exceptions as above."""

    def handler(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        kind = type(error).__name__ if error is not None else "no exception"
        log.error("an exception nothing handled on the %s loop: %s", name, kind)
        log.debug("on the %s loop: %s", name, context.get("message", ""),
                  exc_info=error if isinstance(error, BaseException) else None)

    loop.set_exception_handler(handler)
