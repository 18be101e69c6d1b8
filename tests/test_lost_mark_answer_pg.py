"""A direct turn's session mark that committed while its answer was lost with the
connection (PostgreSQL: a server restart, a failover, a cut network).

The runtime took the mark for failed, and the turn ended before it began; the mark,
which has no lease, stayed: no process leased the session a row while this runtime
lived, so every message to the session waited for its restart. The runtime now ends
the mark the failed take may have written, as it does a turn's that did not commit.

Where the answer is lost cannot be timed from outside, so the test wraps the store's
take: it writes for real, then its caller gets a lost connection's error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import Runtime, Turn
from kinbox.actors.cron_rules import session_id_for
from kinbox.persistence import DatabaseFailed

from .helpers import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def test_a_mark_whose_answer_was_lost_does_not_hold_its_session(
        pg_runtimes: Callable[..., Runtime]) -> None:
    """The cron run's mark committed, its answer was lost: a message to the session is
    still delivered, at once, not at the runtime's next start."""
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        ran.append(turn.messages[0].content)

    rt = pg_runtimes(brain=brain)
    store = rt.context.store
    real = store.take_direct_turn
    lost = threading.Event()

    def take(*args: Any, **kwargs: Any) -> bool:
        took = real(*args, **kwargs)
        if lost.is_set():
            return took
        lost.set()
        assert took
        raise DatabaseFailed("server closed the connection unexpectedly")

    store.take_direct_turn = take  # type: ignore[method-assign]
    job = rt.cron.add("digest", "0 9 * * *", "Summarize")
    session = session_id_for(job["job_id"])
    rt.cron.trigger(job["job_id"])
    assert lost.wait(30)
    rt.post(session, "a question", sender="u")
    wait_for(lambda: "a question" in ran, timeout=20, what="the question's turn")
    wait_for(lambda: rt.context.store.direct_turn(session) is None, timeout=20,
             what="the session's mark to end")
