"""A receiving link reads a peer no faster than it commits what it read.

A sender keeps at most its window (and a prefetch as large) unacknowledged; a peer that
ignores it must not make the receiver hold every frame it sends. Over a real socket the
kernel's buffers (and the link's compression) hide whether the receiver still reads, so
this drives the endpoint's session with an in-memory websocket that counts what was
taken from it, and a backend whose commit waits on a gate, as a held database would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from kinbox.transport import frames as f
from kinbox.transport import peer_ws, receiver
from kinbox.transport.grants import GrantView

pytestmark = pytest.mark.timeout(60)


class Socket:
    """``count`` deliveries ready to read at once, then silence until closed."""

    def __init__(self, count: int) -> None:
        self.frames = [f.encode(f.Deliver(f"m{i}", f"body {i}", None)) for i in range(count)]
        self.taken = 0
        self.sent: list[str] = []
        self.closed = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.taken < len(self.frames):
            self.taken += 1
            return {"type": "websocket.receive", "text": self.frames[self.taken - 1]}
        await self.closed.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed.set()


class HeldDatabase:
    """Commits wait until ``gate`` opens; counts what they committed."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.committed = 0

    def commit(self, device_id: str, commits: Sequence[receiver.Commit]) -> list[str | None]:
        assert self.gate.wait(30)
        self.committed += len(commits)
        return [None] * len(commits)

    def grant_status(self, device_id: str) -> str:
        return "active"

    def now(self) -> float:
        return 0.0


async def until(condition: Callable[[], bool], timeout: float = 20) -> None:
    """Let the loop run (the link's tasks, the commit's thread) until ``condition``."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(poll(), timeout)


def test_a_peer_ignoring_the_window_is_read_no_faster_than_the_receiver_commits() -> None:
    count = 5 * peer_ws.UNCOMMITTED_LIMIT

    async def run() -> tuple[int, int, int]:
        ws, db = Socket(count), HeldDatabase()
        grant = GrantView("dev", "key", "hash", frozenset({"agent"}), "active")
        session = peer_ws._Session(ws, db, grant, lambda reason: f.Refused(reason.value))  # type: ignore[arg-type]
        link = asyncio.create_task(session.run())
        # The reader stops once the uncommitted deliveries fill their queue; without a
        # bound it would take every frame while nothing commits.
        await until(lambda: session.commits.full() or ws.taken == count)
        taken_while_held = ws.taken
        db.gate.set()
        await until(lambda: db.committed == count)
        acks = sum(isinstance(f.parse(t), f.Ack) for t in ws.sent)
        await ws.close()
        await asyncio.wait_for(link, 10)
        return taken_while_held, db.committed, acks

    taken, committed, acks = asyncio.run(run())
    # At most a full queue, the batch the committer holds (taken before it filled) and
    # the one the reader waits to queue.
    assert taken <= 2 * peer_ws.UNCOMMITTED_LIMIT + 1
    assert committed == acks == count
