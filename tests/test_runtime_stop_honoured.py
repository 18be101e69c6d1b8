"""A brain that honours the runtime's stop before it replied is handed back, as one the
grace cancels is.

README (Stop and cancellation): a turn the runtime's stop (a deploy) cuts short before it
replied anything is handed back unanswered, never acknowledged with no answer. A brain
that does what the ``Turn`` API asks, ending on ``turn.stopped()`` /
``turn.wait_stop_requested`` (which the runtime's stop raises too), returned with nothing
said and was committed as a stopped turn: its message acknowledged, never to run again,
while the same silent brain ignoring the flag (cancelled past the grace) was handed back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import Runtime, Turn

from .conftest import Stores
from .test_async_brains import after_stop

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)


class ModelCallAborted(Exception):
    """What a model client raises when its call is aborted on the turn's stop."""


def sync_brain(started: threading.Event, raising: bool = False) -> Callable[[Turn], Any]:
    def brain(turn: Turn) -> None:
        started.set()
        if turn.wait_stop_requested(30):  # a model call that honours its stop
            if raising:
                raise ModelCallAborted("the model call was aborted")
            return
        turn.reply("the answer")
    return brain


def async_brain(started: threading.Event, raising: bool = False) -> Callable[[Turn], Any]:
    async def brain(turn: Turn) -> None:
        started.set()
        if await turn.stopped(30):  # a model call that honours its stop
            if raising:
                raise ModelCallAborted("the model call was aborted")
            return
        turn.reply("the answer")
    return brain


ENDINGS = pytest.mark.parametrize(("make_brain", "raising"), [
    (sync_brain, False), (async_brain, False), (sync_brain, True), (async_brain, True)],
    ids=["sync-returns", "async-returns", "sync-raises", "async-raises"])
"""How a brain ends on the stop: returning, or raising as an aborted model call often does
(the client's own error). Raising was a failed attempt, counted, with its backoff (for cron
an ``error`` run counting toward the job's deactivation): a few deploys during a long model
call failed the message, which the deploys alone had interrupted. Having done nothing, it
is handed back either way (a caller's stop forgives the error the same way)."""


@ENDINGS
def test_a_brain_ending_on_the_runtimes_stop_before_it_replied_is_handed_back(
        make_runtime: MakeRuntime, db_url: str,
        make_brain: Callable[[threading.Event, bool], Any], raising: bool) -> None:
    started = threading.Event()
    rt = make_runtime(brain=make_brain(started, raising), stop_grace=5.0)
    project = rt.create_project("team")
    b = rt.create_session(project.id, "B").id
    mid = rt.post(b, "summarize the thread").message_id
    assert started.wait(10)
    rt.stop(timeout=10)
    assert after_stop(db_url, b, mid) == (("pending", 0), [], 0)


@ENDINGS
def test_a_cron_run_ending_on_the_runtimes_stop_before_it_replied_commits_nothing(
        make_runtime: MakeRuntime, make_brain: Callable[[threading.Event, bool], Any],
        raising: bool) -> None:
    """A direct turn follows the same rule: left ``running``, the next start takes the run
    over and runs it again, as after a kill (committed, it was a ``success`` unanswered;
    failed, an ``error`` counting toward the job's deactivation)."""
    started = threading.Event()
    rt = make_runtime(brain=make_brain(started, raising), stop_grace=5.0)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert started.wait(10)
    rt.stop(timeout=10)
    after = make_runtime()
    assert [r["status"] for r in after.cron.runs(job)] == ["running"]
    assert after.transcript(f"cron-{job}") == []


def test_rows_waiting_for_a_slot_at_a_stop_are_handed_back_not_left_leased(
        make_runtime: MakeRuntime, db_url: str) -> None:
    """A send leases its row with the write when it is its session's head (SQLite's fast
    path); with every slot busy the row waits in the slot table. A graceful stop left
    such rows ``processing`` under the stopped runtime's lease, so the next start took
    each over as a suspect (a row whose worker died mid-turn): run one at a time, each
    after the one before had ended."""
    started = threading.Event()
    rt = make_runtime(brain=sync_brain(started), max_active_sessions=1)
    project = rt.create_project("team")
    rt.post(rt.create_session(project.id, "Busy").id, "hold the only slot")
    assert started.wait(10)
    targets = [rt.create_session(project.id, f"W{i}").id for i in range(3)]
    waiting = [rt.post(target, "queued").message_id for target in targets]
    # Leased with their sends, waiting for the slot.
    assert [rt.inbox(target=t)[0]["status"] for t in targets] == ["processing"] * 3
    rt.stop(timeout=10)
    stores = Stores(db_url)
    try:
        rows = [stores.journal.get(m) for m in waiting]
    finally:
        stores.close()
    assert [(r["status"], r["lease_owner"], r["attempts"], bool(r["suspect"]))
            for r in rows] == [("pending", None, 0, False)] * 3
    again = make_runtime(brain=lambda turn: turn.reply("done"))
    again.run_until_idle()
    assert [(r["status"], bool(r["suspect"])) for t in targets
            for r in again.inbox(target=t)] == [("delivered", False)] * 3
