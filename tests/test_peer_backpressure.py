"""A receiving link reads a peer no faster than it commits what it read.

A sender keeps at most its window (and a prefetch as large) unacknowledged; a peer that
ignores it must not make the receiver hold every frame it sends. Over a real socket the
kernel's buffers (and the link's compression) hide whether the receiver still reads, so
this drives the endpoint's session with an in-memory websocket that counts what was
taken from it, and a backend whose commit waits on a gate, as a held database would.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from kinbox.transport import frames as f
from kinbox.transport import inbound_link, receiver
from kinbox.transport.grants import GrantView

from .helpers import wait_for

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

    def commit(self, device_id: str, token_hash: str,
               commits: Sequence[receiver.Commit]) -> list[str | None]:
        assert self.gate.wait(30)
        self.committed += len(commits)
        return [None] * len(commits)

    def grant_status(self, device_id: str, token_hash: str) -> str:
        return "active"

    def now(self) -> float:
        return 0.0


def test_a_peer_ignoring_the_window_is_read_no_faster_than_the_receiver_commits() -> None:
    count = 5 * inbound_link.UNCOMMITTED_LIMIT
    loop = asyncio.new_event_loop()  # the server's loop, on a thread of its own
    serving = threading.Thread(target=loop.run_forever, daemon=True)
    serving.start()
    try:
        ws, db = Socket(count), HeldDatabase()
        grant = GrantView("dev", "key", "hash", frozenset({"agent"}), "active")
        session = inbound_link.InboundLink(ws, db, grant, lambda reason: f.Refused(reason.value))  # type: ignore[arg-type]
        link = asyncio.run_coroutine_threadsafe(session.run(), loop)
        # The reader stops once the uncommitted deliveries fill their queue; without a
        # bound it would take every frame while nothing commits.
        wait_for(lambda: session.commits.full() or ws.taken == count, 20,
                 "the reader to stop, or to have read every frame")
        taken = ws.taken
        db.gate.set()

        def acks_sent() -> int:  # a batch's acks leave on the loop after its commit
            return sum(isinstance(f.parse(t), f.Ack) for t in list(ws.sent))

        wait_for(lambda: acks_sent() == count, 20, "every delivery committed and acknowledged")
        acks = acks_sent()
        asyncio.run_coroutine_threadsafe(ws.close(), loop).result(10)
        link.result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        serving.join(10)
        loop.close()
    # At most a full queue, the batch the committer holds (taken before it filled) and
    # the one the reader waits to queue.
    assert taken <= 2 * inbound_link.UNCOMMITTED_LIMIT + 1
    assert db.committed == acks == count


class FailingAnswers(HeldDatabase):
    """A backend whose answer to a read fails unexpectedly (a bug, a driver's error)."""

    def answer(self, device_id: str, token_hash: str, action: str) -> tuple[str, str]:
        raise ValueError("the backend broke")


def test_a_link_ended_by_an_unexpected_error_says_so_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    """An error of the backend's other than a closed grant or a refusal ended the link
    (the sender saw it close) with nothing in the log: the link's tasks' errors were
    gathered and dropped."""
    ws, db = Socket(0), FailingAnswers()
    ws.frames = [f.encode(f.Read("r1"))]
    grant = GrantView("dev", "key", "hash", frozenset({"agent"}), "active")
    session = inbound_link.InboundLink(ws, db, grant, lambda reason: f.Refused(reason.value))  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="kinbox.peers"):
        asyncio.run(asyncio.wait_for(session.run(), 20))
    assert [r.getMessage() for r in caplog.records] == [
        "the link from dev ended on an error (ValueError)"]
