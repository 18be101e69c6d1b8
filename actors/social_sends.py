"""The replies of one social thread leave one after another, in the order of their turns
(SO1).

A social event's own turns send their replies in the chat's order (the chat's next turn
waits for them, :mod:`.social_chats`). The replies of a thread's inbox turns (an
``agent_send`` to the thread, events a stop handed over) and those held for a channel
registered later leave on the turn pool once their turn committed: each on a thread of
its own, a slow post of one let the next overtake it, and the thread read the answers
out of order. :class:`ThreadSends` lines them up per session: one runs at a time, the
next when it ended (sent, or failed for good). A social event's own turn sends on its
chat's thread, so that the chat's next turn waits for it, but in the same line: when the
line is idle it runs there and then, else it queues behind the thread's inbox replies
(sent beside the line, it overtook a slow one of them). A session's line is kept only
while it has sends, so memory holds what is in flight and nothing per thread ever seen.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger("kinbox.social")

Send = Callable[[], object]
"""One reply's send (it records its own outcome)."""
Run = Callable[[Callable[[], None]], object | None]
"""Where sends run (the turn pool's ``submit``): None once the runtime is stopping."""


class ThreadSends:
    """Per-session lines of reply sends, each drained on one thread of ``run``."""

    def __init__(self, stopped: Callable[[], bool]) -> None:
        """``stopped``: the runtime is stopping (what waits in a line then is not sent: the
        pool cancels the sends it has not begun, and a start sends them, being kept)."""
        self._stopped = stopped
        self._lock = threading.Lock()
        self._lines: dict[str, deque[Send]] = {}
        """The sends waiting behind the one running, by session (present while one runs)."""

    def submit(self, session_id: str, send: Send, run: Run, *, here: bool = False) -> None:
        """Send after the session's earlier sends; start its line when none runs. Refused
        (a stopping runtime), the reply stays kept, for the next start to send. ``here``:
        when none of the session's sends runs, this one runs on the calling thread (which
        waits for it), and the sends that queued behind it meanwhile go on ``run``; when
        one runs, it queues behind as any other (never waiting for a thread of ``run``,
        which may all be such callers)."""
        with self._lock:
            line = self._lines.get(session_id)
            if line is not None:
                line.append(send)
                return
            self._lines[session_id] = deque()
        if here:
            then = self._after(session_id, send)
            if then is None:
                return
            send = then
        if run(lambda: self._drain(session_id, send)) is None:
            with self._lock:
                self._lines.pop(session_id, None)

    def waiting(self) -> int:
        """How many sessions have a line (a send running)."""
        with self._lock:
            return len(self._lines)

    def _drain(self, session_id: str, send: Send) -> None:
        then: Send | None = send
        while then is not None:
            then = self._after(session_id, then)

    def _after(self, session_id: str, send: Send) -> Send | None:
        """Run the line's ``send``, then take its next one, or None when the line ends
        (empty, or the runtime stops: the rest stay kept)."""
        _attempt(session_id, send)
        with self._lock:
            line = self._lines[session_id]
            if not line or self._stopped():
                del self._lines[session_id]
                return None
            return line.popleft()


def _attempt(session_id: str, send: Send) -> None:
    """Run one send (it records its own outcome): the line goes on whatever it raises."""
    try:
        send()
    except Exception:
        log.exception("a social reply's send to %s failed", session_id)
