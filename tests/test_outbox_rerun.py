"""A turn's queued write that its commit ran twice (a PostgreSQL deadlock aborted the first
run's transaction, and the writer ran the batch again) hands on the result of the run that
committed, never the rolled-back one's."""

from __future__ import annotations

import itertools
from typing import Any, cast

import pytest

from kinbox.actors.outbox import Outbox, Writes

pytestmark = pytest.mark.timeout(10)


def test_the_after_hook_gets_the_last_runs_result() -> None:
    runs = itertools.count(1)
    heard: list[int] = []
    box = Outbox("msg-1")
    writes = Writes(cast(Any, None), box)  # with an outbox, a write never reaches ctx
    assert writes.write(lambda: next(runs), 0, heard.append) == 0
    effects = box.close()
    assert effects is not None
    for _ in range(2):  # the first run's transaction was rolled back; the second committed
        for op in effects.ops:
            op()
    for after in effects.after:
        after()
    assert heard == [2]
