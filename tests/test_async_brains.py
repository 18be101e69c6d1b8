"""Async and sync brains through the same contract: each behaviour is written once, as an
``async def`` over awaitable tools, and run either as a real ``async def`` brain on the
runtime's event loop or inside a plain sync brain that blocks its thread."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, RuntimeStateError, ToolError, Turn
from kinbox.actors.async_host import STOP_SLACK
from kinbox.actors.focal import FOCAL_TITLE
from kinbox.actors.running import RUNTIME_STOP
from kinbox.actors.tools import NO_AGENT_TOOLS
from kinbox.persistence import NewMessage

from .conftest import Stores
from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]
Behaviour = Callable[[Turn, Any], Awaitable[None]]


class Blocking:
    """Sync tools behind the awaitable interface: each call runs, then returns a done value."""

    def __init__(self, tools: Any) -> None:
        self._tools = tools

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._tools, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)
        return call


def brain_of(flavour: str, behaviour: Behaviour) -> Callable[[Turn], Any]:
    """``behaviour`` as an async brain, or as a sync brain that blocks its session thread."""
    if flavour == "async":
        async def async_brain(turn: Turn) -> None:
            await behaviour(turn, turn.tools)
        return async_brain

    def sync_brain(turn: Turn) -> None:
        asyncio.run(behaviour(turn, Blocking(turn.tools)))
    return sync_brain


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def team(rt: Runtime) -> tuple[str, str]:
    project = rt.project("team") or rt.create_project("team")
    return rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id


def ignoring_stops(started: threading.Event) -> Callable[[Turn], Awaitable[None]]:
    """An async brain that replies "halfway", sets ``started`` and ignores every stop."""
    async def brain(turn: Turn) -> None:
        turn.reply("halfway")
        started.set()
        await asyncio.Event().wait()

    return brain


def after_stop(db_url: str, session_id: str, message_id: str
               ) -> tuple[tuple[str, int], list[str], int]:
    """What the database holds once a runtime stopped: the row's status and attempts, the
    session's transcript, the row's committed turns."""
    stores = Stores(db_url)
    try:
        row = stores.journal.get(message_id)
        return ((row["status"], row["attempts"]),
                [e.text for e in stores.store.transcript(session_id)],
                stores.store.marker_counts().get(message_id, 0))
    finally:
        stores.close()


def committed_as_stopped(rt: Runtime, session_id: str, message_id: str) -> None:
    """The stopped turn of ``message_id`` (its reply "halfway") ended committed, once, not
    as a failed attempt."""
    wait_for(lambda: rt.inbox()[0]["status"] != "processing", what="the stopped turn's end")
    assert (rt.inbox()[0]["status"], rt.inbox()[0]["attempts"]) == ("delivered", 0)
    assert [e.text for e in rt.transcript(session_id)] == ["long", "halfway"]
    assert rt.marker_counts() == {message_id: 1}


def test_turns_run_in_order_once_each(make_runtime: MakeRuntime, flavour: str) -> None:
    async def behaviour(turn: Turn, tools: Any) -> None:
        await asyncio.sleep(0)
        turn.reply(f"got {turn.messages[0].content}")

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, b = team(rt)
    ids = [rt.post(b, f"m{i}", sender=a).message_id for i in range(30)]
    rt.run_until_idle()
    assert [e.text for e in rt.transcript(b) if e.role == "assistant"] == [
        f"got m{i}" for i in range(30)]
    assert rt.marker_counts() == dict.fromkeys(ids, 1)


def test_tools_are_awaitable_and_keep_their_rules(make_runtime: MakeRuntime,
                                                  flavour: str) -> None:
    seen: list[object] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        if turn.messages[0].sender_id is None:
            me = turn.session_id
            other = next(x["agent_id"] for x in (await tools.agent_list())["agents"]
                         if x["agent_id"] != me)
            seen.append(await tools.agent_send(other, "ping"))
            try:
                await tools.agent_send(me, "to myself")
            except ToolError as exc:
                seen.append(exc.code)
            task = await tools.task_create("reply to the ping", status="in_progress")
            seen.append((await tools.task_update(task["task_id"], status="completed"))["status"])
        else:
            turn.reply("pong")

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, b = team(rt)
    rt.post(a, "start")
    rt.run_until_idle()
    receipt, refusal, status = seen
    assert receipt["status"] == "pending" and refusal == "invalid_argument"  # type: ignore[index]
    assert status == "completed"
    assert [e.text for e in rt.transcript(b)] == ["ping", "pong"]


def test_steering_reaches_the_running_turn(make_runtime: MakeRuntime, flavour: str) -> None:
    started = threading.Event()
    release = threading.Event()

    async def behaviour(turn: Turn, tools: Any) -> None:
        started.set()
        # A model call that ends when the test says so (waiting on the event, off the loop).
        assert await asyncio.to_thread(release.wait, 10)
        more = await turn.asteering()
        turn.reply(f"saw {[m.content for m in turn.messages + more]}")

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, b = team(rt)
    rt.post(b, "first", sender=a)
    assert started.wait(10)
    second = rt.post(b, "second", sender=a).message_id
    release.set()
    rt.run_until_idle()
    assert [e.text for e in rt.transcript(b)][-1] == "saw ['first', 'second']"
    assert rt.marker_counts()[second] == 1


def test_agent_stop_ends_the_running_turn(make_runtime: MakeRuntime, flavour: str) -> None:
    started = threading.Event()

    async def behaviour(turn: Turn, tools: Any) -> None:
        started.set()
        stopped = await turn.stopped(30)
        turn.reply("stopped early" if stopped else "ran out")

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, b = team(rt)
    rt.post(b, "long job", sender=a)
    assert started.wait(10)
    assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
    rt.run_until_idle()
    assert rt.transcript(b)[-1].text == "stopped early"


def test_a_raising_brain_is_retried_with_backoff_on_the_injected_clock(
        make_runtime: MakeRuntime, clock: ManualClock, flavour: str) -> None:
    calls: list[float] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        calls.append(clock.now())
        if len(calls) <= 2:
            raise RuntimeError("model timeout")
        turn.reply("finally")

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, b = team(rt)
    rt.post(b, "work", sender=a)
    rt.run_until_idle()
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert row["last_error"].rstrip().endswith("RuntimeError: model timeout")
    clock.advance(2)
    rt.run_until_idle()
    clock.advance(4)
    rt.run_until_idle()
    assert rt.inbox()[0]["status"] == "delivered"
    assert [c - calls[0] for c in calls] == [0, 2, 6]
    assert [e.text for e in rt.transcript(b)] == ["work", "finally"]


def test_steering_a_brain_stopped_waiting_for_is_not_lost_but_runs_next(
        make_runtime: MakeRuntime) -> None:
    """``asyncio.wait_for(turn.asteering(), ...)`` timing out (or a stop cancelling it)
    while the rows were fetched: they were acknowledged with the turn though its brain
    never saw them, and were in no transcript: lost."""
    rt: Runtime
    seen: list[list[str]] = []

    async def brain(turn: Turn) -> None:
        if turn.messages[0].content == "first":
            rt.post(turn.session_id, "steer-me")  # committed: the next fetch finds it
            waiting = asyncio.ensure_future(turn.asteering())
            await asyncio.sleep(0)  # the fetch is on its worker
            waiting.cancel()  # the brain stops waiting for it
            await asyncio.gather(waiting, return_exceptions=True)
        seen.append([m.content for m in turn.all_messages])
        turn.reply("ok")

    rt = make_runtime(brain=brain)
    a, _ = team(rt)
    rt.post(a, "first")
    rt.run_until_idle()
    assert seen == [["first"], ["steer-me"]]
    assert [e.text for e in rt.transcript(a)] == ["first", "ok", "steer-me", "ok"]
    assert [(r["content"], r["status"], r["attempts"]) for r in rt.inbox()] == [
        ("first", "delivered", 0), ("steer-me", "delivered", 0)]


class Custom(BaseException):
    """A BaseException of a library's own."""


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, Custom,
                                    asyncio.CancelledError])
def test_a_brain_raising_a_base_exception_fails_its_attempt_and_nothing_else(
        make_runtime: MakeRuntime, clock: ManualClock, flavour: str,
        raised: type[BaseException]) -> None:
    """An async brain's KeyboardInterrupt or SystemExit left its task and ended the event
    loop: every async turn of the runtime stopped, rows stayed ``processing``. A sync
    brain's left its row ``processing`` for good. A CancelledError the brain raises on its
    own (nobody cancelled it) is its error, not a stop it ignored."""
    calls: list[str] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        calls.append(turn.messages[0].content)
        if calls.count("boom") == 1 and turn.messages[0].content == "boom":
            raise raised("the brain blew up")
        turn.reply("ok " + turn.messages[0].content)

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, b = team(rt)
    rt.post(a, "boom")
    rt.run_until_idle()
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert raised.__name__ in row["last_error"] and "ignored its stop" not in row["last_error"]
    rt.post(b, "hello")  # the runtime goes on delivering
    rt.run_until_idle()
    clock.advance(2)
    rt.run_until_idle()
    assert {r["content"]: r["status"] for r in rt.inbox()} == {"boom": "delivered",
                                                               "hello": "delivered"}
    assert [e.text for e in rt.transcript(a)] == ["boom", "ok boom"]


class Unprintable(Exception):
    """An exception whose text cannot be read (a library's ``__str__`` that raises)."""

    def __str__(self) -> str:
        raise ValueError("no text")


@pytest.mark.timeout(60)
def test_a_brain_raising_an_exception_whose_str_fails_is_a_failed_attempt(
        make_runtime: MakeRuntime, clock: ManualClock, flavour: str) -> None:
    """Recording the attempt's error read ``str(error)``: an exception whose ``__str__``
    raised failed the recording, and the row stayed ``processing`` (its session stuck)
    until its lease ran out."""
    calls: list[str] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        calls.append(turn.messages[0].content)
        if len(calls) == 1:
            raise Unprintable()
        turn.reply("ok")

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    a, _ = team(rt)
    rt.post(a, "boom")
    rt.run_until_idle(timeout=30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "Unprintable" in row["last_error"]
    clock.advance(2)
    rt.run_until_idle(timeout=30)
    assert [e.text for e in rt.transcript(a)] == ["boom", "ok"]


def test_a_sub_agent_wakes_its_parent(make_runtime: MakeRuntime, flavour: str) -> None:
    async def behaviour(turn: Turn, tools: Any) -> None:
        message = turn.messages[0]
        if turn.session_id.startswith("subagent-"):
            turn.reply("child: done")
        elif message.kind == "subagent_result":
            turn.reply(f"parent heard: {message.content}")
        else:
            await tools.agent(description="clean up")

    rt = make_runtime(brain=brain_of(flavour, behaviour), max_active_sessions=2)
    a, _ = team(rt)
    rt.post(a, "delegate")
    rt.run_until_idle()
    assert rt.transcript(a)[-1].text == "parent heard: child: done"


def test_a_foreground_sub_agent_returns_its_reply(make_runtime: MakeRuntime,
                                                  flavour: str) -> None:
    results: list[dict[str, Any]] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        if turn.session_id.startswith("subagent-"):
            turn.reply("42 files")
        elif turn.messages[0].kind != "subagent_result":
            results.append(await tools.agent(description="count", run_in_background=False,
                                             timeout=30))

    rt = make_runtime(brain=brain_of(flavour, behaviour), max_active_sessions=2)
    a, _ = team(rt)
    rt.post(a, "how many?")
    rt.run_until_idle(timeout=30)
    assert [(r["status"], r["result"]) for r in results] == [("completed", "42 files")]


@pytest.mark.timeout(60)
def test_a_sync_foreground_agent_call_on_the_event_loop_is_refused_before_it_starts(
        make_runtime: MakeRuntime) -> None:
    """``turn.tools.sync.agent(..., run_in_background=False)`` in an async brain waited on
    the loop's thread for the child, whose turn needs that loop: every async turn stood
    still for the call's whole timeout (300 s by default), then it failed anyway. Every
    sync tool is refused on the loop (``state="event_loop"``), this one before it starts;
    a model's call by name gets the refusal as its result."""
    answers: list[Any] = []

    async def brain(turn: Turn) -> None:
        if turn.messages[0].content != "delegate":
            turn.reply("done")
        else:
            answers.append(turn.tools.sync.call("agent", {
                "description": "count", "run_in_background": False, "timeout": 20})["error"])
            try:
                turn.tools.sync.agent("count", run_in_background=False, timeout=20)
            except RuntimeStateError as exc:
                answers.append(exc.state)

    rt = make_runtime(brain=brain, max_active_sessions=4)
    a, b = team(rt)
    rt.post(a, "delegate")
    rt.post(b, "hello")
    rt.run_until_idle(timeout=50)
    assert answers == ["execution_failed", "event_loop"]
    assert [e.text for e in rt.transcript(b)] == ["hello", "done"]
    assert [s.id for s in rt.sessions() if s.kind == "subagent"] == []
    assert rt.context.foreground_waits == 0


@pytest.mark.timeout(60)
def test_a_foreground_wait_ends_when_its_turn_is_asked_to_stop(make_runtime: MakeRuntime,
                                                               flavour: str) -> None:
    child_running, release = threading.Event(), threading.Event()
    errors: list[str] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        if turn.session_id.startswith("subagent-"):
            child_running.set()
            await asyncio.to_thread(release.wait, 30)
            turn.reply("late")
        elif turn.messages[0].kind != "subagent_result":
            try:
                await tools.agent(description="slow", run_in_background=False, timeout=50)
            except ToolError as exc:
                errors.append(exc.message)

    rt = make_runtime(brain=brain_of(flavour, behaviour), max_active_sessions=4)
    a, b = team(rt)
    rt.post(a, "delegate")
    assert child_running.wait(10)
    rt.tools_for(b).agent_stop(a)
    wait_for(lambda: bool(errors), timeout=10, what="the wait to end")
    assert errors[0].startswith("Stopped while waiting for sub-agent")
    release.set()
    rt.run_until_idle(timeout=30)
    assert rt.context.foreground_waits == 0


def test_a_sub_agent_starting_a_sub_agent_gets_the_no_recursion_tool_error(
        make_runtime: MakeRuntime, flavour: str) -> None:
    """T5: children never hold the agent tools. The awaitable ``agent`` asked the sub-agent's
    tools for ``start_child``, which they lack: a raw ``AttributeError`` reached the brain."""
    outcomes: list[tuple[str, str]] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        for background in (True, False):
            try:
                await tools.agent(description="recurse", run_in_background=background)
                outcomes.append(("started", ""))
            except ToolError as exc:
                outcomes.append((exc.code, exc.message))

    rt = make_runtime(brain=brain_of(flavour, behaviour), max_active_sessions=2)
    project = rt.create_project("fam")
    parent = rt.create_session(project.id, "Mira")
    child = rt.create_session(project.id, "Ben", kind="subagent", parent_id=parent.id)
    rt.post(child.id, "go")
    rt.run_until_idle()
    assert outcomes == [("execution_failed", NO_AGENT_TOOLS)] * 2
    assert {s.id for s in rt.sessions(project.id)} == {child.id, parent.id}
    assert rt.context.foreground_waits == 0


def test_family_rate_limits_hold(make_runtime: MakeRuntime, flavour: str) -> None:
    errors: list[str] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        if turn.messages[0].sender_id is None:
            for n in range(4):
                try:
                    await tools.send(f"note {n}", receiver_role="parent")
                except ToolError as exc:
                    errors.append(exc.message)

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    project = rt.create_project("fam")
    parent = rt.create_session(project.id, "Mira")
    child = rt.create_session(project.id, "Ben", kind="subagent", parent_id=parent.id)
    rt.post(child.id, "go")
    rt.run_until_idle()
    assert len(errors) == 1 and errors[0].startswith("Rate limit")


def test_focal_turns_get_the_focal_policy(make_runtime: MakeRuntime, flavour: str) -> None:
    requests: list[Any] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        if turn.session_id == "focal-suzent":
            requests.append(turn.request)

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    rt.focal.register_tool("bash", group="shell")
    chat = rt.get_or_create_focal_chat()
    rt.post(chat.id, "what is going on?")
    rt.run_until_idle()
    [request] = requests
    assert "bash" in request.denied_tools and "schedule_wakeup" in request.tools


# -- async only ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_two_thousand_waiting_async_turns_run_on_a_bounded_number_of_threads(
        make_runtime: MakeRuntime) -> None:
    release = asyncio.Event()
    waiting = [0]
    peak_threads = [0]
    loop_box: list[asyncio.AbstractEventLoop] = []

    async def brain(turn: Turn) -> None:
        loop_box[:] = [asyncio.get_running_loop()]
        waiting[0] += 1
        peak_threads[0] = max(peak_threads[0], threading.active_count())
        await release.wait()  # every turn waits on "the model" at once
        turn.reply("done")

    rt = make_runtime(brain=brain)
    project = rt.create_project("many")
    sessions = [rt.create_session(project.id, f"s{i}").id for i in range(2000)]
    before = threading.active_count()
    for sid in sessions:
        rt.post(sid, "think")
    wait_for(lambda: waiting[0] == 2000, timeout=40, what="2,000 turns waiting at once")
    assert rt.statistics()["async_turns"] == 2000
    # The loop thread and at most 16 blocking workers, however many turns wait.
    assert threading.active_count() <= before + 17 and peak_threads[0] <= 32
    loop_box[0].call_soon_threadsafe(release.set)
    rt.run_until_idle(timeout=40)
    assert rt.statistics()["rows"] == {"delivered": 2000}


@pytest.mark.timeout(60)
def test_twenty_cron_runs_waiting_on_an_async_model_all_start_on_few_threads(
        make_runtime: MakeRuntime) -> None:
    """Cron runs and social events are direct turns; with an ``async def`` brain each held
    one of the direct turns' 4 threads while it awaited the model, so only 4 waited at once
    and the rest queued behind them. They are driven on the loop now: all 20 wait at once,
    on the loop and its (here 4) blocking workers (B1: a few threads for many waits)."""
    release = asyncio.Event()
    waiting: list[str] = []
    loop_box: list[asyncio.AbstractEventLoop] = []
    peak_threads = [0]

    async def brain(turn: Turn) -> None:
        loop_box[:] = [asyncio.get_running_loop()]
        waiting.append(turn.session_id)
        peak_threads[0] = max(peak_threads[0], threading.active_count())
        await release.wait()  # every run waits on "the model" at once
        turn.reply("done")

    rt = make_runtime(brain=brain, max_active_sessions=4)  # 4 blocking workers
    jobs = [rt.cron.add(f"job {i}", "0 0 1 1 *", "cron prompt")["job_id"] for i in range(20)]
    before = threading.active_count()  # the loop runs already
    for job in jobs:
        rt.cron.trigger(job)
    try:
        wait_for(lambda: len(waiting) == 20, timeout=30, what="20 runs waiting at once")
        # At most the 4 blocking workers more, where a thread per waiting run is 20 more.
        assert max(peak_threads[0], threading.active_count()) <= before + 4
    finally:
        wait_for(lambda: bool(loop_box), what="a run on the loop")
        loop_box[0].call_soon_threadsafe(release.set)
        assert rt.cron.wait_idle(30)
    assert all([r["status"] for r in rt.cron.runs(job)] == ["success"] for job in jobs)


def test_max_async_turns_holds_rows_back_in_the_journal(make_runtime: MakeRuntime) -> None:
    running = [0]
    peak = [0]

    async def brain(turn: Turn) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        for _ in range(20):  # yield to the loop, so other turns run meanwhile
            await asyncio.sleep(0)
        running[0] -= 1

    rt = make_runtime(brain=brain, max_async_turns=5)
    project = rt.create_project("bounded")
    for i in range(40):
        rt.post(rt.create_session(project.id, f"s{i}").id, "go")
    rt.run_until_idle(timeout=30)
    assert peak[0] <= 5 and rt.statistics()["rows"] == {"delivered": 40}


def test_a_sync_brain_that_returns_an_awaitable_is_a_failed_attempt(
        make_runtime: MakeRuntime) -> None:
    async def model(turn: Turn) -> None:
        turn.reply("never seen")

    rt = make_runtime(brain=lambda turn: model(turn))  # a sync callable returning a coroutine
    a, b = team(rt)
    rt.post(b, "hello", sender=a)
    rt.run_until_idle()
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "SyncBrainAwaitable: the brain returned an awaitable (coroutine)" in row["last_error"]
    assert rt.transcript(b) == []


def test_an_async_turn_ignoring_agent_stop_is_cancelled_and_commits_what_it_said(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    started = threading.Event()
    brain = ignoring_stops(started)

    rt = make_runtime(brain=brain, stop_grace=5.0)
    a, b = team(rt)
    mid = rt.post(b, "long", sender=a).message_id
    assert started.wait(10)
    rt.tools_for(a).agent_stop(b)
    clock.advance(6)  # past the grace: the next tick cancels the brain
    wait_for(lambda: rt.inbox()[0]["status"] == "delivered", what="the stopped turn's commit")
    assert [e.text for e in rt.transcript(b)] == ["long", "halfway"]
    assert rt.marker_counts() == {mid: 1}


def test_an_async_turn_that_obeys_a_stop_by_cancelling_its_model_call_commits(
        make_runtime: MakeRuntime) -> None:
    """The usual idiom: cancel the model call and let its CancelledError propagate. That
    is the stop obeyed, not the brain's own failure (nobody cancelled the brain's task)."""
    started = threading.Event()

    async def brain(turn: Turn) -> None:
        turn.reply("halfway")
        model = asyncio.ensure_future(asyncio.Event().wait())
        stop = asyncio.ensure_future(turn.stopped())
        started.set()
        await asyncio.wait({model, stop}, return_when=asyncio.FIRST_COMPLETED)
        model.cancel()
        await model

    rt = make_runtime(brain=brain, stop_grace=5.0)
    a, b = team(rt)
    mid = rt.post(b, "long", sender=a).message_id
    assert started.wait(10)
    rt.tools_for(a).agent_stop(b)
    committed_as_stopped(rt, b, mid)


def test_an_async_turn_past_turn_timeout_ignoring_the_stop_is_a_failed_attempt(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    started = threading.Event()

    async def brain(turn: Turn) -> None:
        started.set()
        await asyncio.Event().wait()

    rt = make_runtime(brain=brain, turn_timeout=10.0, stop_grace=5.0)
    a, b = team(rt)
    rt.post(b, "long", sender=a)
    assert started.wait(10)
    clock.advance(11)  # asked to stop at the next tick
    wait_for(lambda: rt.context.turns.stopped_by(b) is not None, what="the stop request")
    clock.advance(6)  # and cancelled at the one after the grace
    wait_for(lambda: rt.inbox()[0]["attempts"] == 1, what="the failed attempt")
    row = rt.inbox()[0]
    assert row["status"] == "pending" and "Turn" in row["last_error"]
    assert rt.transcript(b) == []


@pytest.mark.timeout(60)
def test_a_sync_brain_raising_as_a_caller_stops_it_commits_as_stopped_not_retried(
        make_runtime: MakeRuntime) -> None:
    """A model call aborted on the stop flag raises out of the brain: the turn obeyed the
    stop. As a failed attempt it was retried, so the caller's stop ran the message again."""
    started = threading.Event()

    def brain(turn: Turn) -> None:
        turn.reply("halfway")
        started.set()
        assert turn.wait_stop_requested(20)
        raise RuntimeError("the model call was aborted")

    rt = make_runtime(brain=brain)
    a, b = team(rt)
    mid = rt.post(b, "long", sender=a).message_id
    assert started.wait(10)
    assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
    committed_as_stopped(rt, b, mid)


@pytest.mark.timeout(60)
def test_a_caller_stopped_turn_stays_the_callers_when_the_runtime_stops_meanwhile(
        make_runtime: MakeRuntime) -> None:
    """A runtime's stop asked every running turn to stop, and named itself the stopper of
    one a caller had stopped already: that turn's brain raising on its way out was then a
    failed attempt, retried at the next start, the caller's stop undone."""
    started, proceed = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        turn.reply("halfway")
        started.set()
        assert turn.wait_stop_requested(20)
        assert proceed.wait(20)
        raise RuntimeError("the model call was aborted")

    rt = make_runtime(brain=brain)
    a, b = team(rt)
    rt.post(b, "long", sender=a)
    assert started.wait(10)
    assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
    turns, runtime_asked = rt.context.turns, threading.Event()
    real = turns.request_stop

    def request_stop(session_id: str, by: str | None, *args: Any, **kwargs: Any) -> bool:
        asked = real(session_id, by, *args, **kwargs)
        if by == RUNTIME_STOP:
            runtime_asked.set()
        return asked

    turns.request_stop = request_stop  # type: ignore[method-assign]
    stopping = threading.Thread(target=rt.stop)
    stopping.start()
    try:
        assert runtime_asked.wait(10)
    finally:
        proceed.set()
        stopping.join(30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("delivered", 0)


@pytest.mark.timeout(60)
def test_an_async_turn_a_caller_stopped_cancelled_past_turn_timeout_commits_as_stopped(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """Stopped by a caller, ignoring it past the grace and past ``turn_timeout``: the
    caller's stop ends it (what it said is committed), not the timeout (a retry)."""
    started = threading.Event()
    brain = ignoring_stops(started)

    rt = make_runtime(brain=brain, turn_timeout=10.0, stop_grace=5.0)
    a, b = team(rt)
    mid = rt.post(b, "long", sender=a).message_id
    assert started.wait(10)
    rt.tools_for(a).agent_stop(b)
    clock.advance(11)  # past the grace and the timeout: the next tick cancels the brain
    committed_as_stopped(rt, b, mid)


@pytest.mark.timeout(60)
def test_an_inbox_turn_waits_for_a_cron_turn_of_its_session_without_blocking_the_loop(
        make_runtime: MakeRuntime) -> None:
    """A session runs one turn at a time whoever started it: an inbox row for a session whose
    cron run is inside its async brain waits for that run, on a blocking worker, while the
    loop goes on running every other session's turns."""
    holding, release = threading.Event(), threading.Event()
    order: list[str] = []

    async def brain(turn: Turn) -> None:
        first = turn.messages[0]
        if "run_id" in first.payload:  # the cron run: hold until told
            holding.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        order.append(f"{turn.session_id}:{'cron' if 'run_id' in first.payload else first.content}")
        turn.reply("ok")

    rt = make_runtime(brain=brain)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    cron_session = f"cron-{job}"
    rt.cron.trigger(job)
    assert holding.wait(20)
    rt.post(cron_session, "inbox message")
    other = rt.create_session(None, "other").id
    rt.post(other, "elsewhere")
    wait_for(lambda: f"{other}:elsewhere" in order, timeout=20,
             what="another session's turn while the cron turn holds its session")
    assert not any(o.startswith(cron_session) for o in order)
    release.set()
    rt.run_until_idle(timeout=20)
    assert rt.cron.wait_idle(20)
    assert [o for o in order if o.startswith(cron_session)] == [
        f"{cron_session}:cron", f"{cron_session}:inbox message"]
    assert set(rt.marker_counts().values()) == {1}


def test_focal_resolves_its_chat_before_the_brain_runs(make_runtime: MakeRuntime,
                                                       flavour: str) -> None:
    """The Focal hook's work (restoring the chat's pinned title, resolving its policy) runs
    before the brain, off the event loop, even when the brain never looks at the request."""
    titles: list[str] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        session = rt.context.store.session(turn.session_id)
        assert session is not None
        titles.append(session.title)

    rt = make_runtime(brain=brain_of(flavour, behaviour))
    chat = rt.get_or_create_focal_chat()
    rt.context.store.update_session(chat.id, rt.clock.now(), title="renamed by hand")
    rt.post(chat.id, "anything new?")
    rt.run_until_idle()
    assert titles == [FOCAL_TITLE]


def test_a_row_whose_worker_died_mid_turn_is_taken_over_and_runs_once(
        make_runtime: MakeRuntime, db_url: str, clock: ManualClock, flavour: str) -> None:
    """A row leased by a worker that died inside its turn: the new runtime records the turn's
    start (fenced, before the brain) and runs it once, the interrupted attempt counted."""
    ran: list[int] = []

    async def behaviour(turn: Turn, tools: Any) -> None:
        ran.append(turn.row.attempts)
        turn.reply("recovered")

    stores = Stores(db_url)
    try:
        stores.store.create_session("s1", None, "S1", "interactive", clock.now())
        stores.journal.enqueue(NewMessage("m1", "s1", "hello"), clock.now())
        stores.journal.claim("dead-worker", clock.now(), lease=30)
        stores.journal.mark_turn_started("dead-worker", "m1", clock.now() + 1)
    finally:
        stores.close()
    clock.advance(31)  # the dead worker's lease ran out
    rt = make_runtime(brain=brain_of(flavour, behaviour))
    rt.run_until_idle()
    assert ran == [1]
    row = rt.context.journal.get("m1")
    assert (row["status"], row["attempts"]) == ("delivered", 1)
    assert [h["event"] for h in rt.context.journal.history("m1")][:1] == ["interrupted"]
    assert rt.marker_counts() == {"m1": 1}


@pytest.mark.timeout(60)
def test_a_turn_cancelled_while_its_commit_is_in_flight_still_finishes_it(
        make_runtime: MakeRuntime, db_url: str) -> None:
    """Stopping gives up on an async turn whose commit waits behind a busy writer: the commit
    still lands once, and what follows it (observers, after-commit notifications) runs."""
    holding, release, inside, gate = (threading.Event() for _ in range(4))
    events: list[str] = []

    async def brain(turn: Turn) -> None:
        holding.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
        turn.reply("done")

    def observe(event: str, data: dict[str, Any]) -> None:
        events.append(event)
        if event == "stopped":  # the host gave up on the turn: let the writer go on
            gate.set()

    rt = make_runtime(brain=brain)
    rt.subscribe(observe)
    sid = rt.create_session(None, "S").id
    rt.post(sid, "hello", message_id="m1")
    assert holding.wait(20)
    writer = rt.context.journal.writer
    writer.submit(lambda: (inside.set(), gate.wait(20)))  # hold the writer
    assert inside.wait(20)
    release.set()
    wait_for(lambda: writer.queued() >= 1, timeout=20, what="the turn's commit queued")
    rt.stop(timeout=0.2)  # too short for the commit: the driver is cancelled
    wait_for(lambda: "turn_committed" in events, timeout=20, what="the turn's after-commit work")
    stores = Stores(db_url)
    try:
        assert stores.journal.get("m1")["status"] == "delivered"
        assert stores.store.marker_counts() == {"m1": 1}
    finally:
        stores.close()


def _pair(rt: Runtime) -> tuple[str, str]:
    project = rt.create_project("pair").id
    return rt.create_session(project, "A").id, rt.create_session(project, "B").id


_STRAY_TASK = """
import asyncio, sys
from kinbox.actors import Runtime

spawned = []

async def side_job():
    raise {raised}("a library's background task gave up")

async def brain(turn):
    if turn.messages[0].content == "spawn":
        spawned.append(asyncio.ensure_future(side_job()))
        await asyncio.sleep(0)
    turn.reply("ok " + turn.messages[0].content)

with Runtime(db=sys.argv[1], brain=brain) as rt:
    project = rt.create_project("p").id
    a, b = rt.create_session(project, "A").id, rt.create_session(project, "B").id
    rt.post(a, "spawn")
    rt.run_until_idle(timeout=10)
    rt.post(b, "hello")  # the runtime goes on delivering
    rt.run_until_idle(timeout=10)
    print([e.text for e in rt.transcript(b)])
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt"])
def test_a_stray_task_raising_a_base_exception_does_not_end_the_event_loop(
        db_url: str, raised: str) -> None:
    """asyncio lets SystemExit and KeyboardInterrupt out of the loop: a fire-and-forget
    task of a brain's (a library's background task) ended every async turn after it.
    In a process of its own: after one, CPython 3.11 fails to parse source in the
    process ('AST constructor recursion depth mismatch'), which pytest goes on to do."""
    done = subprocess.run([sys.executable, "-c", _STRAY_TASK.format(raised=raised), db_url],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['hello', 'ok hello']"


@pytest.mark.timeout(60)
def test_a_brain_stopping_the_event_loop_does_not_end_async_delivery(
        make_runtime: MakeRuntime) -> None:
    """A brain (or a library it calls) that ran ``asyncio.get_running_loop().stop()`` ended
    the runtime's loop: that turn and every async turn after it stayed ``processing`` for
    good while the runtime said it was running. Only the runtime's own stop ends the loop."""
    async def brain(turn: Turn) -> None:
        if turn.messages[0].content == "stop the loop":
            asyncio.get_running_loop().stop()
        await asyncio.sleep(0)
        turn.reply("ok " + turn.messages[0].content)

    rt = make_runtime(brain=brain)
    a, b = _pair(rt)
    rt.post(a, "stop the loop")
    rt.run_until_idle(timeout=30)
    rt.post(b, "hello")
    rt.run_until_idle(timeout=30)
    assert [e.text for e in rt.transcript(a)] == ["stop the loop", "ok stop the loop"]
    assert [e.text for e in rt.transcript(b)] == ["hello", "ok hello"]


@pytest.mark.timeout(60)
def test_agent_stop_reaches_a_turn_that_polled_its_flag_on_a_loop_now_closed(
        make_runtime: MakeRuntime) -> None:
    """A sync brain that ran ``asyncio.run(turn.stopped(0))`` left a waiter on a loop that
    closed; raising the flag then failed ('Event loop is closed') and agent_stop with it."""
    polled, done = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        if turn.messages[0].content != "long job":
            return
        assert asyncio.run(turn.stopped(timeout=0)) is False
        polled.set()
        turn.wait_stop_requested(20)
        turn.reply("stopped" if turn.stop_requested else "ran out")
        done.set()

    rt = make_runtime(brain=brain)
    a, b = _pair(rt)
    rt.post(b, "long job", sender=a)
    assert polled.wait(10)
    assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
    assert done.wait(10)
    rt.run_until_idle()
    assert rt.transcript(b)[-1].text == "stopped"


@pytest.mark.timeout(60)
def test_a_brain_cancelled_past_its_grace_is_cancelled_once(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """Every tick listed the turn again and cancelled it again, so a brain's clean-up
    (an ``except CancelledError`` that awaits: closing its model client) was cancelled
    too, and its last words were lost."""
    started = threading.Event()
    cancels: list[str] = []

    async def brain(turn: Turn) -> None:
        turn.reply("halfway")
        started.set()
        try:
            await asyncio.Event().wait()  # ignores the stop
        except asyncio.CancelledError:
            cancels.append("model call")
            try:
                await asyncio.sleep(1.0)  # its clean-up takes a while: several ticks
                turn.reply("cleaned up")
            except asyncio.CancelledError:
                cancels.append("clean-up")
            raise

    rt = make_runtime(brain=brain, stop_grace=5.0)
    a, b = _pair(rt)
    rt.post(b, "long", sender=a)
    assert started.wait(10)
    rt.tools_for(a).agent_stop(b)
    clock.advance(6)  # past the grace: the next tick cancels the brain
    wait_for(lambda: rt.inbox(target=b)[0]["status"] != "processing",
             what="the stopped turn's end")
    assert cancels == ["model call"]
    assert [e.text for e in rt.transcript(b)] == ["long", "halfway", "cleaned up"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stopper", ["caller", "turn_timeout"])
def test_a_brain_swallowing_its_cancel_is_given_up_on_and_its_session_goes_on(
        make_runtime: MakeRuntime, clock: ManualClock, stopper: str) -> None:
    """A brain that swallows the cancel (a bare ``except:`` around its model call, or
    3.11's ``asyncio.wait_for`` losing it) was awaited for good: its row stayed
    ``processing`` with its lease renewed, and its session's next message never ran.
    A grace after the cancel its turn ends without it, as a cancelled turn does."""
    started, swallowed = threading.Event(), threading.Event()

    async def brain(turn: Turn) -> None:
        if turn.messages[0].content != "long":
            turn.reply("next one ran")
            return
        turn.reply("halfway")
        started.set()
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed.set()

    rt = make_runtime(brain=brain, stop_grace=5.0,
                      turn_timeout=30.0 if stopper == "turn_timeout" else None)
    a, b = _pair(rt)
    mid = rt.post(b, "long", sender=a).message_id
    assert started.wait(10)
    if stopper == "caller":
        rt.tools_for(a).agent_stop(b)
    else:
        clock.advance(31)  # past turn_timeout: the tick asks it to stop
    wait_for(lambda: rt.context.turns.stop_asked(b), what="the stop request")
    clock.advance(6)  # past the grace: the tick cancels the brain, which swallows it
    assert swallowed.wait(10)
    rt.post(b, "second", sender=a)
    clock.advance(6)  # a grace after the cancel: the turn ends without its brain
    wait_for(lambda: rt.inbox(target=b)[0]["status"] != "processing",
             what="the turn given up on to end")
    row = rt.inbox(target=b)[0]
    if stopper == "caller":  # what it said before is committed, as a stopped turn's
        assert (row["status"], row["attempts"]) == ("delivered", 0)
        rt.run_until_idle()
        assert [e.text for e in rt.transcript(b)] == ["long", "halfway", "second",
                                                      "next one ran"]
    else:  # a failed attempt, retried as any
        assert (row["status"], row["attempts"]) == ("pending", 1)
        assert "TurnCancelled" in row["last_error"]
    assert rt.marker_counts().get(mid, 0) == (1 if stopper == "caller" else 0)


@pytest.mark.timeout(60)
def test_inbox_turns_waiting_for_cron_turns_hold_no_blocking_worker(
        make_runtime: MakeRuntime) -> None:
    """With ``max_active_sessions=4`` the loop has 4 blocking workers. Four sessions each run
    a cron turn and each have an inbox row waiting for it: the waiting rows hold no worker,
    so the cron turns' tool calls (which run on those workers) still run, and everything
    finishes."""
    holding, release = threading.Semaphore(0), threading.Event()
    order: list[str] = []

    async def brain(turn: Turn) -> None:
        first = turn.messages[0]
        if "run_id" in first.payload:
            holding.release()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)
            await turn.tools.agent_list()  # a tool call: it needs a blocking worker
            order.append(f"{turn.session_id}:cron")
        else:
            order.append(f"{turn.session_id}:{first.content}")
        turn.reply("ok")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    sessions = []
    for n in range(4):
        job = rt.cron.add(f"tick {n}", "* * * * *", "cron prompt")["job_id"]
        sessions.append(f"cron-{job}")
        rt.cron.trigger(job)
    for _ in sessions:
        assert holding.acquire(timeout=20)
    for sid in sessions:
        rt.post(sid, "inbox message")
    wait_for(lambda: rt.statistics()["rows"].get("processing") == len(sessions), timeout=20,
             what="every inbox row claimed (each waits for its session's cron turn)")
    release.set()
    assert rt.cron.wait_idle(20)
    rt.run_until_idle(timeout=20)
    for sid in sessions:
        assert [o for o in order if o.startswith(sid)] == [f"{sid}:cron",
                                                           f"{sid}:inbox message"]


@pytest.mark.timeout(60)
def test_a_graceful_stop_cancels_a_brain_ignoring_it_and_commits_what_it_said(
        make_runtime: MakeRuntime, db_url: str) -> None:
    """The ticker that cancels a brain past its grace stops first at a graceful stop, and
    the stop then cancelled the whole turn: its row stayed ``processing`` until a later
    start took it over as a failed attempt, and what it had replied was lost. Stopped by
    the runtime, the brain is cancelled past its grace and its turn commits as stopped."""
    started = threading.Event()
    brain = ignoring_stops(started)

    rt = make_runtime(brain=brain, stop_grace=0.5)
    sid = rt.create_session(None, "S").id
    rt.post(sid, "long", message_id="m1")
    assert started.wait(10)
    rt.stop(timeout=5)
    assert after_stop(db_url, sid, "m1") == (("delivered", 0), ["long", "halfway"], 1)


@pytest.mark.timeout(60)
def test_live_async_actors_above_max_live_sessions_are_passivated_as_their_turns_end(
        make_runtime: MakeRuntime) -> None:
    """An async brain runs up to ``max_async_turns`` turns at once, each on a live actor
    that is never passivated while it runs, so more than ``max_live_sessions`` may be live
    then. Once their turns ended, the idle ones above the bound stayed in memory until the
    next activation or ``idle_ttl``."""
    release = threading.Event()
    running = threading.Semaphore(0)

    async def brain(turn: Turn) -> None:
        running.release()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 20)

    rt = make_runtime(brain=brain, max_live_sessions=3)
    project = rt.create_project("p").id
    sessions = [rt.create_session(project, f"S{n}").id for n in range(8)]
    for sid in sessions:
        rt.post(sid, "go")
    for _ in sessions:
        assert running.acquire(timeout=20)
    assert rt.statistics()["live"] == 8  # running turns keep their actors
    release.set()
    rt.run_until_idle(timeout=20)
    assert rt.statistics()["live"] <= 3


@pytest.mark.timeout(10)
def test_excess_idle_stops_the_least_recently_used_idle_actors_above_the_cap() -> None:
    from kinbox.actors.passivation import excess_idle

    live = ["a", "b", "c", "d", "e"]  # least recently used first
    assert excess_idle(live, {"a"}, 3) == ["b", "c"]
    assert excess_idle(live, {"a", "b", "c", "d"}, 3) == ["e"]  # running ones stay
    assert excess_idle(live, set(), 5) == []


def test_a_session_seen_before_gets_its_turns_tools_without_a_read_on_the_event_loop(
        make_runtime: MakeRuntime) -> None:
    """Which tools a session holds (agent, sub-agent, Focal) was read from its session row
    each time a turn built them, which an async turn does on the event loop: every other
    turn waited for that read (on PostgreSQL a round trip; longer behind a lock). It is
    decided by the session's id and kind, which never change, so it is read once."""
    schemas: list[int] = []

    async def brain(turn: Turn) -> None:
        schemas.append(len(turn.tools.schemas()))

    rt = make_runtime(brain=brain)
    a, b = team(rt)
    store = rt.context.store
    real, on_loop = store.session, []

    def session(session_id: str) -> Any:
        if threading.current_thread().name == "kinbox-async":
            on_loop.append(session_id)
        return real(session_id)

    store.session = session  # type: ignore[method-assign]
    for i in range(5):
        rt.post(b, f"m{i}", sender=a)
        rt.run_until_idle()
    assert len(schemas) == 5 and len(set(schemas)) == 1
    assert on_loop.count(b) <= 1, on_loop


def test_a_cancel_listed_for_an_ended_turn_spares_its_sessions_next_turn(
        make_runtime: MakeRuntime) -> None:
    """A tick lists the turns ignoring their stop, and the loop cancels their brains
    later. A listed turn may end meanwhile and its session's next turn start: the cancel
    took whatever brain the session had then, the next turn's, which nobody had asked to
    stop (it failed as ``TurnCancelled`` and ran again). Only a brain whose turn was
    asked to stop is cancelled."""
    started, release = threading.Event(), threading.Event()

    async def brain(turn: Turn) -> None:
        started.set()
        await asyncio.to_thread(release.wait, 20)  # a model call in flight
        turn.reply("done")

    rt = make_runtime(brain=brain)
    a, b = _pair(rt)
    rt.post(b, "next turn", sender=a)
    assert started.wait(10)
    host = rt.context.async_host
    host.cancel([b])  # as a tick's list, made when b's earlier turn ignored its stop
    done = threading.Event()
    host.loop.call_soon_threadsafe(done.set)  # after the cancel's own callback
    assert done.wait(10)
    release.set()
    rt.run_until_idle()
    row = rt.inbox(target=b)[0]
    assert (row["status"], row["attempts"]) == ("delivered", 0)
    assert [e.text for e in rt.transcript(b)] == ["next turn", "done"]


@pytest.mark.timeout(60)
def test_a_graceful_stop_leaves_a_turn_cleaning_up_after_its_cancel_until_its_timeout(
        make_runtime: MakeRuntime, db_url: str, clock: ManualClock) -> None:
    """A stop cancelled every turn still running ``stop_grace`` into it unless one of their
    brains was cancelled just then: a brain cancelled earlier (by a tick, after a caller's
    stop) and still cleaning up had its turn cut at the grace, though the stop's timeout
    had seconds left; the row stayed ``processing`` and ran again at the next start."""
    started, cleaning = threading.Event(), threading.Event()

    async def brain(turn: Turn) -> None:
        turn.reply("halfway")
        started.set()
        try:
            await asyncio.Event().wait()  # ignores the stop
        except asyncio.CancelledError:
            cleaning.set()
            await asyncio.sleep(1.0)  # closing its model client takes a while
            turn.reply("cleaned up")
            raise

    rt = make_runtime(brain=brain, stop_grace=0.3)
    a, b = team(rt)
    rt.post(b, "long", sender=a, message_id="m1")
    assert started.wait(10)
    rt.tools_for(a).agent_stop(b)
    clock.advance(1)  # past the grace: the next tick cancels the brain
    assert cleaning.wait(10)
    rt.stop(timeout=10)
    assert after_stop(db_url, b, "m1") == (("delivered", 0),
                                           ["long", "halfway", "cleaned up"], 1)


@pytest.mark.timeout(60)
def test_a_graceful_stop_cancels_a_cron_brain_ignoring_it_and_commits_its_run(
        make_runtime: MakeRuntime, db_url: str) -> None:
    """A cron run's async brain is awaited by a direct turn's thread. The stop cancelled
    only the brains of inbox turns, and only once the direct turns' wait had run out: a
    cron brain ignoring the stop was never cancelled, its run stayed ``running`` with
    nothing of it committed, and its thread waited on a loop that had ended, for good (the
    process could not exit). Stopped by the runtime, it is cancelled past its grace and
    its run commits as stopped, with what it said."""
    started = threading.Event()
    rt = make_runtime(brain=ignoring_stops(started), stop_grace=0.3)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert started.wait(10)
    rt.stop(timeout=10)
    assert rt.cron.wait_idle(0)  # the turn's thread is free: it waits for no loop
    after = make_runtime()  # send-only: reads the database
    [run] = after.cron.runs(job)
    assert (run["status"], run["result"]) == ("success", "halfway")
    assert [e.text for e in after.transcript(f"cron-{job}")][1:] == ["halfway"]


@pytest.mark.timeout(60)
def test_a_crash_frees_the_thread_of_a_cron_turn_awaiting_its_async_brain(
        make_runtime: MakeRuntime) -> None:
    """A crash ends the event loop with a cron run's brain on it: the direct turn's thread
    waited for that brain's end, which never came, for good. It is let go, and nothing of
    the run commits (its record is taken over at the next start, as after a kill)."""
    started = threading.Event()
    rt = make_runtime(brain=ignoring_stops(started))
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert started.wait(10)
    rt.crash()
    assert rt.cron.wait_idle(10)
    after = make_runtime()
    assert [r["status"] for r in after.cron.runs(job)] == ["running"]
    assert [e.text for e in after.transcript(f"cron-{job}")] == []


@pytest.mark.timeout(60)
def test_a_brain_that_never_awaits_is_named_and_a_stop_lets_go_of_its_cron_turn(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """An async brain that never awaits (a CPU loop, a blocking call) holds the event loop:
    no cancel reaches it and every async turn waits. Nothing said so, and a stop left the
    cron turn awaiting that brain waiting for good (the loop never ended, so nothing let
    its thread go). The stall is logged naming the session, and the stop lets go of the
    turn: nothing of it commits (its run is taken over at the next start)."""
    started, release = threading.Event(), threading.Event()

    async def brain(turn: Turn) -> None:
        started.set()
        release.wait(30)  # never awaits: the loop is held until the test lets go

    rt = make_runtime(brain=brain, stop_grace=0.5)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    sid = f"cron-{job}"
    try:
        with caplog.at_level("WARNING", logger="kinbox.async"):
            rt.cron.trigger(job)
            assert started.wait(10)
            # A tick sends a probe the held loop never runs, and a tick stop_grace after it
            # finds it unanswered.
            wait_for(lambda: any(f"the async brain of {sid} never awaits" in r.getMessage()
                                 for r in caplog.records), what="the stall's warning")
            asked = time.monotonic()
            rt.stop(timeout=0.5)
            # The drain never runs on the held loop: the stop gives up at its slack's end,
            # not once per wait (it took timeout + 10 s).
            assert time.monotonic() - asked < 0.5 + STOP_SLACK + 2
        assert rt.cron.wait_idle(5)  # the cron turn's thread was let go
    finally:
        release.set()
    after = make_runtime()
    assert [r["status"] for r in after.cron.runs(job)] == ["running"]


@pytest.mark.timeout(60)
def test_a_sub_agents_commits_read_nothing_on_the_event_loop(make_runtime: MakeRuntime
                                                             ) -> None:
    """The outbox hooks of a sub-agent's turns read the database (the child's session, the
    task before the turn, which wake-up ids are taken) to know what commits with the
    turn, and they ran on the event loop: every other async turn waited for those reads
    (on PostgreSQL round trips; on a lost connection, its reconnect). They run on a
    blocking worker, and the parent hears both outcomes as before."""
    heard: list[str] = []

    async def brain(turn: Turn) -> None:
        message = turn.messages[0]
        if message.kind == "subagent_task":  # the child asks the user first
            await turn.tools.task_update(message.payload["task_id"], status="blocked",
                                         blocked_on="user", reason="which files?")
            turn.reply("which files?")
        elif turn.session_id.startswith("subagent-"):  # the user answered: done
            tasks = (await turn.tools.task_list())["tasks"]
            await turn.tools.task_update(tasks[0]["task_id"], status="completed")
            turn.reply("cleaned")
        elif message.kind == "subagent_result":
            heard.append(f"{message.payload['outcome']}: {message.content}")
        else:
            await turn.tools.agent(description="clean up")

    rt = make_runtime(brain=brain, max_active_sessions=2)
    a, _ = team(rt)
    on_loop = reads_on_the_loop(rt, "subagents.py")
    rt.post(a, "delegate")
    rt.run_until_idle()
    [child] = [s.id for s in rt.sessions() if s.id.startswith("subagent-")]
    rt.post(child, "the logs folder")
    rt.run_until_idle()
    assert heard == ["blocked: which files?", "completed: cleaned"]
    assert on_loop == []


def reads_on_the_loop(rt: Runtime, module: str) -> list[str]:
    """The functions of ``module`` (a file name) under each database statement run on the
    event loop's thread from now on (filled as they run)."""
    db = rt.context.journal.t.db
    real, on_loop = db.execute_sql, []

    def execute_sql(sql: str, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "kinbox-async":
            on_loop.extend(f.name for f in traceback.extract_stack()
                           if f.filename.endswith(module))
        return real(sql, *args, **kwargs)

    db.execute_sql = execute_sql
    return on_loop


@pytest.mark.timeout(60)
def test_a_social_threads_inbox_turn_finds_its_reply_route_off_the_event_loop(
        make_runtime: MakeRuntime) -> None:
    """The replies of an inbox turn in a social thread (an ``agent_send`` to it) leave by
    the thread's reply route, which the outbox hook read from the session on the event
    loop, holding up every other async turn. It reads on a blocking worker; the reply
    still leaves by that route."""
    async def brain(turn: Turn) -> str:
        return "echo: " + turn.messages[0].content.splitlines()[-1]

    rt = make_runtime(brain=brain)
    sent: list[tuple[Any, str]] = []
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=lambda route, text: sent.append((route, text)))
    rt.social.ingest({"platform": "slack", "sender_id": "U1", "sender_name": "name-U1",
                      "thread_id": "T1", "text": "hi",
                      "reply_route": {"channel": "C9", "ts": "T1"}})
    assert rt.social.wait_idle(10)
    on_loop = reads_on_the_loop(rt, "social.py")
    peer = rt.create_session("social", "Helper").id
    rt.tools_for(peer).agent_send("social-slack-T1", "a note from a colleague")
    rt.run_until_idle()
    wait_for(lambda: len(sent) == 2, what="the inbox turn's reply sent")
    assert sent[-1] == ({"channel": "C9", "ts": "T1"}, "echo: a note from a colleague")
    assert on_loop == []


@pytest.mark.timeout(60)
def test_a_sessions_first_turn_reads_which_tools_it_holds_off_the_event_loop(
        make_runtime: MakeRuntime) -> None:
    """Which tools a session holds is read from its session row the first time one of its
    turns builds them, and an async brain built them on the event loop: every other turn
    waited for that read, once per session (every new social thread, every sub-agent,
    every cron job). It is read on a blocking worker (a direct turn's own thread) before
    the brain runs."""
    schemas: list[int] = []

    async def brain(turn: Turn) -> None:
        schemas.append(len(turn.tools.schemas()))

    rt = make_runtime(brain=brain)
    on_loop = reads_on_the_loop(rt, "tools.py")
    sid = rt.create_session(None, "new").id
    rt.post(sid, "first")
    rt.run_until_idle()
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert rt.cron.wait_idle(20)
    assert len(schemas) == 2 and all(schemas)
    assert on_loop == []


def test_work_submitted_to_the_loop_is_built_there_and_cancelled_with_its_waiter() -> None:
    """A stop racing the loop's end left a coroutine never awaited ("coroutine
    'AsyncHost._drain' was never awaited"): built on the caller's thread, it waited in the
    loop's queue that never ran again. Now nothing is built until the loop runs it."""
    import concurrent.futures
    from types import SimpleNamespace

    from kinbox.actors.async_host import AsyncHost

    host = AsyncHost(SimpleNamespace(stop_grace=1.0), workers=1)  # type: ignore[arg-type]
    built: list[str] = []

    async def answer(value: int) -> int:
        await asyncio.sleep(0)
        return value

    async def forever() -> None:
        await asyncio.Event().wait()

    def make(name: str, coro: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: built.append(name) or coro()

    try:
        done = host._submit(make("answer", lambda: answer(7)))
        never = host._submit(make("never", lambda: answer(0)))
        never.cancel()  # its waiter gave up before the loop got to it
        waiting = host._submit(make("forever", forever))
        assert built == []  # nothing built off the loop
        host.loop.run_until_complete(
            asyncio.wait_for(asyncio.wrap_future(done, loop=host.loop), 30))
        assert done.result(0) == 7 and built == ["answer", "forever"]
        running = asyncio.all_tasks(host.loop)
        waiting.cancel()  # the waiter gives up: the task on the loop is cancelled with it
        host.loop.run_until_complete(asyncio.wait(running, timeout=30))
        assert not [t for t in asyncio.all_tasks(host.loop) if not t.done()]
        with pytest.raises(concurrent.futures.CancelledError):
            waiting.result(0)
    finally:
        host.loop.close()
        host.executor.shutdown()
