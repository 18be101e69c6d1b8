"""The command line's log lines on the operator's terminal: text that came from outside
(a brain's exception, a peer's refusal, a chat user's name, a file) cannot steer it.

What kinbox logs quotes such text: "turn of ... failed: <the brain's exception>". An
escape sequence in it would reach the terminal as a command (colours, a cleared screen, a
rewritten title) and a line break would forge a log line of its own. The formatter the
command line installs shows every unprintable character of a line's message as a
``\\x..`` escape, as the CLI's own output does (:func:`..transport.frames.shown`); a
traceback keeps its line breaks, and loses everything else unprintable the same way.
"""

from __future__ import annotations

import logging
from types import TracebackType

from ..transport.frames import shown

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _escaped(text: str) -> str:
    return shown(text, len(text))


class TerminalFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose lines hold nothing a terminal acts on."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(record.__dict__)
        safe.message = _escaped(record.message)
        return super().formatMessage(safe)

    def formatException(self, ei: ExcInfo | tuple[None, None, None]) -> str:
        text = super().formatException(ei)  # type: ignore[arg-type]
        return "\n".join(_escaped(line) for line in text.split("\n"))

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(_escaped(line) for line in stack_info.split("\n"))
