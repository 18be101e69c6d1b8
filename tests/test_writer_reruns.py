"""A writer operation may run more than once: on PostgreSQL the writer runs again what a
deadlock or a serialization failure rolled back (:mod:`kinbox.persistence.writer`). Only
the run that committed may count, so an operation must keep nothing in memory from a run
that was undone. Here every plain operation runs twice, the first run undone by its
savepoint, as a conflict's retry would have it: what observers hear and what the
sessions receive must be what they are when each runs once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import batch_run

pytestmark = pytest.mark.timeout(60)

TASK_EVENTS = ("task_changed", "task_blocked", "session_closed")


@pytest.fixture
def twice() -> Iterator[Callable[[bool], None]]:
    """``twice(True)``: from now on every plain writer operation runs twice, its first
    run undone; ``twice(False)``: once again."""
    real = batch_run.run_one

    def run_twice(control: Any, op: Callable[[], Any]) -> tuple[bool, Any]:
        name = control.savepoint("kinbox_test_undone")
        try:
            op()
        except Exception:
            pass  # it fails again, or not, in the run that counts
        control.undo(name)
        return real(control, op)

    def switch(on: bool) -> None:
        batch_run.run_one = run_twice if on else real  # type: ignore[assignment]
    yield switch
    batch_run.run_one = real  # type: ignore[assignment]


def _family_with_a_requeue(make_runtime: Callable[..., Runtime], clock: ManualClock,
                           project: str) -> tuple[list[tuple[Any, ...]], list[str]]:
    """A child task that fails five times, is requeued by an operator and completes; what
    observers heard of tasks, and which results woke the parent."""
    broken = [True]
    woken: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            if broken[0]:
                raise RuntimeError("the model is down")
            turn.reply("done at last")
        else:
            woken.extend(m.payload.get("outcome", "") for m in turn.messages
                         if m.kind == "subagent_result")

    heard: list[tuple[Any, ...]] = []
    rt = make_runtime(brain=brain)
    rt.subscribe(lambda event, data: heard.append((event, data.get("status"),
                                                   data.get("blocked_on")))
                 if event in TASK_EVENTS else None)
    parent = rt.create_session(rt.create_project(project).id, "parent").id
    spawned = rt.tools_for(parent).agent(description="summarize the logs")
    for backoff in (0, 2, 4, 8, 16):
        clock.advance(backoff)
        rt.run_until_idle()
    broken[0] = False
    rt.requeue(f"subagent-task-{spawned['task_id']}")
    rt.run_until_idle()
    rt.stop()
    return heard, woken


def test_task_changes_are_heard_once_however_often_their_operation_ran(
        make_runtime: Callable[..., Runtime], clock: ManualClock,
        twice: Callable[[bool], None]) -> None:
    once = _family_with_a_requeue(make_runtime, clock, "once")
    assert once[1] == ["failed", "completed"]
    assert ("task_changed", "in_progress", None) in once[0]  # the requeue reopened it
    twice(True)
    assert _family_with_a_requeue(make_runtime, clock, "twice") == once
