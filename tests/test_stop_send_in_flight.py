"""A send whose commit leased its row (SQLite's fast path) and whose sender had not yet
handed the row to the slots when the runtime stopped: the row is handed back unrun.

The sender offers the row after its commit answers; a stop that ran in between (a signal
handler's, on the very thread that waited for the commit; or another thread's) closed the
slots and then the writer, and the late offer's hand-back met the closed writer. The row
stayed ``processing``, leased to a stopped runtime: the next start took it over as a
runtime gone (a suspect, run alone), though it had never run. The stop now hands back the
rows of the sends it got ahead of before it stops the writer.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest

from kinbox.actors import Runtime
from kinbox.actors.context import RuntimeContext
from kinbox.persistence import ClaimedRow

from .helpers import quiet_brain

pytestmark = pytest.mark.timeout(60)


def row_state(path: Path, message_id: str) -> tuple[object, ...]:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return con.execute("SELECT status, attempts, lease_owner FROM agent_inbox_messages "
                           "WHERE message_id = ?", (message_id,)).fetchone()


def test_a_send_the_stop_got_ahead_of_has_its_row_handed_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "k.db"
    rt = Runtime(db=f"sqlite:///{path}", brain=quiet_brain, data_dir=tmp_path / "data").start()
    session = rt.create_session(rt.create_project("p").id, "A").id
    committed, go_on = threading.Event(), threading.Event()
    real = RuntimeContext.hand_over

    def held(self: RuntimeContext, row: ClaimedRow) -> None:
        committed.set()  # the commit answered: the row is leased to this runtime
        assert go_on.wait(30)
        real(self, row)

    monkeypatch.setattr(RuntimeContext, "hand_over", held)
    sent: list[str] = []
    sender = threading.Thread(target=lambda: sent.append(rt.post(session, "hi").message_id))
    sender.start()
    try:
        assert committed.wait(30)
        rt.stop()
    finally:
        go_on.set()
        sender.join(30)
    [mid] = sent
    assert row_state(path, mid) == ("pending", 0, None)
