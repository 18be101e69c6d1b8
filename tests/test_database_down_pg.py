"""A delivering runtime whose database is down ends at once, not once it is back
(PostgreSQL).

A server restart or failover ends every session and, for a while, takes no new ones. The
runtime's life lock went with its session, so to the other runtimes it is dead, and they
take its rows over as soon as they reach the server again. Its check of the lock ran
after a read of the journal's lease owners, on a new connection: during the outage that
read failed first, every half second (a traceback each time), and the runtime never
looked at its lock. It stayed running through the outage and, once the server was back,
claimed and ran turns the others were taking over (the brain ran twice; fencing kept one
commit) until its next check ended it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import database_down, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def test_a_runtime_whose_database_is_down_ends_while_it_is_down(
        pg_url: str, tmp_path: Path) -> None:
    running, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        running.set()
        release.wait(30)

    rt = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path), tick_interval=0.05).start()
    try:
        sid = rt.create_session(rt.create_project("down").id, "S").id
        rt.post(sid, "hello", sender="u")
        assert running.wait(20)
        with database_down(pg_url):
            wait_for(lambda: rt.state == "crashed", timeout=15,
                     what="the runtime to end while its database is down")
    finally:
        release.set()
        rt.stop()
