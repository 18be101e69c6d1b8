"""A write whose answer comes late: the caller acts on what the journal did, never on a guess.

Each test holds the writer so that a write is taken into a batch and then waits past the
caller's write timeout (shortened here); the batch commits afterwards. A write that
landed must count as written: its turn ran once, and the row it leased runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn, context, loop_steps, steps
from kinbox.persistence import GroupCommitWriter, WriteTimeout

from .helpers import SHORT, heard_slow_write, hold_next_batch, wait_for

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)

@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_commit_answered_after_the_timeout_counts_and_its_chained_row_runs(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch,
        kind: str) -> None:
    """m1's commit is taken by a batch that runs past the timeout, then commits, leasing
    m2 (chained). Taken as refused, m2 stayed leased to a run that had ended: nothing ran
    it until its lease ran out (never, on this clock) and then only as a suspect."""
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", SHORT)
    monkeypatch.setattr(loop_steps, "WRITE_TIMEOUT", SHORT)
    heard = heard_slow_write(monkeypatch)
    batch_done = threading.Event()
    seen: list[str] = []
    events: list[tuple[str, dict[str, Any]]] = []
    box: dict[str, Any] = {}

    def act(turn: Turn) -> None:
        mid = turn.messages[0].message_id
        seen.append(mid)
        if mid == "m1":
            box["rt"].post(turn.session_id, "two", message_id="m2")
            hold_next_batch(box["rt"].context.journal.writer, batch_done)

    def sync_brain(turn: Turn) -> None:
        act(turn)

    async def async_brain(turn: Turn) -> None:
        await asyncio.to_thread(act, turn)

    rt = make_runtime(brain=sync_brain if kind == "sync" else async_brain)
    box["rt"] = rt
    rt.subscribe(lambda event, data: events.append((event, data)))
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        rt.post(sid, "one", message_id="m1")
        assert heard.event.wait(20), "the commit never timed out"
        batch_done.set()  # the batch commits: m1's turn, and m2 leased to this runtime
        rt.run_until_idle(timeout=10)
    finally:
        batch_done.set()
    rows = {r["message_id"]: r for r in rt.inbox()}
    assert {m: r["status"] for m, r in rows.items()} == {"m1": "delivered", "m2": "delivered"}
    assert seen == ["m1", "m2"]  # each turn ran once
    assert not rows["m2"]["suspect"]
    committed = [d["message_ids"] for e, d in events if e == "turn_committed"]
    assert committed == [["m1"], ["m2"]]
    assert not [e for e, _ in events if e in ("turn_failed", "lease_lost")]


def test_a_send_answered_after_its_sender_gave_up_still_runs_the_turn_it_leased(
        make_runtime: MakeRuntime, clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The send's batch (the fast path: it leases its new row) runs past the sender's wait:
    the sender gets a WriteTimeout that says it may yet commit. It commits; the row it
    leased must run. Left leased to this runtime with nothing to run it, it waited out its
    lease (never, on this clock) and then ran as a suspect."""
    monkeypatch.setattr(context, "WRITE_TIMEOUT", SHORT)
    seen: list[str] = []
    sent: list[str] = []
    rt = make_runtime(brain=lambda turn: seen.append(turn.messages[0].message_id))
    rt.subscribe(lambda event, data: sent.append(data["message_id"]) if event == "sent"
                 else None)
    sid = rt.create_session(rt.create_project("p").id, "S").id
    writer = rt.context.journal.writer
    batch_done = threading.Event()
    hold_next_batch(writer, batch_done)  # the send below is the write it waits for
    try:
        with pytest.raises(WriteTimeout) as caught:
            rt.post(sid, "one", message_id="m1")
        assert not caught.value.withdrawn
    finally:
        batch_done.set()
    rt.run_until_idle(timeout=10)
    rows = {r["message_id"]: r for r in rt.inbox()}
    assert rows["m1"]["status"] == "delivered"
    assert not rows["m1"]["suspect"]
    assert seen == ["m1"]
    wait_for(lambda: sent == ["m1"], what="observers to hear of the committed send")


def test_a_failed_attempt_recorded_after_the_timeout_counts_as_recorded(
        make_runtime: MakeRuntime, clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of m1's failed attempt is taken by a batch that runs past the timeout,
    then commits (a retry at +2 s). Taken as refused, the run handed m1 back (refused: it
    was no longer leased), observers never heard of the failure, no alarm was set for the
    retry, and a row failed for good never ran its after-commit notifications."""
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", SHORT)
    heard = heard_slow_write(monkeypatch)
    batch_done = threading.Event()
    attempts: list[int] = []
    events: list[tuple[str, dict[str, Any]]] = []
    box: dict[str, Any] = {}

    def brain(turn: Turn) -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            hold_next_batch(box["rt"].context.journal.writer, batch_done)
            raise RuntimeError("the model is down")

    rt = make_runtime(brain=brain)
    box["rt"] = rt
    rt.subscribe(lambda event, data: events.append((event, data)))
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        rt.post(sid, "one", message_id="m1")
        assert heard.event.wait(20), "the failure record never timed out"
        batch_done.set()
        rt.run_until_idle(timeout=10)
    finally:
        batch_done.set()
    assert [(d["message_id"], d["attempts"]) for e, d in events if e == "turn_failed"] \
        == [("m1", 1)]
    clock.advance(2.0)
    rt.run_until_idle(timeout=10)
    assert [r["status"] for r in rt.inbox()] == ["delivered"]
    assert attempts == [1, 2]


def test_a_takeover_start_recorded_after_the_timeout_starts_the_turn(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row taken over from a worker that died mid-turn records its start before it runs.
    That record, taken by a batch that ran past the timeout and then committed, was taken
    as refused: the row stayed leased, its start recorded, with nothing to run it until
    the lease ran out (never, on this clock)."""
    from kinbox.persistence import Journal, NewMessage

    from .conftest import Stores

    prepared = Stores(db_url)
    prepared.store.create_session("s0", None, "S0", "interactive", 0)
    prepared.journal.enqueue(NewMessage("m0", "s0", "#0"), 1)
    assert len(prepared.journal.claim("dead-worker", 1, lease=10_000).rows) == 1
    prepared.journal.mark_turn_started("dead-worker", "m0", 1)
    prepared.close()
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", SHORT)
    heard = heard_slow_write(monkeypatch)
    batch_done = threading.Event()
    seen: list[str] = []
    rt = Runtime(db=db_url, brain=lambda turn: seen.append(turn.messages[0].message_id),
                 clock=clock, tick_interval=3600)
    real = Journal.submit_turn_started

    def slow_start(self: Journal, *args: Any, **kwargs: Any) -> Any:
        hold_next_batch(self.writer, batch_done)  # this record is the write it waits for
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Journal, "submit_turn_started", slow_start)
    try:
        rt.start()
        assert heard.event.wait(20), "the start record never timed out"
        batch_done.set()
        wait_for(lambda: seen == ["m0"], what="the taken-over row's turn")
        wait_for(lambda: rt.inbox()[0]["status"] == "delivered", what="its commit")
    finally:
        batch_done.set()
        rt.stop()
    assert rt.inbox()[0]["attempts"] == 1  # as after a takeover answered in time


@pytest.mark.parametrize("ask", ["steering", "take"])
def test_rows_leased_into_a_turn_after_the_timeout_are_the_turn_s(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch,
        ask: str) -> None:
    """``turn.steering()`` (or ``turn.take()``, a foreground child's result) leases m2 into
    m1's running turn in a batch that runs past the timeout, then commits. Taken as
    refused, the brain heard of a failure and m2 stayed leased to this runtime outside any
    turn: nothing ran it or handed it back until its lease ran out (never, on this clock),
    and then it ran only as a suspect."""
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", SHORT)
    # The steering write's own wait, before it waited on for the outcome (the writer's).
    monkeypatch.setattr(GroupCommitWriter.call, "__defaults__", (SHORT,))
    heard = heard_slow_write(monkeypatch)
    batch_done, asked = threading.Event(), threading.Event()
    got: list[object] = []
    seen: list[list[str]] = []
    box: dict[str, Any] = {}

    def brain(turn: Turn) -> None:
        seen.append([m.message_id for m in turn.messages])
        if turn.messages[0].message_id != "m1":
            return
        box["rt"].post(turn.session_id, "two", message_id="m2")
        hold_next_batch(box["rt"].context.journal.writer, batch_done)
        asked.set()
        try:
            if ask == "steering":
                got.extend(m.message_id for m in turn.steering())
            else:
                got.append(turn.take("m2"))
        except WriteTimeout as exc:
            got.append(exc)

    rt = make_runtime(brain=brain)
    box["rt"] = rt
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        rt.post(sid, "one", message_id="m1")
        assert asked.wait(20)
        wait_for(lambda: heard.event.is_set() or bool(got), 20,
                 what="the steering write to outrun its wait")
        batch_done.set()  # the batch commits: m2 leased to m1's turn
        wait_for(lambda: {r["status"] for r in rt.inbox()} == {"delivered"}, 20,
                 what="m1 and m2 delivered")
    finally:
        batch_done.set()
    assert got == (["m2"] if ask == "steering" else [True])
    assert seen == [["m1"]]  # m2 was part of m1's turn, not a turn of its own
    assert not [r for r in rt.inbox() if r["suspect"]]
