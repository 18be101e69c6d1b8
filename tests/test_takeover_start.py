"""A taken-over row's attempt counts only once its turn really starts.

A row whose last worker died mid-turn (a suspect) is taken over by a claim, which counts
the interrupted turn as an attempt only if that turn had started (its start is recorded
in the row). A suspect row that finds its session held by a direct turn (a cron run, a
social event) waits for it: its brain has not run, and a death meanwhile is not its own.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.running import RunningTurns
from kinbox.actors.turn import Message
from kinbox.persistence import NewMessage

from .conftest import Stores
from .helpers import wait_for


@pytest.mark.timeout(60)
def test_a_taken_over_row_that_died_waiting_for_a_direct_turn_counts_no_attempt(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime recorded the suspect's start before it found the session taken by a
    direct turn; the row parked, the process died, and the next takeover counted an
    attempt whose brain never ran (five such deaths failed the message unrun)."""
    prepared = Stores(db_url)
    prepared.store.create_session("s0", None, "S0", "interactive", 0)
    prepared.journal.enqueue(NewMessage("m0", "s0", "hello"), 1)
    assert len(prepared.journal.claim("dead-worker", 1, lease=10_000).rows) == 1
    prepared.close()

    in_direct, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def brain(turn: Turn) -> str:
        ran.append(turn.messages[0].message_id)
        if turn.messages[0].message_id == "d1":
            in_direct.set()
            release.wait(30)
        return "ok"

    rt = Runtime(db=db_url, brain=brain, clock=clock, tick_interval=3600).start()
    direct = rt._services.direct  # type: ignore[union-attr]  # the cron/social turns' pool
    assert direct is not None
    ended: list[BaseException | None] = []

    def cron_run() -> None:
        try:
            direct.run("s0", [Message("d1", "cron", "tick", None, {})])
            ended.append(None)
        except BaseException as exc:  # the crash below ends it
            ended.append(exc)

    real_try_begin = RunningTurns.try_begin

    def try_begin(
        turns: RunningTurns, session_id: str, now: float = 0.0, turn_id: str | None = None
    ) -> Any:
        # The suspect is about to start: a cron run of its session takes the board first.
        if turn_id == "m0" and not in_direct.is_set():
            threading.Thread(target=cron_run, daemon=True).start()
            assert in_direct.wait(20), "the cron run never started"
        return real_try_begin(turns, session_id, now, turn_id)

    monkeypatch.setattr(RunningTurns, "try_begin", try_begin)
    try:
        slots = rt.context.slots
        assert slots is not None
        wait_for(lambda: "s0" in slots.waiting, 20, "the suspect to wait for the cron run")
    finally:
        rt.crash()  # the process dies while the suspect waits
        release.set()
    wait_for(lambda: bool(ended), 20, "the cron run to end")
    assert ran == ["d1"]  # the suspect's brain never ran

    after = Stores(db_url)
    try:
        [row] = after.journal.claim("next-worker", clock.now() + 60, lease=30).rows
        assert (row.message_id, row.taken_over) == ("m0", True)
        assert row.attempts == 0, "a takeover counted an attempt whose turn never started"
    finally:
        after.close()
