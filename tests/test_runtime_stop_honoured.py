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

from .test_async_brains import after_stop

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)


def sync_brain(started: threading.Event) -> Callable[[Turn], Any]:
    def brain(turn: Turn) -> None:
        started.set()
        if turn.wait_stop_requested(30):  # a model call that honours its stop
            return
        turn.reply("the answer")
    return brain


def async_brain(started: threading.Event) -> Callable[[Turn], Any]:
    async def brain(turn: Turn) -> None:
        started.set()
        if await turn.stopped(30):  # a model call that honours its stop
            return
        turn.reply("the answer")
    return brain


@pytest.mark.parametrize("make_brain", [sync_brain, async_brain], ids=["sync", "async"])
def test_a_brain_ending_on_the_runtimes_stop_before_it_replied_is_handed_back(
        make_runtime: MakeRuntime, db_url: str,
        make_brain: Callable[[threading.Event], Any]) -> None:
    started = threading.Event()
    rt = make_runtime(brain=make_brain(started), stop_grace=5.0)
    project = rt.create_project("team")
    b = rt.create_session(project.id, "B").id
    mid = rt.post(b, "summarize the thread").message_id
    assert started.wait(10)
    rt.stop(timeout=10)
    # Handed back (README): pending, no attempt, nothing in the transcript.
    assert after_stop(db_url, b, mid) == (("pending", 0), [], 0)


@pytest.mark.parametrize("make_brain", [sync_brain, async_brain], ids=["sync", "async"])
def test_a_cron_run_ending_on_the_runtimes_stop_before_it_replied_commits_nothing(
        make_runtime: MakeRuntime, make_brain: Callable[[threading.Event], Any]) -> None:
    """A direct turn follows the same rule: left ``running``, the next start takes the run
    over and runs it again, as after a kill (committed, it was a ``success`` unanswered)."""
    started = threading.Event()
    rt = make_runtime(brain=make_brain(started), stop_grace=5.0)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert started.wait(10)
    rt.stop(timeout=10)
    after = make_runtime()
    assert [r["status"] for r in after.cron.runs(job)] == ["running"]
    assert after.transcript(f"cron-{job}") == []
