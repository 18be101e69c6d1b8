"""Progress of a scenario run: a live line on a terminal, plain lines elsewhere.

The live line counts what the runtime's events show: messages seen (sent,
or delivered by a turn: some are enqueued by the runtime itself, a Focal
notice or a sub-agent's result, and only show up when delivered), messages
delivered, failed attempts and crashes. The final line takes its numbers
from the report, which reads them from the journal, so they add up.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, TextIO

SPINNER = "|/-\\"


class Progress:
    """Counts messages, deliveries and failures as runtime events arrive."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.seen: set[str] = set()
        self.delivered: set[str] = set()
        self.failed_attempts = 0
        self.crashes = 0
        self._lock = threading.Lock()
        self._ticks = 0

    def event(self, event: str, data: dict[str, Any]) -> None:
        """Observer hook: update counts and the display."""
        with self._lock:
            if event == "sent":
                self.seen.add(str(data["message_id"]))
            elif event == "turn_committed":
                ids = [str(i) for i in data.get("message_ids", ())]
                self.seen.update(ids)
                self.delivered.update(ids)  # a set: a replay after a crash counts once
            elif event == "turn_failed":
                self.seen.add(str(data["message_id"]))
                self.failed_attempts += 1
            elif event in ("peer_retry", "peer_failed"):  # a send to a device failed
                self.failed_attempts += 1
            elif event == "crashed":
                self.crashes += 1
            self._ticks += 1
            line = self._line(len(self.seen), len(self.delivered), self.failed_attempts)
            if self.tty:
                self.stream.write(f"\r{SPINNER[self._ticks % 4]} {line}\x1b[K")
                self.stream.flush()
            elif event in ("crashed", "started"):
                self.stream.write(f"[{event}] {line}\n")

    def _line(self, messages: int, delivered: int, failed: int) -> str:
        return (f"messages: {messages}  delivered: {delivered}  failed attempts: {failed}  "
                f"crashes: {self.crashes}")

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Finish the display with a final line, from the report's ``summary`` when given."""
        with self._lock:
            if summary is not None:
                line = self._line(summary["messages"], summary["states"].get("delivered", 0),
                                  summary["failed_attempts"])
            else:
                line = self._line(len(self.seen), len(self.delivered), self.failed_attempts)
            self.stream.write(f"\rdone  {line}\x1b[K\n" if self.tty else f"done  {line}\n")
            self.stream.flush()
