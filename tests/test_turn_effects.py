"""A failed turn has no effects (#12.6): a turn's tool writes commit with the turn, or never.

Each test runs a brain whose first attempts call tools and then raise; the attempt that
commits is the only one whose sends, family messages, task changes and sub-agent starts
exist afterwards. Retries come due on the injected clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.persistence import DatabaseFailed, Journal, NewMessage

MakeRuntime = Callable[..., Runtime]

pytestmark = pytest.mark.timeout(60)


def drain_with_retries(rt: Runtime, clock: ManualClock, attempts: int) -> None:
    """Run the first attempt and every retry after it (backoff 2, 4, 8 ... s)."""
    rt.run_until_idle()
    for n in range(1, attempts):
        clock.advance(2.0 ** n)
        rt.run_until_idle()


def failing_twice(act: Callable[[Turn, int], None]) -> tuple[Callable[[Turn], None], list[int]]:
    """A brain for session "a" that runs ``act`` then raises on attempts 1 and 2."""
    attempts: list[int] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a" or turn.messages[0].content != "go":
            turn.reply(f"seen: {turn.messages[0].content}")
            return
        attempts.append(len(attempts) + 1)
        act(turn, attempts[-1])
        if attempts[-1] < 3:
            raise RuntimeError(f"model failed on attempt {attempts[-1]}")
        turn.reply("done")
    return brain, attempts


def sessions(rt: Runtime) -> Any:
    p = rt.create_project("p")
    rt.create_session(p.id, "A", session_id="a")
    rt.create_session(p.id, "B", session_id="b")
    return p


def test_sends_of_failed_attempts_never_reach_their_target(make_runtime: MakeRuntime,
                                                           clock: ManualClock) -> None:
    receipts: list[dict[str, Any]] = []
    brain, attempts = failing_twice(lambda turn, n: receipts.append(
        turn.tools.agent_send("b", f"side effect from attempt {n}")))
    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 3)
    assert attempts == [1, 2, 3]
    to_b = rt.inbox(target="b")
    assert [r["content"] for r in to_b] == ["side effect from attempt 3"]
    assert to_b[0]["status"] == "delivered"
    # The receipt keeps its shape, and its id is the row that committed.
    assert set(receipts[-1]) == {"message_id", "agent_id", "status"}
    assert receipts[-1]["status"] == "pending"
    assert receipts[-1]["message_id"] == to_b[0]["message_id"]
    assert [r["message_id"] for r in receipts[:2]] != [to_b[0]["message_id"]] * 2
    assert [e.text for e in rt.transcript("b") if e.role == "assistant"] == [
        "seen: side effect from attempt 3"]


def test_family_messages_tasks_and_background_children_of_failed_attempts_leave_nothing(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    seen: list[dict[str, Any]] = []

    def act(turn: Turn, n: int) -> None:
        tools = turn.tools
        task = tools.task_create(f"plan {n}")
        tools.task_update(task["task_id"], status="completed")
        seen.append(tools.task_list())  # the turn sees its own task changes
        child = tools.agent(f"research for attempt {n}")
        seen.append(child)

    brain, _ = failing_twice(act)
    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 3)
    tasks = rt.tools_for("a").task_list()["tasks"]
    assert [(t["title"], t["status"]) for t in tasks] == [("plan 3", "completed")]
    children = [s for s in rt.sessions() if s.kind == "subagent"]
    assert [s.title for s in children] == ["research for attempt 3"]
    assert children[0].id == seen[-1]["agent_id"]
    # The child ran once, and its task message is the only one it ever got.
    assert [r["status"] for r in rt.inbox(target=children[0].id)] == ["delivered"]
    in_turn = seen[-2]["tasks"]
    assert [(t["title"], t["status"]) for t in in_turn] == [("plan 3", "completed")]


def test_family_send_of_a_failed_attempt_is_not_sent(make_runtime: MakeRuntime,
                                                     clock: ManualClock) -> None:
    brain, _ = failing_twice(lambda turn, n: turn.tools.send(
        f"sibling note {n}", receiver_role="sibling", receiver_name="B"))
    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "Parent", session_id="parent")
    rt.create_session(p.id, "A", session_id="a", parent_id=parent.id)
    rt.create_session(p.id, "B", session_id="b", parent_id=parent.id)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 3)
    assert [r["content"] for r in rt.inbox(target="b")] == ["sibling note 3"]


def test_a_message_to_a_child_started_in_the_same_turn_commits_with_it(
        make_runtime: MakeRuntime) -> None:
    def brain(turn: Turn) -> None:
        if turn.session_id == "a" and turn.messages[0].content == "go":
            child = turn.tools.agent("look into it")
            turn.tools.agent_send(child["agent_id"], "and one more thing")
            turn.reply("delegated")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    rt.run_until_idle()
    [child] = [s for s in rt.sessions() if s.kind == "subagent"]
    assert [r["content"] for r in rt.inbox(target=child.id)] == ["look into it",
                                                                 "and one more thing"]


def test_a_turn_that_fails_for_good_commits_none_of_its_tool_writes(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    def brain(turn: Turn) -> None:
        if turn.session_id == "a":
            turn.tools.agent_send("b", "never")
            turn.tools.task_create("never either")
            raise RuntimeError("always")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 5)
    assert [r["status"] for r in rt.inbox(target="a")] == ["failed"]
    assert rt.inbox(target="b") == []
    assert rt.tools_for("a").task_list() == {"tasks": []}


def test_outside_a_turn_the_tools_commit_at_once(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()  # send-only: nothing runs the turns, the rows just exist
    sessions(rt)
    receipt = rt.tools_for("a").agent_send("b", "now")
    assert [r["message_id"] for r in rt.inbox(target="b")] == [receipt["message_id"]]
    assert receipt["status"] == "pending"


def test_a_retried_foreground_child_is_the_same_child_not_a_second_one(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """A foreground child commits at once (the turn waits for it); the retry that asks for
    the same child gets the one that already ran, with its result."""
    outcomes: list[dict[str, Any]] = []
    child_turns: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "a" and turn.messages[0].content == "go":
            outcomes.append(turn.tools.agent("count the files", run_in_background=False,
                                             timeout=30))
            if len(outcomes) == 1:
                raise RuntimeError("the model failed after the child answered")
            turn.reply(f"child said {outcomes[-1]['result']}")
        elif turn.session_id != "a":
            child_turns.append(turn.session_id)
            turn.reply("42 files")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 2)
    assert len(outcomes) == 2
    assert outcomes[0]["agent_id"] == outcomes[1]["agent_id"]
    assert outcomes[1]["result"] == "42 files"
    assert child_turns == [outcomes[0]["agent_id"]]  # one child turn in all
    assert len([s for s in rt.sessions() if s.kind == "subagent"]) == 1
    assert [e.text for e in rt.transcript("a") if e.role == "assistant"] == [
        "child said 42 files"]


def test_retried_foreground_children_asked_for_in_another_order_are_the_same_children(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """An async turn's tool calls run at once (``asyncio.gather``, pydantic-ai's parallel
    tool calls) and start their children in any order, as a retried model may ask for
    them in another order. The child's id counted the turn's foreground calls, so the
    retry started every child again: four child turns for two children."""
    outcomes: list[list[dict[str, Any]]] = []
    child_turns: list[str] = []

    async def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            child_turns.append(turn.messages[0].content)
            turn.reply(f"did {turn.messages[0].content}")
            return
        if turn.messages[0].content != "go":
            return
        order = ["lint", "test"] if not outcomes else ["test", "lint"]
        outcomes.append([await turn.tools.agent(task, run_in_background=False, timeout=30)
                         for task in order])
        if len(outcomes) == 1:
            raise RuntimeError("the model failed after its children answered")
        turn.reply("both done")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 2)
    assert sorted(child_turns) == ["lint", "test"]  # one turn per child in all
    first, second = ({r["agent_id"] for r in attempt} for attempt in outcomes)
    assert first == second
    assert [r["result"] for r in outcomes[1]] == ["did test", "did lint"]
    assert len([s for s in rt.sessions() if s.kind == "subagent"]) == 2


def test_a_foreground_child_commits_whole_or_not_at_all(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write failing after the child's session and task leaves nothing behind, so the
    retried turn starts the child afresh instead of waiting on a task message that
    never existed."""
    enqueue_now, failures = Journal.enqueue_now, []

    def flaky(self: Journal, msg: NewMessage, now: float) -> Any:
        if msg.target.startswith("subagent-") and not failures:
            failures.append(msg.message_id)
            raise DatabaseFailed("disk I/O error")
        return enqueue_now(self, msg, now)

    monkeypatch.setattr(Journal, "enqueue_now", flaky)
    outcomes: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "a" and turn.messages[0].content == "go":
            outcomes.append(turn.tools.agent("count the files", run_in_background=False,
                                             timeout=30))
            turn.reply(f"child said {outcomes[-1]['result']}")
        elif turn.session_id != "a":
            turn.reply("42 files")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 2)
    assert len(failures) == 1 and len(outcomes) == 1
    assert [e.text for e in rt.transcript("a") if e.role == "assistant"] == [
        "child said 42 files"]
    children = [s for s in rt.sessions() if s.kind == "subagent"]
    assert [s.id for s in children] == [outcomes[0]["agent_id"]]
    assert len(rt.tools_for(children[0].id).task_list()["tasks"]) == 1
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}


def test_steering_taken_by_a_failed_attempt_is_handed_back_and_delivered_once(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    attempts: list[list[str]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            return
        if not attempts:
            rt.post("a", "steer me")
        taken = [m.content for m in turn.steering()]
        attempts.append([m.content for m in turn.messages] + taken)
        if len(attempts) == 1:
            raise RuntimeError("failed while steering")
        turn.reply("ok")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "first")
    drain_with_retries(rt, clock, 2)
    assert attempts[0] == ["first", "steer me"]
    assert attempts[-1][0] == "first"
    assert sorted(m for a in attempts[1:] for m in a) == ["first", "steer me"]
    assert all(r["status"] == "delivered" for r in rt.inbox(target="a"))
    assert sorted(rt.marker_counts().values()) == [1, 1]


def test_an_async_brain_s_awaited_sends_also_commit_only_with_its_turn(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    attempts: list[int] = []

    async def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            return
        attempts.append(len(attempts) + 1)
        await turn.tools.agent_send("b", f"async side effect {attempts[-1]}")
        if attempts[-1] < 3:
            raise RuntimeError("the model call failed")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 3)
    assert attempts == [1, 2, 3]
    assert [r["content"] for r in rt.inbox(target="b")] == ["async side effect 3"]


def test_a_failed_focal_turn_schedules_no_wake_up(make_runtime: MakeRuntime,
                                                  clock: ManualClock, tmp_path: Any) -> None:
    attempts: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != focal_id or turn.messages[0].content != "remind me":
            return
        attempts.append(turn.tools.schedule_wakeup("reminder", at=clock.now() + 3600,
                                                   note="stand-up"))
        if len(attempts) < 3:
            raise RuntimeError("the model failed after scheduling")

    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    focal_id = rt.get_or_create_focal_chat().id
    rt.post(focal_id, "remind me")
    drain_with_retries(rt, clock, 3)
    wakeups = rt.context.focal.schedule.wakeups()
    assert len(attempts) == 3
    assert [w["job_id"] for w in wakeups] == [attempts[-1]["job_id"]]


def test_a_foreground_child_s_id_has_the_form_every_child_s_has(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """T5: a child's id is ``subagent-sub_<8 hex>``; a foreground child's (derived from its
    turn, so that a retry finds it) had 16, unlike every other child's."""
    outcomes: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "a" and turn.messages[0].content == "go":
            outcomes.append(turn.tools.agent("count the files", run_in_background=False,
                                             timeout=30))
            if len(outcomes) == 1:
                raise RuntimeError("the model failed after the child answered")
        elif turn.session_id != "a":
            turn.reply("42 files")

    rt = make_runtime(brain=brain)
    sessions(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 2)
    assert [o["agent_id"] for o in outcomes] == [outcomes[0]["agent_id"]] * 2
    assert re.fullmatch(r"subagent-sub_[0-9a-f]{8}", outcomes[0]["agent_id"]), outcomes
