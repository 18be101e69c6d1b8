"""A foreground sub-agent's result reaches its parent once: as the ``agent`` tool's return
value, inside the turn that waited for it, never again as a wake-up of its own (an extra
model call, and a second copy of a result the agent already has). Its ``subagent_result``
row is taken into the waiting turn and acknowledged with that turn's commit; a failed
attempt hands it back for the retry, and a wait that timed out leaves it to wake the
parent as any background child's result does."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, PermanentFailure, Runtime, ToolError, Turn
from kinbox.persistence.driver_errors import OperationalError

from .helpers import failing_once, wait_for
from .test_turn_effects import drain_with_retries

pytestmark = pytest.mark.timeout(60)

MakeRuntime = Callable[..., Runtime]


AfterWait = Callable[[dict[str, Any], list[list[str]]], None]


def parent_turns(after_wait: AfterWait | None = None
                 ) -> tuple[Callable[[Turn], None], list[list[str]]]:
    """A sync brain: the child answers "42"; each turn of the parent (session "a") is
    recorded as the kinds it was started with, and its first one waits for the child,
    then calls ``after_wait(answer, turns)`` (which may fail the attempt) and replies."""
    turns: list[list[str]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("42")
            return
        turns.append([m.kind for m in turn.messages])
        if turn.messages[0].content == "go":
            got = turn.tools.agent("compute", run_in_background=False, timeout=30)
            if after_wait is not None:
                after_wait(got, turns)
            turn.reply(f"child said {got['result']}")
    return brain, turns


def family(rt: Runtime) -> None:
    p = rt.create_project("p")
    rt.create_session(p.id, "A", session_id="a")


def test_a_foreground_child_s_result_runs_no_extra_turn_of_its_parent(
        make_runtime: MakeRuntime) -> None:
    brain, turns = parent_turns()
    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    rt.run_until_idle(30)
    assert turns == [["agent_message"]]
    results = [r for r in rt.inbox(target="a") if r["kind"] == "subagent_result"]
    assert [r["status"] for r in results] == ["delivered"]
    assert sorted(rt.marker_counts().values()) == [1, 1, 1]  # go, the child's task, result


def test_on_each_backend_the_result_is_acknowledged_by_the_waiting_turn(
        make_runtime: MakeRuntime, any_db_url: str) -> None:
    brain, turns = parent_turns()
    rt = make_runtime(db=any_db_url, brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    rt.run_until_idle(30)
    assert turns == [["agent_message"]]
    assert {r["kind"]: r["status"] for r in rt.inbox(target="a")} == {
        "agent_message": "delivered", "subagent_result": "delivered"}
    # The result is in the transcript once, where the turn got it: before its reply.
    assert [(e.role, e.text) for e in rt.transcript("a")] == [
        ("user", "go"), ("user", "42"), ("assistant", "child said 42")]


def test_an_async_brain_s_awaited_foreground_child_wakes_it_no_more(
        make_runtime: MakeRuntime) -> None:
    turns: list[list[str]] = []

    async def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("42")
            return
        turns.append([m.kind for m in turn.messages])
        if turn.messages[0].content == "go":
            got = await turn.tools.agent("compute", run_in_background=False, timeout=30)
            turn.reply(f"child said {got['result']}")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    rt.run_until_idle(30)
    assert turns == [["agent_message"]]
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}


def test_a_failed_attempt_hands_the_result_back_and_its_retry_takes_it(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    got: list[dict[str, Any]] = []

    def fail_first(answer: dict[str, Any], _turns: list[list[str]]) -> None:
        got.append(answer)
        if len(got) == 1:
            raise RuntimeError("the model failed after the child answered")

    brain, turns = parent_turns(fail_first)

    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 2)
    assert turns == [["agent_message"], ["agent_message"]]
    assert [g["result"] for g in got] == ["42", "42"]
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}
    assert sorted(rt.marker_counts().values()) == [1, 1, 1]
    assert [e.text for e in rt.transcript("a")] == ["go", "42", "child said 42"]



def dying_first(taken: threading.Event, release: threading.Event
                ) -> Callable[[dict[str, Any], list[list[str]]], None]:
    """An answer hook whose first turn says it took the result (``taken``), waits for the
    process to be killed (``release``), then fails as the crash would."""
    def die_first(_answer: dict[str, Any], turns: list[list[str]]) -> None:
        if len(turns) == 1:
            taken.set()
            release.wait(30)  # the process dies here
            raise RuntimeError("crashed")
    return die_first

def test_a_result_taken_by_an_attempt_that_crashed_is_taken_by_the_retry(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """The crashed attempt had leased the result into its turn: after the restart its lease
    is a dead worker's, and the retry (which finds the child that ran) takes it over."""
    taken, release = threading.Event(), threading.Event()
    die_first = dying_first(taken, release)

    brain, turns = parent_turns(die_first)

    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    assert taken.wait(20)
    [result] = [r for r in rt.inbox(target="a") if r["kind"] == "subagent_result"]
    assert result["status"] == "processing"  # leased into the waiting turn
    rt.crash()
    release.set()
    after = make_runtime(brain=brain, max_active_sessions=4)
    after.run_until_idle(30)
    assert turns == [["agent_message"], ["agent_message"]]
    assert {r["status"] for r in after.inbox(target="a")} == {"delivered"}
    assert sorted(after.marker_counts().values()) == [1, 1, 1]
    assert [e.text for e in after.transcript("a")] == ["go", "42", "child said 42"]


def test_a_wait_that_timed_out_leaves_the_result_to_wake_the_parent(
        make_runtime: MakeRuntime) -> None:
    """The parent did not get the result: it comes as a wake-up, as a background child's."""
    turns: list[list[str]] = []
    gave_up = threading.Event()

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            assert gave_up.wait(30)  # finishes only once its parent stopped waiting
            turn.reply("42")
            return
        turns.append([m.kind for m in turn.messages])
        if turn.messages[0].content == "go":
            try:
                turn.tools.agent("compute", run_in_background=False, timeout=1)
            except ToolError:
                gave_up.set()
                turn.reply("still running")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    rt.run_until_idle(30)
    assert turns == [["agent_message"], ["subagent_result"]]
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}


def test_a_foreground_child_that_failed_says_so_and_why(make_runtime: MakeRuntime) -> None:
    """The waiting turn takes the child's failure wake-up into itself (it wakes the parent
    no more), so the tool's answer is all the parent's model hears of it: it was
    ``{"status": "blocked", "result": None}``, a child waiting on the user as far as the
    model could tell, and the failure it needed to act on was never shown to it."""
    got: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            raise PermanentFailure("the child's model is down")
        got.append(turn.tools.agent("compute", run_in_background=False, timeout=30))
        turn.reply("done")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    rt.run_until_idle(30)
    [answer] = got
    assert answer["status"] == "failed" and answer["result"] is None
    assert "the child's model is down" in answer["error"]
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}  # no second wake-up


# -- turns no inbox row started: cron runs and social events ------------------------------------

def direct_parent(session_prefix: str, after_wait: AfterWait | None = None
                  ) -> tuple[Callable[[Turn], Any], list[list[str]]]:
    """A sync brain whose direct turns (sessions starting with ``session_prefix``) wait for
    a foreground child; any other turn of those sessions is recorded too."""
    turns: list[list[str]] = []

    def brain(turn: Turn) -> Any:
        if not turn.session_id.startswith(session_prefix):
            return "42"
        turns.append([m.kind for m in turn.messages])
        if turn.messages[0].kind in ("cron", "social_message"):
            got = turn.tools.agent("compute", run_in_background=False, timeout=30)
            if after_wait is not None:
                after_wait(got, turns)
            return f"child said {got['result']}"
        return "woken again"
    return brain, turns


def async_direct_parent(session_prefix: str) -> tuple[Callable[[Turn], Any], list[list[str]]]:
    turns: list[list[str]] = []

    async def brain(turn: Turn) -> Any:
        if not turn.session_id.startswith(session_prefix):
            return "42"
        turns.append([m.kind for m in turn.messages])
        if turn.messages[0].kind in ("cron", "social_message"):
            got = await turn.tools.agent("compute", run_in_background=False, timeout=30)
            return f"child said {got['result']}"
        return "woken again"
    return brain, turns


def run_cron_job(rt: Runtime, clock: ManualClock) -> str:
    job_id = str(rt.cron.add("report", "* * * * *", "Report.")["job_id"])
    clock.advance(60)
    rt.run_until_idle(30)
    assert rt.cron.wait_idle(30)
    rt.run_until_idle(30)
    return f"cron-{job_id}"


def social_event(text: str = "compute it") -> dict[str, Any]:
    return {"platform": "slack", "sender_id": "U1", "sender_name": "u", "thread_id": "T1",
            "text": text, "reply_route": {"channel": "C9", "ts": "T1"}}


def run_social_event(rt: Runtime) -> str:
    sent: list[tuple[Any, str]] = []
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=lambda route, text: sent.append((route, text)))
    assert rt.social.ingest(social_event())["accepted"]
    assert rt.social.wait_idle(30)
    rt.run_until_idle(30)
    assert sent and sent[-1][1] == "child said 42"
    return "social-slack-T1"


def assert_taken_once(rt: Runtime, sid: str, turns: list[list[str]], kind: str) -> None:
    assert turns == [[kind]]  # no turn of the parent on its child's result
    results = [r for r in rt.inbox(target=sid) if r["kind"] == "subagent_result"]
    assert [r["status"] for r in results] == ["delivered"]
    texts = [e.text for e in rt.transcript(sid) if e.role in ("user", "assistant")]
    assert texts[1:] == ["42", "child said 42"]  # the result, where the turn got it


@pytest.mark.parametrize("make_brain", [direct_parent, async_direct_parent],
                         ids=["sync", "async"])
def test_a_cron_turn_s_foreground_child_wakes_its_session_no_more(
        make_runtime: MakeRuntime, clock: ManualClock, any_db_url: str,
        make_brain: Callable[[str], tuple[Callable[[Turn], Any], list[list[str]]]]) -> None:
    brain, turns = make_brain("cron-")
    rt = make_runtime(db=any_db_url, brain=brain, max_active_sessions=4)
    sid = run_cron_job(rt, clock)
    assert_taken_once(rt, sid, turns, "cron")
    [run] = rt.cron.runs()
    assert run["status"] == "success" and run["result"] == "child said 42"


@pytest.mark.parametrize("make_brain", [direct_parent, async_direct_parent],
                         ids=["sync", "async"])
def test_a_social_turn_s_foreground_child_wakes_its_session_no_more(
        make_runtime: MakeRuntime, any_db_url: str,
        make_brain: Callable[[str], tuple[Callable[[Turn], Any], list[list[str]]]]) -> None:
    brain, turns = make_brain("social-")
    rt = make_runtime(db=any_db_url, brain=brain, max_active_sessions=4)
    sid = run_social_event(rt)
    assert_taken_once(rt, sid, turns, "social_message")


def test_a_failed_cron_attempt_hands_the_result_back_to_wake_its_session(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """The attempt that got the result never committed: the result is the session's to
    hear (a cron retry is another occurrence, with a child of its own), once, and no row
    stays leased to a turn that is over."""
    def fail(_answer: dict[str, Any], _turns: list[list[str]]) -> None:
        raise RuntimeError("the model failed after the child answered")

    brain, turns = direct_parent("cron-", fail)
    rt = make_runtime(brain=brain, max_active_sessions=4)
    sid = run_cron_job(rt, clock)
    assert turns == [["cron"], ["subagent_result"]]
    assert {r["kind"]: r["status"] for r in rt.inbox(target=sid)} == {
        "subagent_result": "delivered"}
    assert [r["status"] for r in rt.cron.runs()] == ["error"]


def test_a_result_taken_by_a_cron_turn_that_crashed_is_neither_lost_nor_run_twice(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """The crashed run had leased the result into its turn. After the restart the row is
    a dead worker's, claimable again, and the run is taken over (the same run: it finds the
    same child and its answer). The restart's first claim comes before the takeover's
    turn, so the result wakes the session once, as it did before turns no row started
    could take it: what must hold is that it is delivered once and the run's reply
    commits once."""
    taken, release = threading.Event(), threading.Event()
    die_first = dying_first(taken, release)

    brain, turns = direct_parent("cron-", die_first)
    rt = make_runtime(brain=brain, max_active_sessions=4)
    job_id = str(rt.cron.add("report", "* * * * *", "Report.")["job_id"])
    clock.advance(60)
    assert taken.wait(20)
    sid = f"cron-{job_id}"
    [result] = [r for r in rt.inbox(target=sid) if r["kind"] == "subagent_result"]
    assert result["status"] == "processing"  # leased into the waiting turn
    rt.crash()
    release.set()
    after = make_runtime(brain=brain, max_active_sessions=4)
    assert after.cron.wait_idle(30)
    after.run_until_idle(30)
    assert [t for t in turns if t == ["cron"]] == [["cron"], ["cron"]]
    assert turns[:1] == [["cron"]] and len(turns) <= 3
    assert {r["status"] for r in after.inbox(target=sid)} == {"delivered"}
    [run] = after.cron.runs()
    assert run["status"] == "success" and run["attempts"] == 2
    replies = [e.text for e in after.transcript(sid) if e.role == "assistant"]
    assert replies.count("child said 42") == 1
    assert [e.text for e in after.transcript(sid)].count("42") == 1  # the result, once
    assert set(after.marker_counts().values()) == {1}


def test_a_social_turn_whose_commit_failed_hands_the_result_back_unlost(
        make_runtime: MakeRuntime) -> None:
    """The commit that would have acknowledged the result failed (a database error):
    nothing of the turn is written, the result is handed back, and the event runs again
    with the same child. The retry takes the result if it is still free, or it has woken
    the session already; either way it is delivered once and answered once."""
    brain, turns = direct_parent("social-")
    rt = make_runtime(brain=brain, max_active_sessions=4)
    failures: list[str] = []
    store = rt.context.store
    store.patch_config_now = failing_once(  # type: ignore[method-assign]
        store.patch_config_now, OperationalError("disk I/O error"), failures, "commit")
    sid = run_social_event(rt)
    assert failures == ["commit"]
    assert turns.count(["social_message"]) == 2 and len(turns) <= 3
    [result] = [r for r in rt.inbox(target=sid) if r["kind"] == "subagent_result"]
    assert result["status"] == "delivered"
    children = [s for s in rt.sessions() if s.kind == "subagent"]
    assert len(children) == 1  # the retry found the child that ran
    assert [e.text for e in rt.transcript(sid)].count("42") == 1


def test_a_foreground_child_handed_back_by_a_deploy_is_waited_for_not_reported_half_done(
        make_runtime: MakeRuntime, any_db_url: str) -> None:
    """A graceful stop (a deploy) ends a running child's turn: its task message is
    acknowledged and handed back as ``-resumed``, which the next start runs. The waiting
    parent took that acknowledgement for the child's end: its ``agent`` call returned the
    task ``in_progress`` with the half-done reply, before the stop and again after the
    restart, and the real result then woke the parent in a turn of its own."""
    running = threading.Event()
    answers: list[Any] = []
    woken: list[str] = []

    def first_life(turn: Turn) -> None:
        if turn.session_id != "a":
            running.set()
            turn.wait_stop_requested(30)
            turn.reply("half done")  # it did something: the task is handed back
            return
        try:
            answers.append(turn.tools.agent("clean up", run_in_background=False, timeout=30))
        except ToolError as exc:
            answers.append(exc.message)

    def second_life(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("all clean")
        elif turn.messages[0].kind == "subagent_result":
            woken.extend(m.content for m in turn.messages)
        else:
            answers.append(turn.tools.agent("clean up", run_in_background=False, timeout=30))

    rt = make_runtime(db=any_db_url, brain=first_life, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    assert running.wait(10)
    rt.stop()
    again = make_runtime(db=any_db_url, brain=second_life, max_active_sessions=4)
    again.run_until_idle(30)
    # The parent hears the child's end once: as the answer of its agent() call when the
    # stop handed its turn back to run again, or as a wake-up when that turn committed
    # (its wait stopped); never the task in_progress with the half-done reply.
    heard = [(a["status"], a["result"]) for a in answers if isinstance(a, dict)]
    heard += [("completed", text) for text in woken]
    assert heard == [("completed", "all clean")], (answers, woken)


def _steered_after_a_foreground_child(rt: Runtime, ready: threading.Event,
                                      steered: list[str], own_turns: list[str]) -> None:
    family(rt)
    rt.post("a", "go")
    assert ready.wait(30)
    rt.post("a", "later")
    rt.run_until_idle(30)
    assert steered == ["later"] and own_turns == []
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}


def test_steering_goes_on_after_a_foreground_child_s_result_joined_the_turn(
        make_runtime: MakeRuntime) -> None:
    """The child's result row, taken into the waiting turn, is processing after the rows
    steering had taken; steering stopped at the first row it could not lease, so no
    message sent after the child answered reached the turn (each ran a turn of its own,
    after it)."""
    ready, steered, own_turns = threading.Event(), [], []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("42")
        elif turn.messages[0].content == "go":
            turn.tools.agent("compute", run_in_background=False, timeout=30)
            ready.set()
            deadline = time.monotonic() + 15
            while not steered and time.monotonic() < deadline:
                steered.extend(m.content for m in turn.steering())
                turn.wait_stop_requested(0.02)
        else:
            own_turns.append(turn.messages[0].content)

    _steered_after_a_foreground_child(make_runtime(brain=brain, max_active_sessions=4),
                                      ready, steered, own_turns)


def test_async_steering_goes_on_after_a_foreground_child_s_result_joined_the_turn(
        make_runtime: MakeRuntime) -> None:
    ready, steered, own_turns = threading.Event(), [], []

    async def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("42")
        elif turn.messages[0].content == "go":
            await turn.tools.agent("compute", run_in_background=False, timeout=30)
            ready.set()
            deadline = time.monotonic() + 15
            while not steered and time.monotonic() < deadline:
                steered.extend(m.content for m in await turn.asteering())
                await turn.stopped(0.02)
        else:
            own_turns.append(turn.messages[0].content)

    _steered_after_a_foreground_child(make_runtime(brain=brain, max_active_sessions=4),
                                      ready, steered, own_turns)


def test_a_child_whose_task_ended_outside_a_turn_answers_its_end_not_in_progress(
        make_runtime: MakeRuntime) -> None:
    """A child's task message can end outside any turn (an operator's cancel, a claim that
    fails it): the row ends in one transaction and its report (the task's end, the
    parent's wake-up) follows in another, made by whoever ended it, or up to 30 s later
    by a runtime's look for them when that process died in between. A foreground parent
    that looked in between took the child for finished and answered its task as it
    stood, ``in_progress`` with no result, for a child that will never run."""
    release = threading.Event()
    got: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "busy":
            release.wait(30)  # holds the second session thread: the child stays pending
        elif turn.session_id == "a":
            got.append(turn.tools.agent("compute", run_in_background=False, timeout=30))
        else:
            turn.reply("42")

    rt = make_runtime(brain=brain, max_active_sessions=2)
    family(rt)
    rt.create_session(rt.project("p").id, "Busy", session_id="busy")  # type: ignore[union-attr]
    rt.post("busy", "hold a thread")
    wait_for(lambda: rt.context.turns.running() == ["busy"], 30, "the busy turn")
    rt.post("a", "go")
    task_rows = lambda: [r for r in rt.inbox() if r["kind"] == "subagent_task"]  # noqa: E731
    wait_for(lambda: len(task_rows()) == 1, 30, "the child's task message")
    try:
        # The cancel's first transaction alone: its process died before the report.
        rt.context.journal.cancel(task_rows()[0]["message_id"], rt.context.now(),
                                  by="operator", reason="not needed")
        wait_for(lambda: bool(got), 30, "the parent's answer")
    finally:
        release.set()
    assert got[0]["status"] == "cancelled", got[0]
    rt.run_until_idle(30)
    assert {r["status"] for r in rt.inbox(target="a")} == {"delivered"}


@pytest.mark.parametrize("kind", ["cron", "social"])
def test_a_direct_turn_cut_short_by_a_deploy_hands_its_taken_result_back(
        make_runtime: MakeRuntime, clock: ManualClock, any_db_url: str, kind: str) -> None:
    """The stop cancelled the turn past its grace after it took its foreground child's
    result: the turn's other rows went back, but the result stayed leased to a runtime
    that had stopped, to be taken over at the next start as a dead worker's (suspect, its
    turns one at a time) instead of being the session's at once."""
    took = threading.Event()

    async def brain(turn: Turn) -> Any:
        if not turn.session_id.startswith(f"{kind}-"):
            return "42"
        await turn.tools.agent("compute", run_in_background=False, timeout=30)
        took.set()
        await asyncio.Event().wait()  # a model call the deploy outlasts

    rt = make_runtime(db=any_db_url, brain=brain, max_active_sessions=4, stop_grace=0.3)
    if kind == "cron":
        job_id = str(rt.cron.add("report", "* * * * *", "Report.")["job_id"])
        clock.advance(60)
        sid = f"cron-{job_id}"
    else:
        rt.social.allow("slack", ["U1"])
        rt.social.register_channel("slack", send=lambda route, text: None)
        assert rt.social.ingest(social_event())["accepted"]
        sid = "social-slack-T1"
    assert took.wait(30)
    rt.stop(timeout=20)
    after = make_runtime(db=any_db_url)  # send-only: it reads, delivers nothing
    [result] = [r for r in after.inbox(target=sid) if r["kind"] == "subagent_result"]
    assert (result["status"], result["lease_owner"], result["attempts"]) == ("pending", None, 0)


@pytest.mark.parametrize("kind", ["cron", "social"])
def test_a_direct_turn_s_foreground_child_runs_on_the_one_session_thread(
        make_runtime: MakeRuntime, clock: ManualClock, kind: str) -> None:
    """A cron run or a social event runs on the direct turns' own pool, not on a session
    thread: its wait leaves every session thread free for the child. With
    ``max_active_sessions=1`` it was refused as if it held the only one ("none can free
    up"), and the run failed; its wait also counted as holding one, so an inbox parent
    waiting beside it could be refused the same way."""
    brain, turns = direct_parent(f"{kind}-")
    rt = make_runtime(brain=brain, max_active_sessions=1)
    if kind == "cron":
        sid = run_cron_job(rt, clock)
        [run] = rt.cron.runs()
        assert (run["status"], run["error"]) == ("success", None)
    else:
        sid = run_social_event(rt)
    assert_taken_once(rt, sid, turns, "cron" if kind == "cron" else "social_message")
    assert rt.context.foreground_waits == 0


def test_an_inbox_parent_is_not_refused_for_a_direct_turn_waiting_beside_it(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """Two session threads: a cron run waits for its child (on the direct pool) while an
    inbox parent waits for its own (one thread), and their children take turns on the
    other. The cron run's wait was counted as holding a thread, and the parent was told
    that none could free up."""
    cron_waiting, release = threading.Event(), threading.Event()
    answers: list[Any] = []

    def brain(turn: Turn) -> Any:
        if turn.session_id.startswith("cron-"):
            got = turn.tools.agent("slow report", run_in_background=False, timeout=30)
            return f"child said {got['result']}"
        if turn.session_id == "a":
            assert cron_waiting.wait(30)
            try:
                answers.append(turn.tools.agent("compute", run_in_background=False,
                                                timeout=30)["result"])
            finally:
                release.set()
            return None
        if turn.messages[0].content == "slow report":
            cron_waiting.set()
            assert release.wait(30)  # holds the other thread until the parent has asked
        return "42"

    rt = make_runtime(brain=brain, max_active_sessions=2)
    # The cron run's child gives its thread back once the parent's child is started.
    rt.subscribe(lambda event, data: release.set() if (
        event == "sent" and data["kind"] == "subagent_task" and data["sender"] == "a") else None)
    family(rt)
    rt.post("a", "go")
    sid = run_cron_job(rt, clock)
    rt.run_until_idle(30)
    assert answers == ["42"]
    assert [r["result"] for r in rt.cron.runs()] == ["child said 42"]
    assert [e.text for e in rt.transcript(sid) if e.role == "assistant"] == ["child said 42"]
    assert rt.context.foreground_waits == 0


def test_a_retried_wait_answers_the_child_s_result_not_what_it_said_since(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """The answer of a wait is the child's result: what its task's end said, as the
    wake-up the waiting turn takes says it. It was the child's newest reply in its
    transcript, so a retried attempt (which finds the same finished child) answered
    whatever the child had said since, to a sibling or a user, as the task's result."""
    got: list[dict[str, Any]] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "a":
            turn.reply("42" if turn.messages[0].kind == "subagent_task" else "fine, thanks")
            return
        answer = turn.tools.agent("compute", run_in_background=False, timeout=30)
        got.append(answer)
        if len(got) == 1:
            rt.post(answer["agent_id"], "how are you?")  # the child talks on meanwhile
            raise RuntimeError("the model failed after the child answered")
        turn.reply(f"child said {answer['result']}")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    family(rt)
    rt.post("a", "go")
    drain_with_retries(rt, clock, 2)
    assert [(g["status"], g["result"]) for g in got] == [("completed", "42")] * 2
    assert [e.text for e in rt.transcript("a")] == ["go", "42", "child said 42"]
