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
        checker: list[int] = []
        checks = threading.Semaphore(0)

        def lease_owners() -> Any:
            if not checker:  # the check's thread and its connection
                checker.append(db.execute_sql("SELECT pg_backend_pid()").fetchone()[0])
            owners = real()
            checks.release()
            return owners

        journal.lease_owners = lease_owners  # type: ignore[method-assign]
        assert checks.acquire(timeout=20)
        with caplog.at_level(logging.WARNING, logger="kinbox"):
            end_backends(pg_url, checker)
            # The next check fails on the ended connection; the one after it connects again.
            wait_for(lambda: any(r.name == "kinbox.runtime" for r in caplog.records),
                     timeout=20, what="the check's failure")
            assert checks.acquire(timeout=20)
        said = [r for r in caplog.records if r.name == "kinbox.runtime"]
        assert [(r.levelno, r.exc_info) for r in said] == [(logging.WARNING, None)]
        assert rt.state == "running"
    finally:
        rt.stop()
