"""At most :data:`CHILD_LIMIT` sub-agents of one session run at once: a brain calling
``agent`` in a loop is refused at the limit, with nothing written, instead of starting a
model turn per call. Places are counted from the call on (two callers at once cannot both
take the last one) and given back by a child that ends, blocks on the user, or was never
committed (a failed attempt's)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, ToolError, Turn
from kinbox.actors.validation import CHILD_LIMIT

from .helpers import wait_for
from .test_turn_effects import drain_with_retries, failing_twice, sessions

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)


def _children(rt: Runtime) -> list[Any]:
    return [s for s in rt.sessions() if s.kind == "subagent"]


def _refused(call: Callable[[], object]) -> ToolError:
    with pytest.raises(ToolError) as info:
        call()
    return info.value


def test_a_turn_is_refused_past_the_limit_and_a_failed_attempt_gives_its_places_back(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    refusals: list[tuple[int, ToolError]] = []

    def act(turn: Turn, n: int) -> None:
        for k in range(CHILD_LIMIT):  # attempt 3 gets every place attempts 1 and 2 took
            turn.tools.agent(f"part {k} of attempt {n}")
        refusals.append((n, _refused(lambda: turn.tools.agent("one too many"))))

    brain, attempts = failing_twice(act)
    rt = make_runtime(brain=brain, max_active_sessions=4)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 3)
    assert attempts == [1, 2, 3]
    assert [n for n, _ in refusals] == [1, 2, 3]
    error = refusals[-1][1]
    assert error.code == "execution_failed"
    assert error.message.startswith(f"Sub-agent limit: {CHILD_LIMIT} ")
    titles = sorted(s.title for s in _children(rt))
    assert titles == sorted(f"part {k} of attempt 3" for k in range(CHILD_LIMIT))
    assert rt.context.starting_children.count("a") == 0  # each place let go once


def test_running_children_count_and_ended_or_blocked_ones_do_not(
        make_runtime: MakeRuntime) -> None:
    gate = threading.Event()

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            gate.wait(30)  # a long model call: the child's task stays in progress
        turn.reply("ok")

    rt = make_runtime(brain=brain, max_active_sessions=CHILD_LIMIT + 4)
    sessions(rt)
    tools = rt.tools_for("a")
    try:
        started = [tools.agent(f"part {k}") for k in range(CHILD_LIMIT)]
        wait_for(lambda: all(rt.context.turns.is_running(c["agent_id"]) for c in started),
                 timeout=30, what="every child's turn")
        before = len(_children(rt))
        assert _refused(lambda: tools.agent("one too many")).code == "execution_failed"
        assert len(_children(rt)) == before  # nothing written
        # A child blocked on the user holds no place.
        first = started[0]
        rt.tools_for(first["agent_id"]).task_update(first["task_id"], status="blocked",
                                                    blocked_on="user")
        tools.agent("one more")
        assert _refused(lambda: tools.agent("and another")).code == "execution_failed"
    finally:
        gate.set()
    # Children that ended hold no place either.
    rt.run_until_idle(30)
    assert len(_children(rt)) == CHILD_LIMIT + 1
    tools.agent("after they ended")
    assert rt.context.starting_children.count("a") == 0


def test_two_callers_at_once_cannot_both_take_the_last_place(
        make_runtime: MakeRuntime) -> None:
    gate = threading.Event()

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            gate.wait(30)
        turn.reply("ok")

    rt = make_runtime(brain=brain, max_active_sessions=CHILD_LIMIT + 4)
    sessions(rt)
    tools = rt.tools_for("a")
    both = threading.Barrier(2, timeout=20)
    answers: list[object] = []

    def start_one(n: int) -> None:
        both.wait()
        try:
            answers.append(tools.agent(f"last place {n}"))
        except ToolError as exc:
            answers.append(exc)

    try:
        for k in range(CHILD_LIMIT - 1):
            tools.agent(f"part {k}")
        callers = [threading.Thread(target=start_one, args=(n,)) for n in range(2)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(30)
        assert sorted(isinstance(a, ToolError) for a in answers) == [False, True], answers
        assert len(_children(rt)) == CHILD_LIMIT
    finally:
        gate.set()
    rt.run_until_idle(30)
    assert rt.context.starting_children.count("a") == 0


def test_tasks_a_child_made_for_itself_hold_no_place(make_runtime: MakeRuntime,
                                                   any_db_url: str) -> None:
    gate = threading.Event()

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            if turn.messages[0].content != "plan the trip":
                gate.wait(30)
            for k in range(3):  # its own to-do list, left open when it is done
                turn.tools.task_create(f"step {k}")
        turn.reply("ok")

    rt = make_runtime(db=any_db_url, brain=brain, max_active_sessions=CHILD_LIMIT + 4)
    sessions(rt)
    tools = rt.tools_for("a")
    first = tools.agent("plan the trip")
    rt.run_until_idle(30)
    own = [t for t in rt.tools_for(first["agent_id"]).task_list()["tasks"]
           if t["task_id"] != first["task_id"]]
    assert [t["status"] for t in own] == ["pending"] * 3  # open, and not the handed task
    try:
        for k in range(CHILD_LIMIT):  # every place is free
            tools.agent(f"part {k}")
        assert _refused(lambda: tools.agent("one too many")).code == "execution_failed"
    finally:
        gate.set()
    rt.run_until_idle(30)
    assert rt.context.starting_children.count("a") == 0
