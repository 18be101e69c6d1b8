"""Progress of a scenario run: a live line on a terminal, plain lines elsewhere."""

from __future__ import annotations

import threading
from typing import Any, TextIO

SPINNER = "|/-\\"


class Progress:
    """Counts sends, deliveries and failures as runtime events arrive."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.counts = {"sent": 0, "delivered": 0, "failed attempts": 0, "crashes": 0}
        self._lock = threading.Lock()
        self._ticks = 0

    def event(self, event: str, data: dict[str, Any]) -> None:
        """Observer hook: update counts and the display."""
        with self._lock:
            if event == "sent" and data.get("created", True):
                self.counts["sent"] += 1
            elif event == "turn_committed":
                self.counts["delivered"] += len(data.get("message_ids", ()))
            elif event == "turn_failed":
                self.counts["failed attempts"] += 1
            elif event == "crashed":
                self.counts["crashes"] += 1
            self._ticks += 1
            line = self._line()
            if self.tty:
                self.stream.write(f"\r{SPINNER[self._ticks % 4]} {line}\x1b[K")
                self.stream.flush()
            elif event in ("crashed", "started"):
                self.stream.write(f"[{event}] {line}\n")

    def _line(self) -> str:
        return "  ".join(f"{k}: {v}" for k, v in self.counts.items())

    def close(self) -> None:
        """Finish the display with a final line."""
        with self._lock:
            prefix = "\r" if self.tty else ""
            self.stream.write(f"{prefix}done  {self._line()}\x1b[K\n" if self.tty
                              else f"done  {self._line()}\n")
            self.stream.flush()
