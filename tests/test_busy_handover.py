"""A send that a claim skipped because its session was busy is handed over when that
session's run ends, not at the dispatcher's next tick.

A turn's commit leases the session's next row in its own transaction (chained
delivery); the claims leave busy sessions out. A send committed by another process
after the commit read the session's next head (PostgreSQL: after the commit statement
took its snapshot, before the commit landed; SQLite: after the commit landed, before
the run ended) was seen by neither: the commit chained nothing and asked for no claim,
and the claim the send caused (its NOTIFY; on SQLite the tick) skipped the busy
session. The row waited a whole tick. Here the tick is far longer than the test, so a
row that waits for it is never delivered in time.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

from .helpers import wait_for

NO_TICK = 30.0
"""The tick (30 s): the rows must be delivered within a third of it, by a hand-over."""
LEASE = 4 * NO_TICK
"""Long enough that the tick, at most a quarter of a lease apart, stays NO_TICK."""
HANDED_OVER = 10.0


class Brain:
    """Notes each turn's messages; the turn of ``first`` waits for ``go``."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.started = threading.Event()
        self.go = threading.Event()

    def __call__(self, turn: Turn) -> None:
        self.seen.extend(m.message_id for m in turn.messages)
        if turn.messages[0].message_id == "first":
            self.started.set()
            self.go.wait(20)


class SkippedClaim:
    """A seam on the runtime's slot table: ``ended`` is set once a claim that began after
    the row ``message_id`` was committed, and that left ``session`` out (busy), has ended
    (its answer applied to the slot table: what it started, whether a backlog is left)."""

    def __init__(self, rt: Runtime, session: str, message_id: str) -> None:
        slots, hot = rt.context.slots, rt.context.journal.hot
        assert slots is not None
        self.ended = threading.Event()
        pending: list[bool] = []
        window, claimed, claim_ended = slots.claim_window, slots.claimed, slots.claim_ended

        def claim_window(requested: bool) -> tuple[int, set[str], int]:
            after_send = hot.existing(message_id) is not None
            out = window(requested)
            pending.append(after_send and session in out[1])
            return out

        def ended(result: Any) -> Any:
            if pending and pending.pop():
                self.ended.set()
            return result

        slots.claim_window = claim_window  # type: ignore[method-assign]
        slots.claimed = lambda result, capacity: ended(claimed(result, capacity))  # type: ignore[method-assign]
        slots.claim_ended = lambda: ended(claim_ended())  # type: ignore[method-assign]


class HeldCommit:
    """A seam on the runtime's journal: its next turn commit runs its statements, then its
    transaction stays open (a write queued behind it in the same writer batch waits) until
    ``release`` is set; ``held`` says it got there."""

    def __init__(self, rt: Runtime) -> None:
        journal = rt.context.journal
        self.held, self.release = threading.Event(), threading.Event()
        real = journal.submit_turn

        def submit_turn(*args: Any, **kwargs: Any) -> Any:
            del journal.submit_turn  # once
            writer, inside, gate = journal.writer, threading.Event(), threading.Event()
            writer.submit(lambda: (inside.set(), gate.wait(20)))  # the writer waits here
            assert inside.wait(20)
            reply = real(*args, **kwargs)  # queued, and the hold behind it: one batch
            writer.submit(lambda: (self.held.set(), self.release.wait(20)))
            gate.set()
            return reply

        journal.submit_turn = submit_turn  # type: ignore[method-assign]


@pytest.mark.postgres
@pytest.mark.timeout(90)
def test_a_send_committed_inside_a_busy_sessions_commit_is_handed_over_at_once(
        pg_url: str, tmp_path: Path) -> None:
    brain = Brain()
    rt = Runtime(db=pg_url, brain=brain, tick_interval=NO_TICK, lease_seconds=LEASE,
                 data_dir=str(tmp_path / "w")).start()
    sender = Runtime(db=pg_url, data_dir=str(tmp_path / "s")).start()  # another process
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        wait_for(lambda: rt.statistics()["listener"].get("connects") == 1, what="the listener")
        skipped = SkippedClaim(rt, sid, "late")
        held = HeldCommit(rt)
        rt.post(sid, "one", message_id="first")
        assert brain.started.wait(20)
        brain.go.set()  # the turn commits: its statements run, and it stays open
        assert held.held.wait(20), "the commit never ran"
        sender.post(sid, "two", message_id="late")  # after the commit's snapshot
        assert skipped.ended.wait(20), "no claim followed the send's notification"
        held.release.set()  # the commit lands, having chained nothing
        wait_for(lambda: "late" in brain.seen, timeout=HANDED_OVER,
                 what="the turn of the send the busy session's claim skipped")
    finally:
        sender.stop()
        rt.stop()


@pytest.mark.timeout(90)
def test_a_send_from_a_send_only_process_a_tick_skipped_runs_when_the_busy_run_ends(
        tmp_path: Path) -> None:
    """SQLite: a send-only process's row is found by the tick's claim. One committed after
    a turn's commit, while its run had not ended, was skipped by that claim (busy), and
    the run's end asked for none: it waited for a second tick."""
    brain = Brain()
    clock = ManualClock(time.time())  # its moves tick now; the ticker's tick is NO_TICK
    url = f"sqlite:///{tmp_path / 'k.db'}"
    rt = Runtime(db=url, brain=brain, clock=clock, tick_interval=NO_TICK, lease_seconds=LEASE,
                 data_dir=str(tmp_path / "w")).start()
    sender = Runtime(db=url, clock=clock, data_dir=str(tmp_path / "s")).start()  # send-only
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        landed, release = threading.Event(), threading.Event()

        def hold_the_run(event: str, data: dict[str, Any]) -> None:
            # On the session's thread: its commit is durable, its run not yet over.
            if event == "turn_committed" and "first" in data["message_ids"]:
                landed.set()
                release.wait(20)
        rt.subscribe(hold_the_run)
        skipped = SkippedClaim(rt, sid, "late")
        rt.post(sid, "one", message_id="first")
        brain.go.set()
        assert landed.wait(20), "the first turn never committed"
        sender.post(sid, "two", message_id="late")
        clock.advance(0)  # a tick: its claim leaves the busy session out
        assert skipped.ended.wait(20), "the tick claimed nothing"
        release.set()
        wait_for(lambda: "late" in brain.seen, timeout=HANDED_OVER,
                 what="the turn of the send the tick's claim skipped")
    finally:
        sender.stop()
        rt.stop()
