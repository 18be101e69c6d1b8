"""A session's turn ends when its commit is durable, whoever started it.

A session runs one turn at a time (``RunningTurns``): an inbox turn, a cron
run and a social event of one session wait for each other. The next turn
may start only once the last one's transcript is in the journal, or it
would not read what the last one said. Each test records, at the moment a
turn leaves the running-turn board, what the session's transcript holds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.running import RunningTurns, StopFlag

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]
MINUTE = 60.0


def transcript_at_each_end(rt: Runtime) -> list[list[str]]:
    """Wrap the runtime's running-turn board: each end records the transcript's roles."""
    turns = rt.context.turns
    real_end = turns.end
    seen: list[list[str]] = []

    def end(session_id: str, flag: StopFlag | None = None) -> str | None:
        seen.append([e.role for e in rt.transcript(session_id)])
        return real_end(session_id, flag)

    turns.end = end  # type: ignore[method-assign]
    return seen


def sync_brain(turn: Turn) -> str:
    return "said"


async def async_brain(turn: Turn) -> str:
    return "said"


@pytest.mark.parametrize("brain", [sync_brain, async_brain], ids=["sync", "async"])
def test_an_inbox_turn_ends_after_its_commit(make_runtime: MakeRuntime, brain: Any) -> None:
    rt = make_runtime(brain=brain)
    project = rt.create_project("team")
    sid = rt.create_session(project.id, "A").id
    seen = transcript_at_each_end(rt)
    rt.post(sid, "first")
    rt.post(sid, "second")  # chained behind the first: it starts only after that end
    rt.run_until_idle(10)
    assert seen == [["user", "assistant"], ["user", "assistant", "user", "assistant"]]


def test_a_failed_inbox_attempt_ends_after_its_failure_is_recorded(
        make_runtime: MakeRuntime) -> None:
    def failing(turn: Turn) -> None:
        raise RuntimeError("no model today")

    rt = make_runtime(brain=failing)
    project = rt.create_project("team")
    sid = rt.create_session(project.id, "A").id
    turns = rt.context.turns
    real_end = turns.end
    attempts_at_end: list[int] = []

    def end(session_id: str, flag: StopFlag | None = None) -> str | None:
        attempts_at_end.extend(r["attempts"] for r in rt.inbox(target=session_id))
        return real_end(session_id, flag)

    turns.end = end  # type: ignore[method-assign]
    rt.post(sid, "hello")
    rt.run_until_idle(10)
    assert attempts_at_end == [1]  # the attempt was recorded before the turn ended
    assert rt.transcript(sid) == []  # and nothing of it was written


def test_a_cron_turn_ends_after_its_commit(make_runtime: MakeRuntime,
                                           clock: ManualClock) -> None:
    rt = make_runtime(brain=sync_brain)
    job_id = str(rt.cron.add("tick", "* * * * *", "Say what time it is.")["job_id"])
    seen = transcript_at_each_end(rt)
    clock.advance(MINUTE)
    rt.run_until_idle(10)
    assert seen == [["user", "assistant"]]
    assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]


def test_a_late_second_end_never_ends_the_next_turn() -> None:
    board = RunningTurns()
    first, _ = board.begin("s", lambda: 1.0)
    assert board.end("s", first) is None
    second, _ = board.begin("s", lambda: 2.0)
    assert board.end("s", first) is None  # the first turn's end, again: nothing happens
    assert board.is_running("s")
    board.end("s", second)
    assert not board.is_running("s")


@pytest.mark.timeout(30)
def test_a_closed_board_lets_go_of_every_wait_for_a_turn_that_may_never_end() -> None:
    """At a stop, a turn waiting for its session's running turn (one whose brain ignores
    the stop may never end) gives up, on a thread and on an event loop, and registers
    nothing; once closed, a free session still begins (the caller checks the stop)."""
    board = RunningTurns()
    deaf = board.try_begin("s", 0.0)
    assert deaf is not None
    answers: list[object] = []
    waiter = threading.Thread(target=lambda: answers.append(board.begin("s", lambda: 1.0)))
    waiter.start()
    wait_for(lambda: board._beginning == 1, timeout=10, what="the thread waiting")

    async def on_loop() -> object:
        waiting = asyncio.ensure_future(board.begin_async("s", lambda: 1.0))
        await asyncio.sleep(0)  # let it find the session busy and wait
        board.close()
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(on_loop()) is None
    waiter.join(10)
    assert answers == [None]
    assert asyncio.run(board.begin_async("s", lambda: 1.0)) is None  # closed: no new wait
    assert board.begin("s", lambda: 1.0) is None
    assert board.end("s", deaf) is None and not board.is_running("s")
    begun = board.begin("s", lambda: 2.0)
    assert begun is not None and begun[1] == 2.0


@pytest.mark.timeout(30)
def test_a_turn_that_waited_for_the_session_starts_when_its_wait_ends() -> None:
    """Its start (what ``turn_timeout`` counts from) is read once the session's running
    turn ended, on a thread and on an event loop alike: a wait is not time the turn ran."""
    board, clock = RunningTurns(), ManualClock(0.0)
    cron = board.try_begin("s", clock.now())
    started: list[float] = []

    def on_thread() -> None:
        flag, at = board.begin("s", clock.now, "m1")
        started.append(at)
        board.end("s", flag)

    waiter = threading.Thread(target=on_thread)
    waiter.start()
    wait_for(lambda: board._beginning == 1, timeout=10, what="the thread waiting")
    clock.advance(600.0)
    board.end("s", cron)
    waiter.join(10)
    assert started == [600.0]

    async def on_loop() -> tuple[float, bool]:
        first = board.try_begin("s", clock.now())
        waiting = asyncio.ensure_future(board.begin_async("s", clock.now, "m2"))
        await asyncio.sleep(0)  # let it find the session busy (no time passes for it)
        assert not waiting.done()
        clock.advance(60.0)
        threading.Thread(target=board.end, args=("s", first)).start()  # another thread
        _, at = await asyncio.wait_for(waiting, 10)
        return at, board.stop_overdue(clock.now() + 1.0, timeout=30.0) == []

    assert asyncio.run(on_loop()) == (660.0, True)


@pytest.mark.timeout(30)
def test_a_turn_reading_a_slow_clock_to_start_holds_up_no_other_session() -> None:
    """On PostgreSQL the runtime's clock is the database's, and reading it may wait. It was
    read under the board's lock, which every turn of every session takes to start and end:
    one slow read held them all up."""
    board = RunningTurns()
    in_clock, release = threading.Event(), threading.Event()

    def slow_clock() -> float:
        in_clock.set()
        assert release.wait(20)
        return 5.0

    starting = threading.Thread(target=lambda: board.begin("a", slow_clock))
    starting.start()
    try:
        assert in_clock.wait(10)
        other: list[StopFlag | None] = []
        beside = threading.Thread(target=lambda: other.append(board.try_begin("b", 1.0)))
        beside.start()
        beside.join(10)
        assert other and other[0] is not None  # "b" started while "a" read its clock
    finally:
        release.set()
        starting.join(10)
    assert board.running() == ["a", "b"]


@pytest.mark.timeout(30)
def test_an_awaited_begin_cancelled_while_waiting_leaves_nothing_behind() -> None:
    board = RunningTurns()

    async def cancelled() -> None:
        first = board.try_begin("s", 0.0)
        waiting = asyncio.ensure_future(board.begin_async("s", lambda: 1.0))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert board.end("s", first) is None
        assert not board.is_running("s")  # the cancelled wait registered no turn

    asyncio.run(cancelled())
    assert board._awaiting == {}


def test_a_judged_turn_is_past_stopping_until_it_ends() -> None:
    board = RunningTurns()
    board.begin("s", lambda: 0.0)
    assert board.request_stop("s", "operator", 1.0)
    assert board.settle("s") == "operator"  # judged: who stopped it is kept
    assert not board.request_stop("s", "someone else", 2.0)  # its commit is on its way
    assert board.stop_overdue(1_000.0, timeout=5.0) == []  # nor is it overdue any more
    assert board.ignoring_stop(1_000.0, grace=1.0) == []  # nor cancelled
    assert board.is_running("s")  # but the session's next turn still waits for it
    assert board.end("s") == "operator"
    assert not board.is_running("s")


def _generator_brain(turn: Turn) -> Any:
    turn.reply("never")
    yield None


async def _async_generator_brain(turn: Turn) -> Any:
    turn.reply("never")
    yield None


def _returning(value: object) -> Callable[[Turn], object]:
    return lambda turn: value


def _async_returning(value: object) -> Callable[[Turn], Any]:
    async def brain(turn: Turn) -> object:
        return value
    return brain


@pytest.mark.timeout(60)
@pytest.mark.parametrize("brain", [
    _returning(42), _returning(["a list"]), _returning(b"bytes"), _returning({"text": "hi"}),
    _async_returning(42), _async_returning(["a list"]), _generator_brain,
    _async_generator_brain], ids=["int", "list", "bytes", "dict", "async-int", "async-list",
                                  "generator", "async-generator"])
def test_a_result_neither_none_nor_a_string_fails_the_attempt(
        make_runtime: MakeRuntime, brain: Callable[[Turn], object]) -> None:
    """B1: it was acknowledged as handled (a generator brain's body never even ran)."""
    rt = make_runtime(brain=brain)
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "hello")
    rt.run_until_idle()
    [row] = rt.inbox(target=session)
    assert row["status"] == "pending" and row["attempts"] == 1
    assert "BrainResultInvalid: the brain returned a " in row["last_error"]
    assert rt.transcript(session) == []  # nothing of the attempt committed


@pytest.mark.timeout(60)
def test_a_tool_call_or_reply_after_the_turn_ended_is_refused_not_lost(
        make_runtime: MakeRuntime) -> None:
    """A thread (or task) the brain left running called agent_send after the turn had
    committed: it got a 'pending' receipt for a message never written, and a late reply
    was dropped as silently."""
    from kinbox.actors import RuntimeStateError, ToolError

    go_on, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != sender:
            return
        tools = turn.tools

        def later() -> None:
            try:
                go_on.wait(10)
                for late in (lambda: tools.agent_send(target, "after the turn"),
                             lambda: turn.reply("after the turn")):
                    try:
                        late()
                    except (ToolError, RuntimeStateError) as exc:
                        errors.append(exc)
            finally:
                done.set()
        threading.Thread(target=later, daemon=True).start()

    rt = make_runtime(brain=brain)
    project = rt.create_project("p").id
    sender, target = (rt.create_session(project, name).id for name in ("A", "B"))
    rt.post(sender, "go")
    rt.run_until_idle()
    go_on.set()
    assert done.wait(10)
    assert [type(e).__name__ for e in errors] == ["ToolError", "RuntimeStateError"]
    assert "This turn has ended" in str(errors[0])
    assert rt.inbox(target=target) == []


@pytest.mark.timeout(60)
def test_a_tool_call_after_the_brain_returned_is_refused_even_before_the_commit(
        make_runtime: MakeRuntime) -> None:
    """A thread the brain left running sent between the brain's return (the turn's close)
    and the commit taking the outbox: the send was committed with the turn, though the
    turn had ended (and a reply at that moment is refused)."""
    from kinbox.actors import ToolError

    go_on, done = threading.Event(), threading.Event()
    answers: list[object] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != sender:
            return
        tools = turn.tools

        def later() -> None:
            try:
                assert go_on.wait(20)
                answers.append(tools.agent_send(target, "after the brain returned"))
            except ToolError as exc:
                answers.append(exc)
            finally:
                done.set()
        threading.Thread(target=later, daemon=True).start()

    rt = make_runtime(brain=brain)
    project = rt.create_project("p").id
    sender, target = (rt.create_session(project, name).id for name in ("A", "B"))
    real_effects = rt.context.effects

    def effects(turn: Turn, outcome: Any) -> Any:
        if turn.session_id == sender and not go_on.is_set():  # the brain has returned
            go_on.set()
            assert done.wait(20)
        return real_effects(turn, outcome)

    rt.context.effects = effects  # type: ignore[method-assign]
    rt.post(sender, "go")
    rt.run_until_idle()
    [answer] = answers
    assert isinstance(answer, ToolError) and "This turn has ended" in answer.message, answer
    assert rt.inbox(target=target) == []


class LateCall:
    """A tool call from a thread the brain leaves running, held between two of its writes
    (:meth:`hold`, from a patched step of the call) until the turn that made it committed:
    the call must then be refused whole, nothing of it written."""

    def __init__(self) -> None:
        self.in_window, self.done = threading.Event(), threading.Event()
        self.answers: list[object] = []
        self.rt: Runtime | None = None
        self.session_id = ""

    def hold(self) -> None:
        """Inside the call: it is between its writes; wait for the turn's commit."""
        self.in_window.set()
        rt = self.rt
        assert rt is not None
        wait_for(lambda: rt.inbox(target=self.session_id)[0]["status"] == "delivered",
                 timeout=20, what="the turn to commit")

    def leave_running(self, call: Callable[[], object]) -> None:
        """In the brain: start ``call`` on a thread of its own and return once it is held
        between its writes (the brain returns then)."""
        from kinbox.actors import ToolError

        def later() -> None:
            try:
                self.answers.append(call())
            except ToolError as exc:
                self.answers.append(exc)
            finally:
                self.done.set()
        threading.Thread(target=later, daemon=True).start()
        assert self.in_window.wait(20)

    def refused_after(self, rt: Runtime, session_id: str, text: str) -> None:
        """Send ``text`` to ``session_id``, whose turn leaves the call running; the call
        was refused as one after the turn's end."""
        from kinbox.actors import ToolError

        self.rt, self.session_id = rt, session_id
        rt.post(session_id, text)
        assert self.done.wait(30)
        rt.run_until_idle()
        [answer] = self.answers
        assert isinstance(answer, ToolError) and "This turn has ended" in answer.message, answer


@pytest.mark.timeout(60)
def test_a_foreground_child_checked_before_the_turn_ended_never_commits_after_it(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A foreground ``agent(...)`` commits at once, not with the turn: it checked that the
    turn was open, then committed. From a thread the brain left running, the turn could
    end and commit between the two, and the child was written after the turn's end."""
    from kinbox.actors import child_tools as tools_module

    late = LateCall()
    real_commit = tools_module.commit_together

    def commit_after_the_turn(ctx: Any, build: Any, *args: Any, **kwargs: Any) -> Any:
        late.hold()  # checked: the turn was open
        return real_commit(ctx, build, *args, **kwargs)

    monkeypatch.setattr(tools_module, "commit_together", commit_after_the_turn)

    def brain(turn: Turn) -> str | None:
        if turn.session_id != parent:
            return "child done"
        if turn.messages[0].content != "go":  # the child's report, should it ever come
            return None
        tools = turn.tools
        late.leave_running(lambda: tools.agent("late work", run_in_background=False,
                                               timeout=20))
        return None  # the brain returns while its call is between its check and its commit

    rt = make_runtime(brain=brain)
    parent = rt.create_session(rt.create_project("p").id, "parent").id
    late.refused_after(rt, parent, "go")
    assert [s.id for s in rt.sessions() if s.parent_id == parent] == []


def test_a_reply_meeting_the_turns_close_midway_is_committed_or_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread the brain started replies while the turn closes (its brain returned, on
    another thread): the close lands inside the reply, here while its text is checked.
    The reply must then be refused, not accepted after the commit read the entries."""
    from kinbox.actors import RuntimeStateError
    from kinbox.actors import turn as turn_module

    turn = Turn("s", [], lambda: None, StopFlag(), list)
    committed: list[list[str]] = []
    check = turn_module.unstorable

    def closing_meanwhile(text: str) -> str | None:
        closer = threading.Thread(target=lambda: committed.append(
            [e.text for e in turn.entries()] if turn.close_steering() is not None
            else []))
        closer.start()
        closer.join(10)
        return check(text)

    monkeypatch.setattr(turn_module, "unstorable", closing_meanwhile)
    try:
        turn.reply("late")
        accepted = True
    except RuntimeStateError:
        accepted = False
    assert accepted == ("late" in committed[0])


@pytest.mark.timeout(30)
def test_a_reply_does_not_wait_for_a_steering_fetch_in_flight() -> None:
    """A steering fetch is a database write (it leases the rows); a reply made meanwhile,
    from an async brain on the event loop, waited for it and held up the whole loop."""
    fetching, release = threading.Event(), threading.Event()

    def slow_fetch() -> list[Any]:
        fetching.set()
        assert release.wait(20)
        return []

    turn = Turn("s", [], lambda: None, StopFlag(), slow_fetch)
    fetch = threading.Thread(target=turn.steering)
    fetch.start()
    try:
        assert fetching.wait(10)
        replied = threading.Thread(target=turn.reply, args=("meanwhile",))
        replied.start()
        replied.join(10)
        assert not replied.is_alive()  # done while the fetch still runs
    finally:
        release.set()
        fetch.join(10)
    turn.close_steering()
    assert [e.text for e in turn.entries()] == ["meanwhile"]


@pytest.mark.timeout(10)
def test_the_timeout_stops_the_overdue_turn_and_never_the_session_s_next() -> None:
    """The tick lists the overdue turns under the board's lock and asks each to stop
    after it: an overdue turn that ended in between, its session's next turn begun (a
    commit leases the next row at once), had that fresh turn stopped as past its
    timeout, a failed attempt it never earned."""

    class Racing(RunningTurns):
        """Ends the overdue turn and begins the next the moment its stop is asked."""

        def request_stop(self, session_id: str, by: str | None, now: float | None = None,
                         turn_id: str | None = None) -> bool:
            if self.turn_id(session_id) == "m1":
                self.end(session_id)
                assert self.try_begin(session_id, 100.0, "m2") is not None
            return super().request_stop(session_id, by, now, turn_id)

    board = Racing()
    board.try_begin("s", 0.0, "m1")
    board.stop_overdue(100.0, timeout=30.0)
    assert board.turn_id("s") == "m2" and not board.stop_asked("s")


@pytest.mark.timeout(60)
def test_a_background_child_meeting_the_turns_end_midway_is_started_whole_or_not_at_all(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A background ``agent(...)`` queues three writes in the turn's outbox: the child's
    session, its task, its task message. From a thread the brain left running, the turn
    could end between the first and the second: the call was refused, yet the turn
    committed the child's session alone, a sub-agent with no task that never runs."""
    from kinbox.actors import child_tools as tools_module

    late = LateCall()

    class TaskAfterTheTurn(tools_module.TaskService):
        def create(self, *args: Any, **kwargs: Any) -> Any:
            late.hold()  # the child's session is queued already
            return super().create(*args, **kwargs)

    monkeypatch.setattr(tools_module, "TaskService", TaskAfterTheTurn)

    def brain(turn: Turn) -> str | None:
        if turn.session_id != parent:
            return "child done"
        tools = turn.tools
        late.leave_running(lambda: tools.agent("late work"))
        return None  # the brain returns while its call is between two of its writes

    rt = make_runtime(brain=brain)
    parent = rt.create_session(rt.create_project("p").id, "parent").id
    late.refused_after(rt, parent, "go")
    assert [s.id for s in rt.sessions() if s.parent_id == parent] == []


@pytest.mark.timeout(60)
def test_a_focal_dispatch_meeting_the_turns_end_midway_is_made_whole_or_not_at_all(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Focal's ``agent_send(agent_id="new", ...)`` queues the new session, its task and
    its message: a turn that ended between them (a thread the brain left running)
    committed the session alone, a session with no work Focal was told nothing of."""
    from kinbox.actors import focal as focal_module

    late = LateCall()

    class TaskAfterTheTurn(focal_module.TaskService):
        def create(self, *args: Any, **kwargs: Any) -> Any:
            late.hold()  # the new session is queued already
            return super().create(*args, **kwargs)

    monkeypatch.setattr(focal_module, "TaskService", TaskAfterTheTurn)

    def brain(turn: Turn) -> str | None:
        if turn.session_id != focal:
            return None
        tools = turn.tools
        late.leave_running(lambda: tools.agent_send(
            agent_id="new", project_id=project, title="late", task_title="the work",
            message="go"))
        return None  # the brain returns while its call is between two of its writes

    rt = make_runtime(brain=brain)
    focal = rt.get_or_create_focal_chat().id
    project = rt.create_project("p").id
    late.refused_after(rt, focal, "start something")
    assert [s.id for s in rt.sessions() if s.project_id == project] == []


@pytest.mark.timeout(60)
def test_a_focal_send_meeting_the_turns_end_midway_watches_only_with_its_message(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Focal's ``agent_send`` to a session marks it followed, then queues the message: a
    turn that ended between the two (a thread the brain left running) committed the mark
    alone, and Focal followed a session it had asked nothing of."""
    from kinbox.actors import focal as focal_module

    late = LateCall()
    real_watch = focal_module.Focal.watch

    def watch_then_wait(self: Any, session_id: str, writes: Any) -> None:
        real_watch(self, session_id, writes)
        late.hold()  # the mark is queued already

    monkeypatch.setattr(focal_module.Focal, "watch", watch_then_wait)

    def brain(turn: Turn) -> str | None:
        if turn.session_id != focal:
            return None
        tools = turn.tools
        late.leave_running(lambda: tools.agent_send(agent_id=worker, message="look into it"))
        return None  # the brain returns while its call is between its two writes

    rt = make_runtime(brain=brain)
    focal = rt.get_or_create_focal_chat().id
    worker = rt.create_session(rt.create_project("p").id, "worker").id
    late.refused_after(rt, focal, "delegate")
    session = rt.session(worker)
    assert session is not None and not session.config.get("focal_watching")
    assert rt.inbox(target=worker) == []


@pytest.mark.timeout(60)
def test_a_refused_late_task_update_does_not_change_what_the_turn_reports(
        make_runtime: MakeRuntime) -> None:
    """A child's brain returned with its task done, leaving a thread that then marked the
    task blocked. The call was refused ("This turn has ended"), yet it had already
    noted the task's new state in the turn's view of its writes, which the turn's report
    reads: the parent was told its child waits on the user, and the task, whose
    change was never written, stayed ``in_progress`` for good."""
    from kinbox.actors import ToolError

    go_on, done = threading.Event(), threading.Event()
    answers: list[object] = []

    def brain(turn: Turn) -> None:
        if not turn.session_id.startswith("subagent-"):
            return
        tools, task_id = turn.tools, turn.messages[0].payload["task_id"]

        def later() -> None:
            try:
                assert go_on.wait(20)
                answers.append(tools.task_update(task_id, status="blocked", blocked_on="user",
                                                 reason="one more question"))
            except ToolError as exc:
                answers.append(exc)
            finally:
                done.set()
        threading.Thread(target=later, daemon=True).start()
        turn.reply("report written")

    rt = make_runtime(brain=brain)
    lead = rt.create_session(rt.create_project("p").id, "Lead").id
    child = rt.tools_for(lead).agent("write the report")
    real_effects = rt.context.effects

    def effects(turn: Turn, outcome: Any) -> Any:
        if turn.session_id == child["agent_id"] and not go_on.is_set():  # brain returned
            go_on.set()
            assert done.wait(20)
        return real_effects(turn, outcome)

    rt.context.effects = effects  # type: ignore[method-assign]
    rt.run_until_idle()
    [answer] = answers
    assert isinstance(answer, ToolError) and "This turn has ended" in answer.message, answer
    [wake] = [r for r in rt.inbox(target=lead) if r["kind"] == "subagent_result"]
    assert (wake["payload"]["outcome"], wake["content"]) == ("completed", "report written")
    [task] = rt.tools_for(child["agent_id"]).task_list()["tasks"]
    assert (task["status"], task["reason"]) == ("completed", None)
