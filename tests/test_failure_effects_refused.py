"""A failed attempt whose effects cannot be read hands its row back, not left to its lease.

A failed turn's record carries what its outbox hooks add when the row ends ``failed`` (a
child's task end, its parent's wake-up), and a hook reads the database to know that.
That read ran before the record's error handling: a database error there escaped the
delivery run, which ended with the row still leased to this runtime and nothing
renewing it. The row, and every later row of its session, waited out a whole lease (for
ever on an injected clock). As when the failure record itself is refused, the row goes
back unrun, with nothing of the attempt written.
"""

from __future__ import annotations

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.context import RuntimeContext, TurnEffects
from kinbox.actors.turn import TurnOutcome
from kinbox.persistence import DatabaseFailed

from .helpers import of_kind, wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failed_attempt_whose_hooks_cannot_read_goes_back_at_once(
    db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    real = RuntimeContext.effects
    refused: list[str] = []

    def effects(self: RuntimeContext, turn: Turn, outcome: TurnOutcome) -> TurnEffects:
        if not outcome.ok and not refused:
            refused.append(turn.row.message_id)
            raise DatabaseFailed("disk I/O error")
        return real(self, turn, outcome)

    monkeypatch.setattr(RuntimeContext, "effects", effects)
    calls: list[str] = []

    def brain(turn: Turn) -> None:
        calls.append(turn.messages[0].content)
        if len(calls) == 1:
            raise ValueError("the model timed out")

    chosen = of_kind(kind, brain)
    # The injected clock never moves on its own: a lease left to run out never does.
    rt = Runtime(db=db_url, brain=chosen, clock=clock, lease_seconds=3600).start()
    try:
        session = rt.create_session(rt.create_project("p").id, "s").id
        rt.post(session, "first")
        rt.post(session, "second")
        wait_for(lambda: bool(refused), 20, what="the failed attempt's effects to be refused")
        rt.run_until_idle(20)
        row = rt.inbox(target=session)[0]
        assert row["status"] != "processing", "left leased to this runtime until its lease ends"
        clock.advance(max(0.0, row["available_at"] - clock.now()))
        wait_for(lambda: calls == ["first", "first", "second"], 20, what="both rows to run")
        rt.run_until_idle(20)
        assert {r["status"] for r in rt.inbox(target=session)} == {"delivered"}
    finally:
        rt.stop()
