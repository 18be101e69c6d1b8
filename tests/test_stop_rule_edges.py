"""The runtime's stop rule ``turn_run.cut_short`` at its edges.

A turn the runtime's stop ended having done nothing is handed back whole (its message runs
again at the next start). "Done nothing" read from ``turn.replies`` alone threw away a turn
whose work was its tool writes (a child settling its task, a send) and ran it again, every
effect twice; and the runtime's stop renamed a turn already past its timeout, so a message
that always times out was handed back uncounted at every start instead of failing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.running import RUNTIME_STOP, TIMEOUT

from .conftest import Stores
from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]


def _parent_with_a_child(rt: Runtime) -> tuple[str, str, str]:
    parent = rt.create_session(rt.create_project("p").id, "parent", session_id="parent").id
    spawned = rt.tools_for(parent).agent(description="clean up")
    return parent, spawned["agent_id"], spawned["task_id"]


@pytest.mark.timeout(60)
def test_a_child_that_completed_its_task_and_ended_on_a_deploy_silently_is_not_run_again(
        make_runtime: MakeRuntime) -> None:
    """The child completes its task with the task tool, then its last model call (the
    summary) is where a deploy stops it: it ends on the stop, as the Turn API asks, with
    no reply. The task it completed must stand (subagents.report_back: "a stop of a child
    which had settled its task stopped nothing"); cut_short discards it and runs the
    child's whole task again after the restart."""
    running = threading.Event()
    task_turns: list[str] = []
    heard: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            task_turns.append(turn.messages[0].message_id)
            [task] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(task["task_id"], status="completed")
            if not running.is_set():  # the first life: the deploy comes during it
                running.set()
                turn.wait_stop_requested(30)  # the summary call, aborted by the stop
            else:
                turn.reply("done")
        else:
            heard.extend(m.payload.get("outcome", "") for m in turn.messages
                         if m.kind == "subagent_result")

    rt = make_runtime(brain=brain)
    _, _, task_id = _parent_with_a_child(rt)
    assert running.wait(10)
    rt.stop()
    again = make_runtime(brain=brain)
    again.run_until_idle()
    assert len(task_turns) == 1, task_turns  # the completed task ran twice
    assert heard == ["completed"]
    assert again.context.tasks.get(task_id).status == "completed"  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_turn_past_its_timeout_is_a_failed_attempt_even_when_a_stop_comes_before_it_ends(
        make_runtime: MakeRuntime, clock: ManualClock, db_url: str) -> None:
    """The turn ran past ``turn_timeout`` (asked to stop: TIMEOUT) and ignores the ask; a
    deploy's stop then comes, and ``RunningTurns.request_stop`` renames the stopper
    RUNTIME_STOP (only a caller's stop is kept). The brain ends with nothing said: before
    89aba9c that was a failed attempt (TurnTimeout, counted: a poison message ends in
    ``failed``); cut_short now hands it back, no attempt counted, a timed-out message run
    again at every start with nothing to bound it."""
    asked, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        if turn.wait_stop_requested(30):
            asked.set()
            release.wait(30)  # a model call that ignores its stop

    rt = make_runtime(brain=brain, turn_timeout=10.0)
    project = rt.create_project("p")
    a, b = rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id
    message_id = rt.post(b, "think hard", sender=a).message_id
    wait_for(lambda: rt.context.turns.is_running(b), what="the turn")
    clock.advance(11)  # the next tick asks the turn to stop: a timeout
    assert asked.wait(10)
    turns = rt.context.turns
    real_request = turns.request_stop
    runtime_asked = threading.Event()

    def request_stop(session_id: str, by: str | None, *args: Any, **kwargs: Any) -> bool:
        done = real_request(session_id, by, *args, **kwargs)
        if session_id == b and by == RUNTIME_STOP:
            runtime_asked.set()
        return done

    turns.request_stop = request_stop  # type: ignore[method-assign]
    stopper = threading.Thread(target=rt.stop, kwargs={"timeout": 10})
    stopper.start()
    assert runtime_asked.wait(10)  # the deploy's stop asked the timed-out turn too
    assert turns.stopped_by(b) == TIMEOUT  # and did not rename it
    release.set()
    stopper.join(30)
    stores = Stores(db_url)
    try:
        row = stores.journal.get(message_id)
    finally:
        stores.close()
    assert row is not None
    assert row["attempts"] == 1, row  # handed back: 0
    assert str(row["last_error"]).startswith("TurnTimeout"), row
