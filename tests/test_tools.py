"""The agent tools through a real runtime: contracts, texts, and refusals that write nothing."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import (
    ManualClock,
    Runtime,
    ToolError,
    Turn,
    subagents,
    transcript_read,
    transcript_view,
)
from kinbox.actors.focal_schedule import LATEST_WAKEUP
from kinbox.actors.slots import Slots
from kinbox.actors.subagents import REPORT_INTERVAL
from kinbox.actors.transcript_view import TRUNCATED
from kinbox.persistence import TurnEntry

from .conftest import Stores
from .helpers import quiet_brain, wait_for

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def world(make_runtime: MakeRuntime) -> dict[str, Any]:
    """Two projects, sessions of several kinds, a hidden one and a loner without a project."""
    rt = make_runtime(brain=quiet_brain)
    p1, p2 = rt.create_project("one"), rt.create_project("two")
    w: dict[str, Any] = {"rt": rt, "p1": p1, "p2": p2}
    w["me"] = rt.create_session(p1.id, "Me").id
    w["peer"] = rt.create_session(p1.id, "Peer", kind="cron").id
    w["social"] = rt.create_session(p1.id, "Thread", kind="social").id
    w["dream"] = rt.create_session(p1.id, "Dream", kind="dream").id
    w["wake"] = rt.create_session(p1.id, "Wake", platform="subagent_wakeup").id
    w["far"] = rt.create_session(p2.id, "Far").id
    w["loner"] = rt.create_session(None, "Loner").id
    return w


def refused(call: Callable[[], object], code: str, text: str | None = None) -> ToolError:
    with pytest.raises(ToolError) as info:
        call()
    assert info.value.code == code
    if text is not None:
        assert info.value.message == text
    return info.value


# -- agent_send ------------------------------------------------------------------------------

def test_send_to_self_and_to_unreachable_targets_uses_the_spec_texts(world: dict[str, Any]
                                                                     ) -> None:
    rt, tools = world["rt"], world["rt"].tools_for(world["me"])
    refused(lambda: tools.agent_send(world["me"], "hi"), "invalid_argument",
            "Use a normal follow-up turn instead of sending to the current agent.")
    for target in ("nope", world["dream"], world["wake"], world["far"]):
        refused(lambda t=target: tools.agent_send(t, "hi"), "not_found",
                f"Agent '{target}' is not available in the current project.")
    assert rt.inbox() == []


@pytest.mark.parametrize(("args", "fragment"), [
    ((None, "hi"), "agent_id must be a string"),
    ((42, "hi"), "agent_id must be a string"),
    (("", "hi"), "agent_id must not be empty"),
    (("peer", None), "message must be a string"),
    (("peer", "   "), "message must not be empty"),
    (("peer", "x" * 20_001), "20,001 characters; the limit is 20,000"),
])
def test_bad_send_arguments_are_invalid_and_write_nothing(world: dict[str, Any],
                                                          args: tuple[Any, Any],
                                                          fragment: str) -> None:
    target = world.get(args[0], args[0]) if isinstance(args[0], str) else args[0]
    err = refused(lambda: world["rt"].tools_for(world["me"]).agent_send(target, args[1]),
                  "invalid_argument")
    assert fragment in err.message
    assert world["rt"].inbox() == []


HUGE = "x" * 100_000
"""An argument no id, status or name can be: a model's runaway output."""


@pytest.mark.parametrize("name", [
    "agent_read", "agent_send", "agent_stop", "agent_list", "send_role", "send_name",
    "task_create", "task_update_id", "task_update_status", "call_name", "call_key"])
def test_a_huge_argument_is_refused_without_echoing_it_back(world: dict[str, Any],
                                                            name: str) -> None:
    """Ids of any length were looked up and quoted whole: a 100,000-character ``agent_id``
    or status came back as a 100,000-character error, into the model's context."""
    rt = world["rt"]
    tools = rt.tools_for(world["me"])
    task = tools.task_create("t")["task_id"]
    calls: dict[str, Callable[[], object]] = {
        "agent_read": lambda: tools.agent_read(HUGE),
        "agent_send": lambda: tools.agent_send(HUGE, "hi"),
        "agent_stop": lambda: tools.agent_stop(HUGE),
        "agent_list": lambda: tools.agent_list(status=HUGE),
        "send_role": lambda: tools.send("hi", HUGE),
        "send_name": lambda: tools.send("hi", "sibling", HUGE),
        "task_create": lambda: tools.task_create("t", HUGE),
        "task_update_id": lambda: tools.task_update(HUGE, status="completed"),
        "task_update_status": lambda: tools.task_update(task, status=HUGE),
    }
    if name.startswith("call_"):
        args = {HUGE: 1} if name == "call_key" else {}
        result = tools.call(HUGE if name == "call_name" else "agent_list", args)
        assert result["error"] in ("invalid_argument", "not_found")
        message = result["message"]
    else:
        with pytest.raises(ToolError) as info:
            calls[name]()
        assert info.value.code in ("invalid_argument", "not_found")
        message = info.value.message
    assert len(message) < 400, message[:200]
    assert rt.inbox() == []


def test_an_integer_python_cannot_print_is_an_invalid_argument(world: dict[str, Any]) -> None:
    """An int past Python's 4,300 digits (a framework's parser may hand one over, a caller
    may pass one) raised ValueError out of the message that quoted it: the call crashed
    where a model should hear what was wrong."""
    tools = world["rt"].tools_for(world["me"])
    huge = 10**5000
    for args in ({"limit": huge}, {"limit": -huge}, {"status": huge}):
        result = tools.call("agent_list", args)
        assert result["error"] == "invalid_argument", result
        assert len(result["message"]) < 400, result["message"][:200]
    with pytest.raises(ToolError) as info:
        tools.agent_list(limit=huge)
    assert info.value.code == "invalid_argument"


def test_an_id_longer_than_any_row_holds_is_invalid_and_a_longest_one_is_looked_up(
        world: dict[str, Any]) -> None:
    tools = world["rt"].tools_for(world["me"])
    err = refused(lambda: tools.agent_send("c" * 129, "hi"), "invalid_argument")
    assert err.message == "agent_id is 129 characters; an id has at most 128."
    refused(lambda: tools.agent_send("c" * 128, "hi"), "not_found",
            f"Agent '{'c' * 128}' is not available in the current project.")


def test_send_strips_the_message_and_accepts_exactly_20000_characters(world: dict[str, Any]
                                                                     ) -> None:
    tools = world["rt"].tools_for(world["me"])
    receipt = tools.agent_send(world["peer"], "  " + "x" * 20_000 + "\n")
    assert set(receipt) == {"message_id", "agent_id", "status"}
    assert world["rt"].inbox()[0]["content"] == "x" * 20_000


def test_a_caller_that_does_not_exist_is_an_execution_failure(world: dict[str, Any]) -> None:
    ghost = world["rt"].tools_for("ghost")
    refused(lambda: ghost.agent_send(world["me"], "hi"), "execution_failed")
    refused(lambda: ghost.agent_list(), "execution_failed")
    assert world["rt"].inbox() == []


def test_every_tool_decision_matches_the_access_rules_through_the_runtime(
        world: dict[str, Any]) -> None:
    from kinbox.actors.access import Subject, decide

    rt = world["rt"]
    names = ["me", "peer", "social", "dream", "wake", "far", "loner"]
    subjects = {n: Subject(s.id, s.project_id, s.kind, s.platform)
                for n in names if (s := rt.session(world[n]))}
    for caller, target in itertools.product(names, names):
        tools = rt.tools_for(world[caller])
        expected = decide("agent_read", subjects[caller], subjects[target])
        try:
            tools.agent_read(world[target])
            got = "allow"
        except ToolError as exc:
            got = "unavailable" if exc.code == "not_found" else exc.code
        assert got == expected, (caller, target)


# -- agent_list ------------------------------------------------------------------------------

def test_list_shows_the_project_newest_first_without_hidden_or_foreign_sessions(
        world: dict[str, Any], clock: ManualClock) -> None:
    rt = world["rt"]
    result = rt.tools_for(world["me"]).agent_list()
    ids = [a["agent_id"] for a in result["agents"]]
    assert set(ids) == {world["me"], world["peer"], world["social"]}
    assert result["has_more"] is False
    assert set(result["agents"][0]) == {"agent_id", "title", "kind", "status", "project_id",
                                        "parent_agent_id", "updated_at"}
    clock.advance(5)
    rt.post(world["peer"], "bump")
    rt.run_until_idle()
    assert rt.tools_for(world["me"]).agent_list()["agents"][0]["agent_id"] == world["peer"]
    assert [a["agent_id"] for a in rt.tools_for(world["loner"]).agent_list()["agents"]] == [
        world["loner"]]


def test_focal_lists_the_sessions_of_every_project_it_may_address(world: dict[str, Any]
                                                                   ) -> None:
    """Focal reaches every project (FO4): its ``agent_list`` listed only its own hidden
    project, so it showed nothing but itself while it could read and send to them all."""
    rt = world["rt"]
    focal = rt.tools_for(rt.get_or_create_focal_chat().id)
    listed = {a["agent_id"] for a in focal.agent_list(limit=50)["agents"]}
    visible = {world[k] for k in ("me", "peer", "social", "far", "loner")}
    assert visible <= listed
    assert not {world["dream"], world["wake"]} & listed  # hidden sessions never (S3)
    for agent_id in listed:  # what it lists, it may address
        assert focal.agent_read(agent_id)["agent_id"] == agent_id


def test_focal_starting_a_session_without_project_or_title_is_told_what_it_lacks(
        world: dict[str, Any]) -> None:
    """FO4: ``agent_send(agent_id="new", ...)`` needs ``project_id`` and ``title``. Without a
    project the answer was ``not_found``: "Project 'None' does not exist."."""
    rt = world["rt"]
    focal = rt.tools_for(rt.get_or_create_focal_chat().id)
    refused(lambda: focal.agent_send("new", "go", title="Fix"), "invalid_argument",
            "agent_id='new' needs project_id: the id of the project to start the session in.")
    refused(lambda: focal.agent_send("new", "go", project_id=world["p1"].id),
            "invalid_argument", "agent_id='new' needs title: the new session's title.")
    assert rt.inbox() == [] and len(rt.sessions(world["p1"].id)) == 5


def test_focal_send_with_a_wrong_argument_names_only_that_argument(world: dict[str, Any]
                                                                   ) -> None:
    """Focal's ``agent_send`` named every extra argument "unexpected", the ones it takes
    for ``agent_id='new'`` too: ``(unexpected: bogus, project_id, title)``."""
    rt = world["rt"]
    focal = rt.tools_for(rt.get_or_create_focal_chat().id)
    refused(lambda: focal.agent_send("new", "go", project_id=world["p1"].id, title="t",
                                     bogus=1), "invalid_argument",
            "agent_send has no argument bogus; it takes agent_id, message, and with "
            "agent_id='new' project_id, title and task_title.")
    refused(lambda: focal.agent_send(world["me"], "go", title="t"), "invalid_argument",
            "project_id, title and task_title are only for agent_id='new' (got: title).")
    assert rt.inbox() == []


def test_list_limit_and_has_more(world: dict[str, Any]) -> None:
    tools = world["rt"].tools_for(world["me"])
    page = tools.agent_list(limit=2)
    assert len(page["agents"]) == 2 and page["has_more"] is True
    for bad, fragment in ((0, "from 1 to 50"), (51, "from 1 to 50"), ("5", "integer"),
                          (True, "integer")):
        err = refused(lambda b=bad: tools.agent_list(limit=b), "invalid_argument")
        assert fragment in err.message
    refused(lambda: tools.agent_list(status="idle"), "invalid_argument")


def test_list_active_shows_only_sessions_whose_turn_runs(make_runtime: MakeRuntime) -> None:
    started, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        release.wait(10)

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    me, busy, idle = (rt.create_session(p.id, n).id for n in ("me", "busy", "idle"))
    rt.post(busy, "work")
    assert started.wait(10)
    active = rt.tools_for(me).agent_list(status="active")["agents"]
    assert [(a["agent_id"], a["status"]) for a in active] == [(busy, "active")]
    release.set()
    rt.run_until_idle()
    assert rt.tools_for(me).agent_list(status="active")["agents"] == []
    assert rt.session(idle).status == "idle"


@pytest.mark.timeout(60)
def test_list_in_a_turn_shows_the_children_that_turn_started(make_runtime: MakeRuntime) -> None:
    """Later calls in a turn see its own writes: a child it started is on its family
    roster and can be read and messaged at once. ``agent_list`` read only the committed
    sessions, so a model that started two sub-agents and listed its agents to follow
    them did not find them until its next turn."""
    lists: list[dict[str, Any]] = []
    started: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "lead" or turn.messages[0].content != "go":
            return
        started.extend(turn.tools.agent(f"look into {what}")["agent_id"]
                       for what in ("the logs", "the metrics"))
        lists.extend([turn.tools.agent_list(), turn.tools.agent_list(limit=2),
                      turn.tools.agent_list(status="active")])

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    rt.create_session(p.id, "lead", session_id="lead")
    other = rt.create_session(p.id, "other").id
    rt.post("lead", "go")
    rt.run_until_idle()
    every, two, active = lists
    newest_first = [started[1], started[0]]
    assert [a["agent_id"] for a in every["agents"]][:2] == newest_first
    assert {other, "lead"} <= {a["agent_id"] for a in every["agents"]}
    assert [a["agent_id"] for a in two["agents"]] == newest_first and two["has_more"] is True
    assert all(a["parent_agent_id"] == "lead" and a["kind"] == "subagent"
               for a in every["agents"][:2])
    assert [a["agent_id"] for a in active["agents"]] == ["lead"]  # the children wait


# -- agent_read ------------------------------------------------------------------------------

def test_read_shows_visible_user_and_assistant_text_only(world: dict[str, Any]) -> None:
    rt = world["rt"]
    rt.context.store.append(world["peer"], [
        TurnEntry("user", "question"), TurnEntry("reasoning", "secret thoughts"),
        TurnEntry("tool", "tool output"), TurnEntry("assistant", "hidden note", visible=False),
        TurnEntry("assistant", "answer")], 0)
    out = rt.tools_for(world["me"]).agent_read(world["peer"])
    assert out["transcript"] == "user: question\n\nassistant: answer"
    assert rt.tools_for(world["me"]).agent_read(world["me"])["agent_id"] == world["me"]


def test_read_keeps_the_newest_messages_within_20000_characters(world: dict[str, Any]) -> None:
    rt = world["rt"]
    rt.context.store.append(world["peer"], [
        TurnEntry("user", f"{i:02d}" + "y" * 2_990) for i in range(10)], 0)
    text = rt.tools_for(world["me"]).agent_read(world["peer"])["transcript"]
    first, rest = text.split("\n\n", 1)
    assert first == "[... 4 earlier messages omitted ...]"
    assert len(rest) <= 20_000
    assert rest.startswith("user: 04") and "user: 09" in rest


def test_read_keeps_the_tail_of_one_over_long_newest_message(world: dict[str, Any]) -> None:
    rt = world["rt"]
    rt.context.store.append(world["peer"], [TurnEntry("user", "old"),
                                            TurnEntry("assistant", "a" * 30_000 + "THE END")], 0)
    text = rt.tools_for(world["me"]).agent_read(world["peer"])["transcript"]
    assert text.startswith("[... 1 earlier messages omitted ...]\n\n" + TRUNCATED)
    assert text.endswith("THE END")
    assert len(text.split("\n\n", 1)[1]) <= 20_000


def test_read_of_a_long_session_loads_its_newest_entries_and_counts_the_rest(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A read used to load a session's every entry to show its newest 20,000 characters:
    a session of years, read whole at every call. It loads pages from the newest until
    the budget is full, counts the older ones in the database, and shows exactly what
    the whole transcript would show."""
    rt = world["rt"]
    store = rt.context.store
    store.append(world["peer"], [
        TurnEntry(("user", "assistant", "tool")[i % 3], f"{i:04d} " + "z" * (i % 400),
                  visible=i % 7 != 0) for i in range(3_000)], 0)
    whole = [transcript_view.Line(e.role, e.text, e.visible, e.sender_id, e.kind)
             for e in store.transcript(world["peer"])]
    loaded: list[int] = []
    read = store.transcript

    def counted(*args: Any, **kwargs: Any) -> Any:
        rows = read(*args, **kwargs)
        loaded.append(len(rows))
        return rows

    monkeypatch.setattr(store, "transcript", counted)
    text = rt.tools_for(world["me"]).agent_read(world["peer"])["transcript"]
    assert text == transcript_view.render(whole)
    assert text.startswith("[... ") and text.endswith("assistant: 2998 " + "z" * 198)
    assert "2999" not in text  # a tool entry
    assert 0 < sum(loaded) <= 200, loaded


@pytest.mark.parametrize("count", [0, 1, 31, 32, 33, 64, 65, 200])
def test_read_pages_agree_with_the_whole_view_at_every_page_boundary(
        world: dict[str, Any], count: int) -> None:
    rt = world["rt"]
    store = rt.context.store
    store.append(world["peer"], [TurnEntry("user" if i % 2 else "assistant", "m" * 700 + str(i))
                                 for i in range(count)], 0)
    whole = [transcript_view.Line(e.role, e.text, e.visible, e.sender_id, e.kind)
             for e in store.transcript(world["peer"])]
    lines, older = transcript_read.newest_lines(store, world["peer"])
    assert transcript_view.render(lines, older=older) == transcript_view.render(whole)
    for limit in (transcript_view.MIN_READ_LIMIT, 1_000, 5_000):
        lines, older = transcript_read.newest_lines(store, world["peer"], limit)
        assert (transcript_view.render(lines, limit, older)
                == transcript_view.render(whole, limit))


# -- agent_stop ------------------------------------------------------------------------------

def test_stop_sets_the_running_turns_flag_and_the_turn_ends(make_runtime: MakeRuntime) -> None:
    started = threading.Event()
    saw_stop: list[bool] = []

    def brain(turn: Turn) -> None:
        started.set()
        saw_stop.append(turn.wait_stop_requested(10))
        turn.reply("stopping as asked")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    me, worker = rt.create_session(p.id, "me").id, rt.create_session(p.id, "worker").id
    tools = rt.tools_for(me)
    refused(lambda: tools.agent_stop(worker), "execution_failed",
            f"Agent '{worker}' is not active.")
    refused(lambda: tools.agent_stop(me), "invalid_argument",
            "The current agent cannot stop itself with agent_stop.")
    rt.post(worker, "long job")
    assert started.wait(10)
    assert tools.agent_stop(worker) == {"agent_id": worker, "status": "stop_requested"}
    rt.run_until_idle()
    assert saw_stop == [True]
    assert rt.transcript(worker)[-1].text == "stopping as asked"


# -- sub-agents ------------------------------------------------------------------------------

def test_agent_creates_a_child_that_runs_and_wakes_its_parent(make_runtime: MakeRuntime) -> None:
    woken: list[tuple[str, str, dict[str, Any]]] = []

    def brain(turn: Turn) -> None:
        session = rt.session(turn.session_id)
        assert session is not None
        if session.kind == "subagent":
            turn.reply(f"done: {turn.messages[0].content}")
        else:
            woken.extend((m.kind, m.content, m.payload) for m in turn.messages)

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    spawned = rt.tools_for(parent).agent(description="summarize the logs")
    child = rt.session(spawned["agent_id"])
    assert child is not None
    assert spawned["agent_id"].startswith("subagent-sub_") and len(spawned["agent_id"]) == 21
    assert (child.kind, child.project_id, child.parent_id) == ("subagent", p.id, parent)
    rt.run_until_idle()
    task_id = spawned["task_id"]
    assert woken == [("subagent_result", "done: summarize the logs",
                      {"task_id": task_id, "child_id": child.id, "outcome": "completed"})]
    assert rt.inbox(target=parent)[0]["message_id"] == f"subagent-result-{task_id}"
    assert rt.context.tasks.get(task_id).status == "completed"  # type: ignore[union-attr]


def test_a_requeued_child_task_reports_its_new_outcome(make_runtime: MakeRuntime,
                                                       clock: ManualClock) -> None:
    """The first outcome's wake-up holds ``subagent-result-<task>``: the requeued task's
    commit, with the same id and other text, was refused every time, and the child's
    work was lost."""
    broken = [True]
    woken: list[tuple[str, str]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            if broken[0]:
                raise RuntimeError("the model is down")
            turn.reply("done at last")
        else:
            woken.extend((m.message_id, m.payload.get("outcome", "")) for m in turn.messages
                         if m.kind == "subagent_result")

    rt = make_runtime(brain=brain)
    parent = rt.create_session(rt.create_project("p").id, "parent").id
    spawned = rt.tools_for(parent).agent(description="summarize the logs")
    for backoff in (0, 2, 4, 8, 16):
        clock.advance(backoff)
        rt.run_until_idle()
    task_id = spawned["task_id"]
    assert woken == [(f"subagent-result-{task_id}", "failed")]
    broken[0] = False
    rt.requeue(f"subagent-task-{task_id}")
    rt.run_until_idle()
    assert woken[1:] == [(f"subagent-result-{task_id}-2", "completed")]
    assert rt.context.tasks.get(task_id).status == "completed"  # type: ignore[union-attr]
    assert [e.text for e in rt.transcript(spawned["agent_id"]) if e.role == "assistant"] == [
        "done at last"]


@pytest.mark.parametrize("bulk", [False, True])
def test_a_requeued_child_task_cancelled_before_it_runs_tells_its_parent(
        make_runtime: MakeRuntime, clock: ManualClock, bulk: bool) -> None:
    """The parent heard the task failed; an operator requeued it, then cancelled it before
    it ran. The task stayed blocked on its old failure, which counted as reported, so
    the cancel was never reported: the parent never heard, the task never closed."""
    rt = make_runtime(brain=_children_fail)
    parent, _, task_id = _parent_with_a_child(rt)
    for backoff in (0, 2, 4, 8, 16):
        clock.advance(backoff)
        rt.run_until_idle()
    assert [o for o, _ in _wakeups(rt, parent)] == ["failed"]
    rt.stop()
    send_only = make_runtime()  # nothing runs the requeued row before the cancel
    if bulk:
        assert send_only.requeue_failed(kind="subagent_task") == [f"subagent-task-{task_id}"]
    else:
        send_only.requeue(f"subagent-task-{task_id}")
    task = send_only.context.tasks.get(task_id)
    assert task is not None and (task.status, task.blocked_on) == ("in_progress", None)
    send_only.cancel(f"subagent-task-{task_id}", "not needed any more")
    assert [o for o, _ in _wakeups(send_only, parent)] == ["failed", "cancelled"]
    assert send_only.context.tasks.get(task_id).status == "cancelled"  # type: ignore[union-attr]


def test_a_child_that_leaves_its_task_blocked_on_the_user_is_not_completed(
        make_runtime: MakeRuntime) -> None:
    woken: list[tuple[str, str]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            [task] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(task["task_id"], status="blocked", blocked_on="user",
                                   reason="CSV or JSON?")
            turn.reply("Which format do you want, CSV or JSON?")
        else:
            woken.extend((m.payload.get("outcome", ""), m.content) for m in turn.messages
                         if m.kind == "subagent_result")

    rt = make_runtime(brain=brain)
    parent = rt.create_session(rt.create_project("p").id, "parent").id
    spawned = rt.tools_for(parent).agent(description="export the data")
    rt.run_until_idle()
    task = rt.context.tasks.get(spawned["task_id"])
    assert task is not None
    assert (task.status, task.blocked_on, task.reason) == ("blocked", "user", "CSV or JSON?")
    assert woken == [("blocked", "Which format do you want, CSV or JSON?")]


def test_children_never_hold_the_agent_tools(make_runtime: MakeRuntime) -> None:
    errors: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            for call in (lambda: turn.tools.agent(description="recurse"),
                         lambda: turn.tools.agent_send("x", "y"),
                         lambda: turn.tools.agent_list()):
                try:
                    call()
                except ToolError as exc:
                    errors.append(exc.code)
            turn.reply("ok")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    rt.tools_for(parent).agent(description="try to recurse")
    rt.run_until_idle()
    assert errors == ["execution_failed"] * 3
    assert [s.kind for s in rt.sessions()].count("subagent") == 1


def test_a_failed_child_wakes_its_parent_with_the_error(make_runtime: MakeRuntime,
                                                        clock: ManualClock) -> None:
    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            raise RuntimeError("tool crashed")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    spawned = rt.tools_for(parent).agent(description="doomed")
    for delay in (0, 2, 4, 8, 16):
        clock.advance(delay)
        rt.run_until_idle()
    wake = rt.inbox(target=parent)
    assert [(w["kind"], w["payload"]["outcome"]) for w in wake] == [("subagent_result", "failed")]
    task = rt.context.tasks.get(spawned["task_id"])
    assert task is not None and (task.status, task.blocked_on) == ("blocked", "error")


@pytest.mark.parametrize(("stopper", "wakes"), [("parent", False), ("sibling", True)])
def test_a_child_stopped_by_anyone_but_its_parent_wakes_the_parent(
        make_runtime: MakeRuntime, stopper: str, wakes: bool) -> None:
    started = threading.Event()
    rt = make_runtime(brain=_child_waits_for_its_stop(started, 10))
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    sibling = rt.create_session(p.id, "sibling").id
    child = rt.tools_for(parent).agent(description="wait")["agent_id"]
    assert started.wait(10)
    rt.tools_for(parent if stopper == "parent" else sibling).agent_stop(child)
    rt.run_until_idle()
    outcomes = [r["payload"].get("outcome") for r in rt.inbox(target=parent)]
    assert outcomes == (["stopped"] if wakes else [])


def test_agent_in_the_foreground_returns_the_childs_result(make_runtime: MakeRuntime) -> None:
    results: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            turn.reply("42")
        elif turn.messages[0].kind == "agent_message":
            results.append(turn.tools.agent(description="compute", run_in_background=False,
                                            timeout=20))

    rt = make_runtime(brain=brain, max_active_sessions=4)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    rt.post(parent, "go")
    rt.run_until_idle(30)
    assert results[0]["result"] == "42" and results[0]["status"] == "completed"


@pytest.mark.timeout(60)
def test_a_parent_asked_to_stop_while_it_waits_for_a_child_stops_waiting(
        make_runtime: MakeRuntime) -> None:
    child_running, release = threading.Event(), threading.Event()
    outcome: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            child_running.set()
            assert release.wait(30)
            turn.reply("late answer")
        elif turn.session_id == "parent" and turn.messages[0].kind == "agent_message":
            try:
                turn.tools.agent(description="slow work", run_in_background=False,
                                 timeout=50)
            except ToolError as exc:
                outcome.append(exc.message)

    rt = make_runtime(brain=brain, max_active_sessions=4)
    p = rt.create_project("p")
    rt.create_session(p.id, "parent", session_id="parent")
    boss = rt.create_session(p.id, "boss").id
    rt.post("parent", "go")
    assert child_running.wait(10)
    rt.tools_for(boss).agent_stop("parent")
    wait_for(lambda: bool(outcome), timeout=10, what="the parent to stop waiting")
    assert outcome[0].startswith("Stopped while waiting for sub-agent 'subagent-sub_")
    release.set()
    rt.run_until_idle(30)


@pytest.mark.timeout(60)
def test_two_parents_asking_for_the_last_free_thread_at_once_get_one_refusal(
        make_runtime: MakeRuntime) -> None:
    """The check and the count were two steps: both parents passed the check and waited,
    and neither child could run until both waits timed out."""
    both_in = threading.Barrier(2, timeout=10)
    outcomes: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            turn.reply("42")
        elif turn.messages[0].kind == "agent_message":
            both_in.wait()
            try:
                got = turn.tools.agent(description=f"work of {turn.session_id}",
                                       run_in_background=False, timeout=30)
                outcomes.append(got["status"])
            except ToolError as exc:
                outcomes.append(exc.message)

    rt = make_runtime(brain=brain, max_active_sessions=2)
    p = rt.create_project("p")
    for name in ("a", "b"):
        rt.create_session(p.id, name, session_id=name)
        rt.post(name, "go")
    wait_for(lambda: len(outcomes) == 2, timeout=20, what="both parents' answers")
    assert sorted(o[:40] for o in outcomes) == [
        "A foreground sub-agent needs a free sess", "completed"]


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"description": ""}, "description must not be empty"),
    ({"description": 5}, "description must be a string"),
    ({"description": "x", "run_in_background": "yes"}, "run_in_background"),
    ({"description": "x", "timeout": 0}, "timeout must be from 1"),
])
def test_bad_agent_arguments_create_nothing(world: dict[str, Any], kwargs: dict[str, Any],
                                            fragment: str) -> None:
    rt = world["rt"]
    before = len(rt.sessions())
    err = refused(lambda: rt.tools_for(world["me"]).agent(**kwargs), "invalid_argument")
    assert fragment in err.message
    assert len(rt.sessions()) == before and rt.inbox() == []


# -- tasks -----------------------------------------------------------------------------------

def test_tasks_are_durable_and_closing_the_last_one_is_announced(
        make_runtime: MakeRuntime, db_url: str, clock: ManualClock) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    rt = make_runtime()
    rt.subscribe(lambda e, d: events.append((e, d)) if e in ("task_blocked", "session_closed")
                 else None)
    p = rt.create_project("p")
    me = rt.create_session(p.id, "me").id
    tools = rt.tools_for(me)
    a = tools.task_create("write report", status="in_progress")["task_id"]
    b = tools.task_create("ship it")["task_id"]
    tools.task_update(a, status="blocked", blocked_on="user", reason="which format?")
    tools.task_update(a, status="completed")
    assert [e for e, _ in events] == ["task_blocked"]
    tools.task_update(b, status="cancelled")
    assert events[-1] == ("session_closed", {"session_id": me, "task_id": b})
    rt.stop()
    with Runtime(db=db_url, clock=clock) as again:
        listed = again.tools_for(me).task_list()["tasks"]
        assert {t["task_id"]: (t["title"], t["status"]) for t in listed} == {
            a: ("write report", "completed"), b: ("ship it", "cancelled")}


def _worker_with_a_task(rt: Runtime) -> tuple[str, str, list[tuple[str, dict[str, Any]]]]:
    """Focal, and a worker it started with the task "step 1"; the ``session_closed``
    events heard from then on."""
    events: list[tuple[str, dict[str, Any]]] = []
    rt.subscribe(lambda e, d: events.append((e, d)) if e == "session_closed" else None)
    p = rt.create_project("p")
    focal = rt.get_or_create_focal_chat().id
    worker = rt.tools_for(focal).agent_send("new", "start", project_id=p.id, title="worker",
                                            task_title="step 1")["agent_id"]
    rt.run_until_idle()
    return focal, worker, events


def _finished(rt: Runtime, focal: str) -> list[dict[str, Any]]:
    """The "finished its last open task" notices Focal was sent."""
    return [r for r in rt.inbox(target=focal) if r["kind"] == "session_finished_notification"]


@pytest.mark.timeout(60)
def test_a_turn_that_finishes_a_task_and_starts_the_next_does_not_close_its_session(
        make_runtime: MakeRuntime) -> None:
    """A turn's task changes commit together: a session whose turn completed its step and
    created the next one (in that order, as a model works) never was without an open
    task. Its first change was judged alone, against the tasks committed so far: the
    session "closed" (``session_closed``), and Focal heard that a session it follows
    finished its last open task while that session went on with the next."""
    def brain(turn: Turn) -> None:
        if turn.messages[0].content == "next step":
            [step] = [t for t in turn.tools.task_list()["tasks"] if t["status"] != "completed"]
            turn.tools.task_update(step["task_id"], status="completed")
            turn.tools.task_create("step 2", status="in_progress")
        elif turn.messages[0].content == "wrap up":
            [step] = [t for t in turn.tools.task_list()["tasks"] if t["status"] != "completed"]
            turn.tools.task_update(step["task_id"], status="completed")

    rt = make_runtime(brain=brain)
    focal, worker, events = _worker_with_a_task(rt)
    rt.post(worker, "next step")
    rt.run_until_idle()
    finished = _finished(rt, focal)
    assert finished == [] and events == []
    rt.post(worker, "wrap up")  # the last open task closes: that is heard, once
    rt.run_until_idle()
    assert [d["session_id"] for _, d in events] == [worker]
    assert len(_finished(rt, focal)) == 1


@pytest.mark.timeout(60)
def test_a_turn_that_completes_a_task_and_then_reopens_it_does_not_close_its_session(
        make_runtime: MakeRuntime) -> None:
    """A model that marks its only task completed and then, in the same turn, takes it
    back (``in_progress``: it was not done after all) leaves its session with an open
    task. The first change was judged against the turn's other tasks only: the session
    "closed" (``session_closed``), and Focal heard that a session it follows finished
    while that session went on with the same task."""
    def brain(turn: Turn) -> None:
        if turn.messages[0].content == "check":
            [step] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(step["task_id"], status="completed")
            turn.tools.task_update(step["task_id"], status="in_progress",
                                   reason="a test still fails")
        elif turn.messages[0].content == "wrap up":
            [step] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(step["task_id"], status="completed")

    rt = make_runtime(brain=brain)
    focal, worker, events = _worker_with_a_task(rt)
    rt.post(worker, "check")
    rt.run_until_idle()
    assert [t["status"] for t in rt.tools_for(worker).task_list()["tasks"]] == ["in_progress"]
    finished = _finished(rt, focal)
    assert finished == [] and events == []
    rt.post(worker, "wrap up")  # now it is done: that is heard, once
    rt.run_until_idle()
    assert [d["session_id"] for _, d in events] == [worker]
    assert len(_finished(rt, focal)) == 1


@pytest.mark.timeout(60)
def test_a_turn_that_finishes_two_steps_in_a_row_closes_its_session_once(
        make_runtime: MakeRuntime) -> None:
    """A turn completes its step, creates the next one and completes that too: its
    session closes once, with its last change. The first change, judged against the
    tasks that existed then, closed it too: two ``session_closed`` events and two
    "finished its last open task" notices to Focal for one turn."""

    def brain(turn: Turn) -> None:
        if turn.messages[0].content == "two steps":
            [step] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(step["task_id"], status="completed")
            second = turn.tools.task_create("step 2", status="in_progress")
            turn.tools.task_update(second["task_id"], status="completed")

    rt = make_runtime(brain=brain)
    focal, worker, events = _worker_with_a_task(rt)
    rt.post(worker, "two steps")
    rt.run_until_idle()
    assert [t["status"] for t in rt.tools_for(worker).task_list()["tasks"]] == [
        "completed", "completed"]
    [second] = [t["task_id"] for t in rt.tools_for(worker).task_list()["tasks"]
                if t["title"] == "step 2"]
    assert events == [("session_closed", {"session_id": worker, "task_id": second})]
    finished = _finished(rt, focal)
    assert [r["payload"]["task_id"] for r in finished] == [second]


@pytest.mark.timeout(60)
def test_a_task_change_whose_write_outruns_its_wait_is_waited_for(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a turn a task change commits before the call returns. When its batch ran
    past the writer's wait, task_create raised WriteTimeout though the task could still
    be written, and then was: a caller that took the error for a failure and created the
    task again had two. The call now waits for its write's outcome, as a family send
    outside a turn does, and returns the task."""
    from kinbox.persistence import writer as writer_module

    from .helpers import SHORT, heard_from, hold_next_batch

    rt = make_runtime()
    me = rt.create_session(rt.create_project("p").id, "me").id
    tools = rt.tools_for(me)
    monkeypatch.setattr(writer_module, "WRITE_TIMEOUT", SHORT)
    monkeypatch.setattr(writer_module.GroupCommitWriter.call, "__defaults__", (SHORT,))
    heard = heard_from("slow-creator", monkeypatch)
    landed = threading.Event()
    answer: list[Any] = []

    def create() -> None:
        try:
            answer.append(tools.task_create("write the report"))
        except Exception as exc:
            answer.append(exc)

    creator = threading.Thread(name="slow-creator", target=create)
    hold_next_batch(rt.context.journal.writer, landed)  # the task's batch waits ...
    creator.start()
    wait_for(lambda: heard.is_set() or bool(answer), 10, "the write to outrun its wait")
    landed.set()  # ... then commits
    creator.join(10)
    monkeypatch.undo()
    assert isinstance(answer[0], dict), answer
    assert [t["task_id"] for t in tools.task_list()["tasks"]] == [answer[0]["task_id"]]


@pytest.mark.parametrize(("kwargs", "code", "fragment"), [
    ({"task_id": "task-nope", "status": "completed"}, "not_found", "does not exist"),
    ({"status": "done"}, "invalid_argument", "status must be one of"),
    ({"status": "blocked"}, "invalid_argument", "blocked_on='user'"),
    ({"status": "in_progress", "blocked_on": "user"}, "invalid_argument", "only for"),
    ({}, "invalid_argument", "at least one"),
    ({"reason": 3}, "invalid_argument", "reason must be a string"),
])
def test_bad_task_updates_change_nothing(make_runtime: MakeRuntime, kwargs: dict[str, Any],
                                         code: str, fragment: str) -> None:
    rt = make_runtime()
    me = rt.create_session(rt.create_project("p").id, "me").id
    tools = rt.tools_for(me)
    task = tools.task_create("t")
    kwargs = {"task_id": task["task_id"], **kwargs}
    err = refused(lambda: tools.task_update(**kwargs), code)
    assert fragment in err.message
    assert tools.task_list()["tasks"] == [task]


def test_a_session_cannot_update_another_sessions_task(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    p = rt.create_project("p")
    me, other = rt.create_session(p.id, "me").id, rt.create_session(p.id, "other").id
    theirs = rt.tools_for(other).task_create("theirs")["task_id"]
    refused(lambda: rt.tools_for(me).task_update(theirs, status="completed"), "not_found")


def test_a_turns_task_update_changes_only_what_it_names_at_its_commit(
        make_runtime: MakeRuntime) -> None:
    """A turn's reason-only update commits with the turn; it took the status from the row
    as the call read it, so a task the user completed while the turn ran was reopened
    (in_progress again, the session's close undone). A status the turn names still
    wins; a blocked_on that no longer fits keeps what the call checked."""
    noted, go = threading.Event(), threading.Event()
    ids: dict[str, str] = {}

    def brain(turn: Turn) -> None:
        turn.tools.task_update(ids["note"], reason="halfway there")
        turn.tools.task_update(ids["error"], blocked_on="error")
        noted.set()
        go.wait(10)
    rt = make_runtime(brain=brain)
    me = rt.create_session(rt.create_project("p").id, "me").id
    tools = rt.tools_for(me)
    ids["note"] = tools.task_create("note", status="in_progress")["task_id"]
    ids["error"] = tools.task_create("error", status="in_progress")["task_id"]
    tools.task_update(ids["error"], status="blocked", blocked_on="user")
    rt.post(me, "work")
    runner = threading.Thread(target=rt.run_until_idle)
    runner.start()
    assert noted.wait(10)
    tools.task_update(ids["note"], status="completed")  # the user, while the turn runs
    tools.task_update(ids["error"], status="in_progress")
    go.set()
    runner.join(20)
    note, error = rt.context.tasks.get(ids["note"]), rt.context.tasks.get(ids["error"])
    assert note is not None and (note.status, note.reason) == ("completed", "halfway there")
    assert error is not None and (error.status, error.blocked_on) == ("blocked", "error")


def test_tool_errors_read_as_tool_results() -> None:
    assert ToolError("not_found", "gone").to_dict() == {"error": "not_found", "message": "gone"}


def test_session_status_is_visible_while_a_turn_runs(make_runtime: MakeRuntime) -> None:
    started, release = threading.Event(), threading.Event()
    rt = make_runtime(brain=lambda turn: (started.set(), release.wait(10)))
    me = rt.create_session(rt.create_project("p").id, "me").id
    rt.post(me, "x")
    assert started.wait(10)
    wait_for(lambda: rt.session(me).status == "active", what="status active")  # type: ignore[union-attr]
    release.set()
    rt.run_until_idle()
    assert rt.session(me).status == "idle"  # type: ignore[union-attr]


# -- a child task that ends outside a turn (A1) ------------------------------------------------

def _child_waits_for_its_stop(running: threading.Event, timeout: float) -> Callable[[Turn], None]:
    """A brain whose sub-agents say they run (a reply: a turn the runtime's stop ends with
    nothing said is handed back whole, not committed and resumed), then wait for their stop
    (a long model call that heeds it); every other session says nothing."""
    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            turn.reply("working on it")
            running.set()
            turn.wait_stop_requested(timeout)
    return brain


def _children_fail(turn: Turn) -> None:
    """A brain whose sub-agents' model is down; every other session says nothing."""
    if turn.session_id.startswith("subagent-"):
        raise RuntimeError("the model is down")


def _child_settles_then_waits(settled: str, running: threading.Event,
                              heard: list[tuple[str, str]],
                              task_turns: list[str] | None = None) -> Callable[[Turn], None]:
    """A brain whose sub-agent settles its task (``completed``, or ``blocked`` on the user),
    says it runs, waits for its stop (a last model call) and replies; the parent notes the
    outcomes it hears in ``heard``, and ``task_turns`` the child's turns' messages."""
    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            if task_turns is not None:
                task_turns.append(turn.messages[0].message_id)
            [task] = turn.tools.task_list()["tasks"]
            if settled == "completed":
                turn.tools.task_update(task["task_id"], status="completed")
            else:
                turn.tools.task_update(task["task_id"], status="blocked", blocked_on="user",
                                       reason="which format?")
            running.set()
            turn.wait_stop_requested(30)
            turn.reply(f"{settled} it")
        else:
            heard.extend((m.payload.get("outcome", ""), m.content) for m in turn.messages
                         if m.kind == "subagent_result")
    return brain


def _parent_with_a_child(rt: Runtime) -> tuple[str, str, str]:
    parent = rt.create_session(rt.create_project("p").id, "parent", session_id="parent").id
    spawned = rt.tools_for(parent).agent(description="clean up")
    return parent, spawned["agent_id"], spawned["task_id"]


def _wakeups(rt: Runtime, parent: str) -> list[tuple[str, str]]:
    return [(r["payload"]["outcome"], r["content"]) for r in rt.inbox(target=parent)
            if r["kind"] == "subagent_result"]


def test_an_operator_cancelling_a_child_task_tells_its_parent(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()  # send-only: the child's task waits, nothing runs it
    parent, child, task_id = _parent_with_a_child(rt)
    rt.cancel(f"subagent-task-{task_id}", "not needed any more")
    assert rt.context.tasks.get(task_id).status == "cancelled"  # type: ignore[union-attr]
    [(outcome, text)] = _wakeups(rt, parent)
    assert outcome == "cancelled" and child in text and "not needed any more" in text


@pytest.mark.timeout(60)
def test_a_child_task_cancelled_from_another_process_tells_its_parent_while_running(
        make_runtime: MakeRuntime, clock: ManualClock, db_url: str) -> None:
    """``kinbox inbox cancel`` of a child's task row writes the journal from its own
    process; the delivering runtime never saw it, and the parent heard only at the next
    start. The runtime looks for such ends every REPORT_INTERVAL."""
    rt = make_runtime(brain=_children_fail)  # each child task waits out a backoff
    parent, child, task_id = _parent_with_a_child(rt)
    mid = f"subagent-task-{task_id}"
    wait_for(lambda: rt.inbox(target=child)[0]["attempts"] == 1, 10, "the first attempt")
    operator = Stores(db_url)  # the command line's own connection, as `inbox cancel` does
    try:
        operator.journal.cancel(mid, clock.now(), by="operator", reason="not needed")
    finally:
        operator.close()
    assert _wakeups(rt, parent) == []
    clock.advance(REPORT_INTERVAL)
    wait_for(lambda: [o for o, _ in _wakeups(rt, parent)] == ["cancelled"], 10,
             "the parent's wake-up")
    assert rt.context.tasks.get(task_id).status == "cancelled"  # type: ignore[union-attr]


def _a_child_task_that_died_five_times(db_url: str, clock: ManualClock,
                                      make_runtime: MakeRuntime) -> tuple[str, str]:
    """A parent and its child's task, whose turn died with its process five times (the
    next claim makes the row failed); the clock past the last lease."""
    first = make_runtime()
    parent, _, task_id = _parent_with_a_child(first)
    first.stop()
    prepared, mid, now = Stores(db_url), f"subagent-task-{task_id}", clock.now()
    try:
        for death in range(5):
            assert [r.message_id for r in prepared.journal.claim(
                f"dead-{death}", now, lease=1).rows] == [mid]
            prepared.journal.mark_turn_started(f"dead-{death}", mid, now)
            now += 10
    finally:
        prepared.close()
    clock.advance(now - clock.now())
    return parent, task_id


def test_a_child_task_failed_by_its_takeovers_tells_its_parent(
        db_url: str, clock: ManualClock, make_runtime: MakeRuntime) -> None:
    """Its turn died with its process five times: the sixth claim makes the row failed,
    and no turn commits to report it."""
    parent, task_id = _a_child_task_that_died_five_times(db_url, clock, make_runtime)
    seen: list[str] = []
    rt = make_runtime(brain=lambda turn: seen.extend(m.kind for m in turn.messages))
    rt.run_until_idle()
    assert rt.inbox(target=rt.session(parent).id)[0]["kind"] == "subagent_result"  # type: ignore[union-attr]
    assert [o for o, _ in _wakeups(rt, parent)] == ["failed"]
    assert seen == ["subagent_result"]  # the parent's turn ran; the child's never did
    task = rt.context.tasks.get(task_id)
    assert task is not None and (task.status, task.blocked_on) == ("blocked", "error")


@pytest.mark.timeout(60)
def test_run_until_idle_waits_for_the_report_of_a_task_its_claim_failed(
        db_url: str, clock: ManualClock, make_runtime: MakeRuntime,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim that fails a child's task row commits, and the parent's wake-up commits
    after it, in a transaction of its own. ``is_idle`` read the slot board (no claim
    yet), then the journal between those two commits (nothing runnable): idle, and
    ``run_until_idle`` returned before the parent heard (once in 300 runs of the test
    above on a loaded machine). Here the claim runs in exactly that gap."""
    parent, _ = _a_child_task_that_died_five_times(db_url, clock, make_runtime)
    looked, reporting, checked = threading.Event(), threading.Event(), threading.Event()
    in_the_gap: list[bool] = []

    def after_the_look(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            looked.wait(10)  # the dispatcher's first wake and claim come after the board's read
            return real(*args, **kwargs)
        return call

    def report_after_the_check(ctx: Any, message_ids: Any) -> int:
        if looked.is_set():  # the claim's report, not the start's look for orphans
            reporting.set()  # the claim that failed the row has committed
            checked.wait(10)
        return real_report(ctx, message_ids)

    real_report = subagents.report_ended
    monkeypatch.setattr(Slots, "wake", after_the_look(Slots.wake))
    monkeypatch.setattr(Slots, "claim_window", after_the_look(Slots.claim_window))
    monkeypatch.setattr(subagents, "report_ended", report_after_the_check)
    seen: list[str] = []
    rt = make_runtime(brain=lambda turn: seen.extend(m.kind for m in turn.messages))
    journal = rt.context.journal
    real_has_due = journal.has_due

    def has_due(now: float) -> bool:
        if not looked.is_set():  # the first look: the board said no claim, no turn
            looked.set()
            in_the_gap.append(reporting.wait(10))
            try:
                return real_has_due(now)
            finally:
                checked.set()
        return real_has_due(now)

    monkeypatch.setattr(journal, "has_due", has_due)
    rt.run_until_idle()
    assert in_the_gap == [True]  # the journal was read between the two commits
    assert [o for o, _ in _wakeups(rt, parent)] == ["failed"]
    assert seen == ["subagent_result"]


def test_a_start_reports_a_cancel_whose_report_a_crash_lost(
        db_url: str, make_runtime: MakeRuntime, clock: ManualClock) -> None:
    first = make_runtime()
    parent, _, task_id = _parent_with_a_child(first)
    first.stop()
    prepared = Stores(db_url)  # the cancel as it stood when the process died
    try:
        prepared.journal.cancel(f"subagent-task-{task_id}", clock.now(), by="operator",
                                reason="wrong child")
    finally:
        prepared.close()
    rt = make_runtime()
    assert [o for o, _ in _wakeups(rt, parent)] == ["cancelled"]
    assert rt.context.tasks.get(task_id).status == "cancelled"  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_start_reports_a_cancel_of_a_handed_back_task_whose_report_a_crash_lost(
        db_url: str, make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """Two deploys stopped the child: its task is now in its second hand-back message.
    That row was cancelled and the process died before the report; a start looked at the
    task's first message only (done), so the task stayed open and the parent never
    heard."""
    running = threading.Event()
    child_waits_for_its_stop = _child_waits_for_its_stop(running, 30)
    rt = make_runtime(brain=child_waits_for_its_stop)
    parent, _, task_id = _parent_with_a_child(rt)
    for deploy in range(2):
        assert running.wait(10)
        running.clear()
        rt.stop()
        if deploy == 0:
            rt = make_runtime(brain=child_waits_for_its_stop)
    last = f"subagent-task-{task_id}-resumed-2"
    prepared = Stores(db_url)  # the cancel as it stood when the process died
    try:
        assert prepared.journal.get(last)["status"] == "pending"
        prepared.journal.cancel(last, clock.now(), by="operator", reason="wrong child")
    finally:
        prepared.close()
    again = make_runtime()
    [(outcome, text)] = _wakeups(again, parent)
    assert outcome == "cancelled" and "wrong child" in text
    assert again.context.tasks.get(task_id).status == "cancelled"  # type: ignore[union-attr]


def test_a_child_running_when_the_runtime_stops_goes_on_after_the_restart(
        make_runtime: MakeRuntime) -> None:
    """A graceful stop (a deploy) asks running turns to stop; a child's task was then
    cancelled and its parent told it was 'stopped by runtime': the work ended for good
    where a crash would have replayed it."""
    running = threading.Event()
    heard: list[tuple[str, str]] = []

    def first_life(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            running.set()
            turn.wait_stop_requested(30)
            turn.reply("half the files cleaned")

    def second_life(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            turn.reply(f"all clean: {turn.messages[0].content}")
        else:
            heard.extend((m.payload.get("outcome", ""), m.content) for m in turn.messages
                         if m.kind == "subagent_result")

    rt = make_runtime(brain=first_life)
    _, child, task_id = _parent_with_a_child(rt)
    assert running.wait(10)
    rt.stop()
    assert rt.context.tasks.get(task_id).status == "in_progress"  # type: ignore[union-attr]
    again = make_runtime(brain=second_life)
    again.run_until_idle()
    assert heard == [("completed", "all clean: clean up")]
    assert again.context.tasks.get(task_id).status == "completed"  # type: ignore[union-attr]
    assert [e.text for e in again.transcript(child) if e.role == "assistant"] == [
        "half the files cleaned", "all clean: clean up"]


@pytest.mark.parametrize("settled", ["completed", "blocked"])
def test_a_child_that_settled_its_task_before_a_deploy_stopped_it_is_not_run_again(
        make_runtime: MakeRuntime, settled: str) -> None:
    """The child completed its task (or asked the user) and was then stopped by a graceful
    stop: its task was handed back anyway and run again after the restart, every effect
    twice. What it did stands and is reported once."""
    running = threading.Event()
    task_turns: list[str] = []
    heard: list[tuple[str, str]] = []

    # the child's last model call (the summary) is where a deploy stops it
    brain = _child_settles_then_waits(settled, running, heard, task_turns)
    rt = make_runtime(brain=brain)
    _, _, task_id = _parent_with_a_child(rt)
    assert running.wait(10)
    rt.stop()
    again = make_runtime(brain=brain)
    again.run_until_idle()
    assert len(task_turns) == 1, task_turns
    assert heard == [(settled, f"{settled} it")]
    assert again.context.tasks.get(task_id).status == settled  # type: ignore[union-attr]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stopper", ["parent", "sibling"])
@pytest.mark.parametrize("settled", ["completed", "blocked"])
def test_a_child_that_settled_its_task_before_a_stop_keeps_and_reports_it(
        make_runtime: MakeRuntime, stopper: str, settled: str) -> None:
    """The child completed its task (or asked the user) and was stopped while it wrote
    its summary: the stop turned the task it had settled into ``cancelled`` and told
    the parent it was stopped (or nothing, stopped by the parent), as a deploy's stop
    once did. What it did stands and its parent hears it, once."""
    running = threading.Event()
    heard: list[tuple[str, str]] = []

    rt = make_runtime(brain=_child_settles_then_waits(settled, running, heard))
    parent, child, task_id = _parent_with_a_child(rt)
    sibling = rt.create_session(rt.session(parent).project_id, "sibling").id  # type: ignore[union-attr,arg-type]
    assert running.wait(10)
    rt.tools_for(parent if stopper == "parent" else sibling).agent_stop(child)
    rt.run_until_idle()
    assert heard == [(settled, f"{settled} it")]
    assert rt.context.tasks.get(task_id).status == settled  # type: ignore[union-attr]


@pytest.mark.timeout(60)
def test_a_foreground_agent_call_after_the_turn_ended_is_refused_and_starts_nothing(
        make_runtime: MakeRuntime) -> None:
    """A thread the brain left running asks for a foreground child after the turn ended: it
    commits at once, not with the turn, so only this check keeps it from starting one."""
    ended = threading.Event()
    late: list[object] = []
    held: list[Any] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("child ran")
            return
        held.append(turn.tools)

        def lingering() -> None:
            ended.wait(10)
            try:
                late.append(held[0].agent("late work", run_in_background=False, timeout=5))
            except ToolError as exc:
                late.append(exc)
        threading.Thread(target=lingering, daemon=True).start()
        turn.reply("done")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    rt.create_session(rt.create_project("p").id, "A", session_id="a")
    rt.post("a", "go")
    rt.run_until_idle()
    ended.set()
    wait_for(lambda: bool(late), timeout=20, what="the late call")
    assert isinstance(late[0], ToolError) and "This turn has ended" in late[0].message
    assert [s.id for s in rt.sessions() if s.kind == "subagent"] == []


def _asks_for_the_report(results: dict[str, Any]) -> Callable[[Turn], None]:
    """A brain whose sessions ask a foreground child for "the report" (noting what the
    call returned, per session), and whose children answer it."""
    def brain(turn: Turn) -> None:
        if turn.session_id.startswith("subagent-"):
            turn.reply(f"result for {turn.messages[0].content}")
        elif turn.messages[0].kind == "agent_message":
            results[turn.session_id] = turn.tools.agent("the report", run_in_background=False,
                                                        timeout=20)
    return brain


@pytest.mark.timeout(60)
def test_a_foreground_child_id_another_session_holds_is_not_taken_as_this_turns_child(
        make_runtime: MakeRuntime) -> None:
    """A foreground child's id is derived from its turn (so a retried attempt finds the
    child it started): a session of that id that is not the caller's child, another
    project's, is not handed to the caller, nor is its result."""
    from kinbox.actors.outbox import Outbox, foreground_child_id

    results: dict[str, Any] = {}
    rt = make_runtime(brain=_asks_for_the_report(results), max_active_sessions=4)
    one, two = rt.create_project("one"), rt.create_project("two")
    rt.create_session(one.id, "Alice", session_id="alice")
    rt.create_session(two.id, "Bob", session_id="bob")
    taken = foreground_child_id(Outbox("msg-B").child_key("the report"))  # Bob's turn's
    rt.create_session(one.id, "Alice's child", kind="subagent", parent_id="alice",
                      session_id=taken)
    rt.post("bob", "go", message_id="msg-B")
    rt.run_until_idle(30)
    child = rt.session(results["bob"]["agent_id"])
    assert child is not None and child.id != taken
    assert (child.parent_id, child.project_id) == ("bob", two.id)
    assert results["bob"]["result"] == "result for the report"


@pytest.mark.timeout(60)
def test_a_tool_call_of_a_turn_wrapping_up_in_a_graceful_stop_gets_a_result(
        make_runtime: MakeRuntime) -> None:
    """A model loop calling tools by name while a deploy stops the runtime gets an error
    result it can read, not an exception through the loop; its turn still commits."""
    running = threading.Event()
    got: list[Any] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            return
        running.set()
        turn.wait_stop_requested(30)
        try:
            got.append(turn.tools.call("task_create", {"title": "resume the migration"}))
        except Exception as exc:
            got.append(exc)
        turn.reply("stopping here")

    rt = make_runtime(brain=brain)
    rt.create_session(rt.create_project("p").id, "A", session_id="a")
    rt.post("a", "go")
    assert running.wait(10)
    rt.stop()
    assert [e.text for e in rt.transcript("a")][-1] == "stopping here"
    assert isinstance(got[0], dict) and got[0]["error"] == "execution_failed", got


@pytest.mark.timeout(60)
def test_a_child_that_completes_its_task_after_the_user_unblocks_it_tells_its_parent(
        make_runtime: MakeRuntime) -> None:
    def brain(turn: Turn) -> None:
        if not turn.session_id.startswith("subagent-"):
            return
        first = turn.messages[0]
        if first.kind == "subagent_task":
            turn.tools.task_update(first.payload["task_id"], status="blocked",
                                   blocked_on="user", reason="which format?")
            turn.reply("Which format do you want?")
        else:  # the user's answer
            [task] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(task["task_id"], status="completed")
            turn.reply(f"report written as {first.content}")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    lead = rt.create_session(p.id, "Lead").id
    child = rt.tools_for(lead).agent("write the report")
    rt.run_until_idle()
    wakes = [r for r in rt.inbox(target=lead) if r["kind"] == "subagent_result"]
    assert [w["payload"]["outcome"] for w in wakes] == ["blocked"]
    rt.post(child["agent_id"], "csv")            # the user answers the child
    rt.run_until_idle()
    assert rt.tools_for(child["agent_id"]).task_list()["tasks"][0]["status"] == "completed"
    wakes = [r for r in rt.inbox(target=lead) if r["kind"] == "subagent_result"]
    # A1: the child's completion wakes its parent, as its block did.
    assert [w["payload"]["outcome"] for w in wakes] == ["blocked", "completed"]



@pytest.mark.timeout(60)
def test_a_child_that_resumes_after_the_user_answers_and_completes_later_tells_its_parent(
        make_runtime: MakeRuntime) -> None:
    """A child whose parent heard "blocked" takes the user's answer in one turn (its task
    back to ``in_progress``: it works on) and completes the task in a later turn. Only a
    completion straight from ``blocked`` was reported: the parent, told its child waits
    on the user, never heard that the work was done."""
    def brain(turn: Turn) -> None:
        if not turn.session_id.startswith("subagent-"):
            return
        first = turn.messages[0]
        [task] = turn.tools.task_list()["tasks"]
        if first.kind == "subagent_task":
            turn.tools.task_update(task["task_id"], status="blocked", blocked_on="user",
                                   reason="which format?")
            turn.reply("Which format do you want?")
        elif first.content == "csv":  # the user's answer: back to work
            turn.tools.task_update(task["task_id"], status="in_progress", reason="")
            turn.reply("writing it as csv")
        else:
            turn.tools.task_update(task["task_id"], status="completed")
            turn.reply("report written")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    lead = rt.create_session(p.id, "Lead").id
    child = rt.tools_for(lead).agent("write the report")
    rt.run_until_idle()
    rt.post(child["agent_id"], "csv")
    rt.run_until_idle()
    rt.post(child["agent_id"], "done?")
    rt.run_until_idle()
    assert rt.tools_for(child["agent_id"]).task_list()["tasks"][0]["status"] == "completed"
    wakes = [r for r in rt.inbox(target=lead) if r["kind"] == "subagent_result"]
    assert [(w["payload"]["outcome"], w["content"]) for w in wakes] == [
        ("blocked", "Which format do you want?"), ("completed", "report written")]
    rt.post(child["agent_id"], "thanks")  # completed again: nothing new to tell
    rt.run_until_idle()
    assert len([r for r in rt.inbox(target=lead) if r["kind"] == "subagent_result"]) == 2

def test_a_wakeup_at_the_last_second_before_the_year_10000_is_taken_and_survives_a_restart(
        db_url: str, clock: ManualClock, tmp_path: Path) -> None:
    """``LATEST_WAKEUP`` is "the last time a one-shot wake-up may be set for", yet the
    check was ``< LATEST_WAKEUP``: 9999-12-31T23:59:59Z was refused as "not before the
    year 10000"."""
    with Runtime(db=db_url, brain=quiet_brain, clock=clock, data_dir=tmp_path) as rt:
        rt.get_or_create_focal_chat()
        tools = rt.tools_for("focal-suzent")
        job = tools.schedule_wakeup("reminder", at="9999-12-31T23:59:59Z")
        assert job["run_at"] == LATEST_WAKEUP
        refused(lambda: tools.schedule_wakeup("reminder", at=LATEST_WAKEUP + 1),
                "invalid_argument")
    with Runtime(db=db_url, brain=quiet_brain, clock=clock, data_dir=tmp_path) as again:
        assert [w["run_at"] for w in again.focal.panel()["wakeups"]] == [LATEST_WAKEUP]


@pytest.mark.timeout(60)
def test_a_foreground_child_id_the_callers_other_child_holds_is_not_taken_as_this_one(
        make_runtime: MakeRuntime) -> None:
    """The derived id of a foreground child held by another child of the same caller (one
    started for other work) is not the child this call asked for: its task and result
    are not handed to the caller."""
    from kinbox.actors.outbox import Outbox, foreground_child_id

    results: dict[str, Any] = {}
    rt = make_runtime(brain=_asks_for_the_report(results), max_active_sessions=4)
    one = rt.create_project("one")
    rt.create_session(one.id, "Bob", session_id="bob")
    taken = foreground_child_id(Outbox("msg-B").child_key("the report"))  # Bob's turn's
    rt.create_session(one.id, "Bob's other child", kind="subagent", parent_id="bob",
                      session_id=taken)
    rt.post("bob", "go", message_id="msg-B")
    rt.run_until_idle(30)
    assert results["bob"]["agent_id"] != taken
    assert results["bob"]["result"] == "result for the report"
