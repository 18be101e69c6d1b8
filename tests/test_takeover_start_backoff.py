"""A taken-over row whose start the database keeps refusing backs off; it does not spin.

A row taken over from a dead worker records its turn's start before its brain runs. When
that write fails in the database but the release after it succeeds, the row went back
due, still suspect, and the run's end asked for a claim: the claim took it again at
once, its start failed again, and so on at full speed (a core busy, an error logged a
thousand times a second) for as long as the database refused that write, with nothing
counted toward the row's limit. A refused start is a failed attempt, as a refused commit
is: it waits out its backoff, and a start that can never be recorded ends ``failed``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import DatabaseFailed, NewMessage, Reply
from kinbox.persistence.inbox_claims import InboxClaims

from .conftest import Stores
from .helpers import of_kind, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_takeover_whose_start_keeps_being_refused_waits_out_a_backoff(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    prepared = Stores(db_url)
    j = prepared.journal
    j.enqueue(NewMessage("poison?", "s0", "poison?"), 1)
    assert [r.message_id for r in j.claim("dead-worker", 1, lease=5).rows] == ["poison?"]
    j.mark_turn_started("dead-worker", "poison?", 1)  # it died mid-turn: a takeover
    prepared.close()

    real = InboxClaims.submit_turn_started
    refusing = [True]
    refused: list[str] = []

    def refuse(self: InboxClaims, owner: str, message_id: str, now: float) -> Reply[Any]:
        if refusing[0]:
            refused.append(message_id)
            reply: Reply[None] = Reply()
            reply.set_exception(DatabaseFailed("disk I/O error"))
            return reply
        return real(self, owner, message_id, now)

    monkeypatch.setattr(InboxClaims, "submit_turn_started", refuse)
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        ran.extend(m.content for m in turn.messages)

    chosen = of_kind(kind, brain)
    # The injected clock never moves on its own: a backoff never runs out by itself.
    rt = Runtime(db=db_url, brain=chosen, clock=clock, lease_seconds=3600).start()
    try:
        wait_for(lambda: bool(refused), 20, what="the first refused start")
        # Idle until the clock moves: the row waits out a backoff, not claimed again.
        rt.run_until_idle(20)
        assert len(refused) == 1, f"claimed and refused {len(refused)} times on a still clock"
        row = rt.inbox(target="s0")[0]
        assert row["status"] == "pending" and row["available_at"] > clock.now()
        assert ran == []
        refusing[0] = False
        clock.advance(row["available_at"] - clock.now() + 1)
        wait_for(lambda: ran == ["poison?"], 20, what="the row to run once its backoff ended")
        rt.run_until_idle(20)
        assert rt.inbox(target="s0")[0]["status"] == "delivered"
    finally:
        rt.stop()


def test_a_takeover_whose_start_can_never_be_recorded_ends_failed(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = Stores(db_url)
    j = prepared.journal
    j.enqueue(NewMessage("poison?", "s0", "poison?", max_attempts=3), 1)
    assert [r.message_id for r in j.claim("dead-worker", 1, lease=5).rows] == ["poison?"]
    j.mark_turn_started("dead-worker", "poison?", 1)
    prepared.close()

    def refuse(self: InboxClaims, owner: str, message_id: str, now: float) -> Reply[Any]:
        reply: Reply[None] = Reply()
        reply.set_exception(DatabaseFailed("CHECK constraint failed"))
        return reply

    monkeypatch.setattr(InboxClaims, "submit_turn_started", refuse)
    rt = Runtime(db=db_url, brain=lambda turn: None, clock=clock, lease_seconds=3600).start()
    try:
        for _ in range(10):
            rt.run_until_idle(20)
            row = rt.inbox(target="s0")[0]
            if row["status"] == "failed":
                break
            clock.advance(max(0.0, row["available_at"] - clock.now()) + 1)
        assert row["status"] == "failed"
        assert row["attempts"] == 3
    finally:
        rt.stop()


def test_a_sub_agent_whose_start_can_never_be_recorded_wakes_its_parent(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's row fails with no turn run (no outbox hook hears of it): its parent is
    told as of a child row a claim failed, not left waiting on a task that never ends."""
    child_running = threading.Event()
    release = threading.Event()
    heard: list[str] = []

    async def brain(turn: Turn) -> None:
        message = turn.messages[0]
        if turn.session_id.startswith("subagent-"):
            child_running.set()
            await asyncio.to_thread(release.wait, 60)
        elif message.kind == "subagent_result":
            heard.append(message.content)
        else:
            await turn.tools.agent(description="clean up")

    first = Runtime(db=db_url, brain=brain, clock=clock, lease_seconds=3600).start()
    project = first.create_project("team")
    parent = first.create_session(project.id, "A").id
    first.post(parent, "delegate")
    assert child_running.wait(30)
    first.crash()  # the child's turn dies with its process
    release.set()

    def refuse(self: InboxClaims, owner: str, message_id: str, now: float) -> Reply[Any]:
        reply: Reply[None] = Reply()
        reply.set_exception(DatabaseFailed("CHECK constraint failed"))
        return reply

    monkeypatch.setattr(InboxClaims, "submit_turn_started", refuse)
    rt = Runtime(db=db_url, brain=brain, clock=clock, lease_seconds=3600).start()
    try:
        for _ in range(20):
            rt.run_until_idle(20)
            child = [r for r in rt.inbox() if r["target_chat_id"].startswith("subagent-")]
            if child[0]["status"] == "failed":
                break
            clock.advance(max(0.0, child[0]["available_at"] - clock.now()) + 1)
        assert child[0]["status"] == "failed"
        wait_for(lambda: bool(heard), 20, what="the parent to hear of its child's end")
        assert "failed" in heard[0]
    finally:
        rt.stop()
