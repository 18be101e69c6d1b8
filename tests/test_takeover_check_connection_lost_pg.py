"""The connection of the check for runtimes that are gone ends (PostgreSQL).

The check runs on the runtime's ticker, twice a second, its reads on the ticker's own
connection; ended under it (an administrator's ``pg_terminate_backend``, a pooler or a
proxy dropping it), the next check failed, and said so as an ERROR with a traceback
where every other tick's work (claims, renewals, the schedule's look, the listener) says
a transient failure in one WARNING line. The next check connects again.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime

from .helpers import end_backends, quiet_brain, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]


def test_a_check_whose_connection_ended_says_so_in_one_warning_and_goes_on(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rt = Runtime(db=pg_url, brain=quiet_brain, data_dir=str(tmp_path)).start()
    try:
        journal = rt.context.journal
        db = journal.t.db
        real = journal.lease_owners
        checks = threading.Semaphore(0)
        end = threading.Event()

        def lease_owners() -> Any:
            # The check ends its own connection first: the tick's other work on this
            # thread (the device scan) must not be the one to meet the ended connection.
            if end.is_set():
                end.clear()
                pid = db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]
                end_backends(pg_url, [pid])
            try:
                return real()
            finally:
                checks.release()

        journal.lease_owners = lease_owners  # type: ignore[method-assign]
        assert checks.acquire(timeout=20)
        with caplog.at_level(logging.WARNING, logger="kinbox"):
            end.set()
            # This check fails on the ended connection; the one after it connects again.
            wait_for(lambda: any(r.name == "kinbox.runtime" for r in caplog.records),
                     timeout=20, what="the check's failure")
            assert checks.acquire(timeout=20)  # the failed check
            assert checks.acquire(timeout=20)  # the next one, on a new connection
        said = [r for r in caplog.records if r.name == "kinbox.runtime"]
        assert [(r.levelno, r.exc_info) for r in said] == [(logging.WARNING, None)]
        assert rt.state == "running"
    finally:
        rt.stop()
