"""The dispatcher's own connection ends between two ticks (PostgreSQL).

A tick's reads run on the dispatcher's connection: the renewal and the look for unheld
rows say a transient failure in one WARNING line and the tick goes on. The read of the
stop requests others recorded did not: the connection's end came out of the tick as an
ERROR with a traceback ("the dispatcher failed on Tick"), and the tick's passivation and
claim were skipped.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg2
import pytest

from kinbox.actors import ManualClock, Runtime

from .helpers import end_backends, quiet_brain, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def _dispatcher_backends(pg_url: str) -> list[int]:
    """The backends whose last statement was a claim's window read: the dispatcher's."""
    conn = psycopg2.connect(pg_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND query LIKE 'EXECUTE kinbox_claim_window%%'")
            return [r[0] for r in cur.fetchall()]
    finally:
        conn.close()


def test_a_tick_whose_connection_ended_says_so_in_one_warning_and_goes_on(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    # Ticks come from the clock's moves alone (the ticker's own are a quarter hour apart).
    rt = Runtime(db=pg_url, brain=quiet_brain, clock=clock, data_dir=str(tmp_path),
                 tick_interval=3600.0, lease_seconds=3600.0).start()
    try:
        clock.advance(2.0)  # a tick: a claim, on the dispatcher's connection
        wait_for(lambda: len(_dispatcher_backends(pg_url)) == 1, timeout=20,
                 what="the dispatcher's claim")
        pids = _dispatcher_backends(pg_url)
        with caplog.at_level(logging.WARNING, logger="kinbox"):
            end_backends(pg_url, pids)
            clock.advance(0.5)  # the next tick: its first read finds the connection gone
            wait_for(lambda: bool(_dispatcher_backends(pg_url))
                     and _dispatcher_backends(pg_url) != pids, timeout=20,
                     what="the tick's claim, on a new connection")
        dispatcher = [r for r in caplog.records if r.name == "kinbox.dispatcher"]
        assert [r for r in dispatcher if r.levelno >= logging.ERROR] == []
        assert any(r.levelno == logging.WARNING and r.exc_info is None for r in dispatcher)
    finally:
        rt.stop()
