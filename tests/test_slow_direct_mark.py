"""A direct turn's mark written after its wait gave up is not left on the session.

A direct turn (a cron run, a social event) marks its session first: from the mark on,
no runtime on PostgreSQL leases the session a row, and readers see it ``active``. When
the mark's batch ran past the wait (a slow or blocked database), the turn ended with the
``WriteTimeout`` that says the write may yet commit, and nothing took the mark back. It
then committed: the session stayed marked by this live runtime (which nobody clears),
so none of its messages was claimed again while the runtime lived, and it showed
``active`` for good.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from kinbox.actors import ManualClock, Message, Runtime, Turn
from kinbox.persistence import GroupCommitWriter, WriteTimeout
from kinbox.persistence import writer as writer_module

from .helpers import SHORT, hold_next_batch, wait_for

pytestmark = pytest.mark.timeout(90)


def test_a_direct_turn_mark_that_landed_after_its_wait_is_taken_back(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.append(turn.messages[0].message_id)

    rt = Runtime(db=pg_url, brain=brain, clock=clock)
    rt.start()
    try:
        sid = rt.create_session(rt.create_project("p").id, "S").id
        writer = rt.context.journal.writer
        # The writer's waits are short here: the mark's batch outruns them.
        monkeypatch.setattr(writer_module, "WRITE_TIMEOUT", SHORT)
        monkeypatch.setattr(writer, "call",
                            lambda op, timeout=SHORT: GroupCommitWriter.call(writer, op, timeout))
        heard = threading.Event()

        class Heard(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if "slow" in record.getMessage():
                    heard.set()
        logger = logging.getLogger("kinbox.writer")
        monkeypatch.setattr(logger, "handlers", [*logger.handlers, Heard()])
        batch_done = threading.Event()
        hold_next_batch(writer, batch_done)
        direct = rt._services.direct  # type: ignore[attr-defined]  # cron and social's turns
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append(direct.run(sid, [Message("d1", "cron", "tick", None, {})]))
            except Exception as exc:
                outcome.append(exc)
        runner = threading.Thread(target=run)
        runner.start()
        try:  # it failed, or it waits on for the mark's outcome
            wait_for(lambda: bool(outcome) or heard.is_set(), timeout=30,
                     what="the mark's write to outrun its wait")
        finally:
            batch_done.set()  # the batch commits, the mark with it
        runner.join(30)
        monkeypatch.undo()
        if isinstance(outcome[0], WriteTimeout):
            assert not outcome[0].withdrawn
        rt.post(sid, "hello", message_id="m1")
        try:
            wait_for(lambda: rt.inbox()[0]["status"] == "delivered", timeout=20,
                     what="the session's message to be delivered")
        except AssertionError:
            raise AssertionError(f"m1 never ran: the session is {rt.session(sid).status}, "  # type: ignore[union-attr]
                                 f"marked {rt.context.store.direct_turn(sid)}") from None
        assert "m1" in seen
        wait_for(lambda: rt.session(sid).status == "idle", timeout=20,  # type: ignore[union-attr]
                 what="the session to show idle")
    finally:
        rt.stop()
