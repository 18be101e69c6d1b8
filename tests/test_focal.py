"""The Focal agent through a real runtime on the injected clock (FO1-FO7)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import ConfigError, ManualClock, Runtime, ToolError, Turn
from kinbox.actors.focal import FOCAL_ID, is_focal_chat
from kinbox.actors.focal_heartbeat import (
    CHECKLIST_LIMIT,
    CHECKLIST_READ,
    DEFAULT_FOCAL_HEARTBEAT,
)
from kinbox.actors.focal_schedule import next_after
from kinbox.actors.validation import SEND_LIMIT
from kinbox.persistence import JobRecord, JobStore, SessionRecord

from .conftest import Stores, ids_read
from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]


class FocalBrain:
    """Records Focal turns; other sessions run scripts keyed by title."""

    def __init__(self) -> None:
        self.focal_turns: list[Turn] = []
        self.focal_reply: str | None = "noted"
        self.focal_fails = False
        self.focal_script: Callable[[Turn], None] | None = None
        self.scripts: dict[str, Callable[[Turn], None]] = {}
        self.rt: Runtime | None = None

    def __call__(self, turn: Turn) -> None:
        if turn.session_id == FOCAL_ID:
            self.focal_turns.append(turn)
            if self.focal_fails:
                raise RuntimeError("model unavailable")
            if self.focal_script is not None:
                self.focal_script(turn)
            if self.focal_reply:
                turn.reply(self.focal_reply)
            return
        assert self.rt is not None
        session = self.rt.session(turn.session_id)
        script = self.scripts.get(session.title if session else "")
        if script:
            script(turn)


@pytest.fixture
def focal_rt(make_runtime: MakeRuntime, tmp_path: Path) -> tuple[Runtime, FocalBrain]:
    brain = FocalBrain()
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data", max_active_sessions=8)
    brain.rt = rt
    return rt, brain


def kinds_to_focal(rt: Runtime) -> list[str]:
    return [r["kind"] for r in rt.inbox(target=FOCAL_ID)]


# -- FO1 ---------------------------------------------------------------------------------------

def test_the_focal_chat_is_created_once_in_a_hidden_project(focal_rt: tuple[Runtime, Any],
                                                            tmp_path: Path) -> None:
    rt, _ = focal_rt
    assert rt.focal.exists() is False
    chat = rt.get_or_create_focal_chat()
    assert (chat.id, chat.kind, chat.title) == (FOCAL_ID, "focal", "SUZENT")
    project = rt.context.store.project(chat.project_id or "")
    assert project is not None and (project.slug, project.hidden) == ("suzent-focal", True)
    heartbeat = tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md"
    assert heartbeat.read_text() == DEFAULT_FOCAL_HEARTBEAT
    heartbeat.write_text("- my checklist")
    assert rt.get_or_create_focal_chat().id == FOCAL_ID
    assert heartbeat.read_text() == "- my checklist"  # seeded once
    assert [j.kind for j in rt.context.focal.schedule.jobs.active()] == ["heartbeat"]


def test_a_data_folder_that_cannot_hold_heartbeat_md_leaves_focal_and_its_heartbeat_working(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """heartbeat.md is seeded once for the user to edit; without one the default checklist
    runs. A data folder that could not hold it (a file in the way, no permission, a
    read-only mount) raised a bare OSError from every ``get_or_create_focal_chat()``
    (``GET /focal`` with it), the heartbeat's job was never made, and Focal never checked
    in again."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "projects").write_text("in the way")
    brain = FocalBrain()
    rt = make_runtime(brain=brain, data_dir=tmp_path / "data")
    brain.rt = rt
    with caplog.at_level(logging.WARNING, logger="kinbox.focal"):
        assert rt.get_or_create_focal_chat().id == FOCAL_ID
    [warning] = [r.getMessage() for r in caplog.records if r.name == "kinbox.focal"]
    assert "heartbeat.md" in warning and "default checklist" in warning
    assert rt.get_or_create_focal_chat().id == FOCAL_ID  # once: no warning each call
    assert len([r for r in caplog.records if r.name == "kinbox.focal"]) == 1
    assert rt.focal.heartbeat().enabled
    stall_a_session(rt)
    clock.advance(30 * 60)
    rt.run_until_idle()
    [beat] = heartbeats(rt)
    assert beat["content"].startswith(DEFAULT_FOCAL_HEARTBEAT)


def test_a_product_project_cannot_take_the_hidden_focal_projects_slug(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """Focal lives in the hidden project ``suzent-focal`` (FO1), made on first use by
    slug. A product's project of that slug made first became Focal's: Focal sat in a
    visible project, and every session of it could read Focal's transcript (every
    project's context) and stop its turns. The slug is the runtime's."""
    rt, _ = focal_rt
    with pytest.raises(ConfigError) as refused:
        rt.create_project("suzent-focal")
    assert refused.value.field == "slug"
    chat = rt.get_or_create_focal_chat()
    project = rt.context.store.project(chat.project_id or "")
    assert project is not None and (project.slug, project.hidden) == ("suzent-focal", True)


def test_the_title_is_pinned(focal_rt: tuple[Runtime, Any]) -> None:
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    assert rt.focal.rename(FOCAL_ID, "My assistant", auto=True) is False
    rt.context.store.update_session(FOCAL_ID, 0, title="Renamed")
    assert rt.get_or_create_focal_chat().title == "SUZENT"


def test_a_rename_is_held_to_the_title_rule(focal_rt: tuple[Runtime, Any]) -> None:
    """A blank or over-long title (an auto-titler's) is refused with a clear error and the
    title kept; it was written as it came (PostgreSQL refused it deep in the write)."""
    rt, _ = focal_rt
    s = rt.create_session(rt.create_project("p").id, "worker")
    for bad in ("   ", "x" * 513, 7):
        with pytest.raises(ToolError, match="title") as caught:
            rt.focal.rename(s.id, bad, auto=True)
        assert caught.value.code == "invalid_argument"
    assert rt.session(s.id).title == "worker"  # type: ignore[union-attr]
    assert rt.focal.rename(s.id, " report writer ", auto=True)
    assert rt.session(s.id).title == "report writer"  # type: ignore[union-attr]


def test_is_focal_chat_is_the_fixed_id_and_kind_not_a_config_marker() -> None:
    def rec(sid: str, config: dict[str, Any], kind: str = "interactive",
            platform: str | None = None) -> SessionRecord:
        return SessionRecord(sid, None, "t", kind, platform, None, "idle", 0, 0, config)
    assert is_focal_chat(rec(FOCAL_ID, {}, kind="focal"))
    assert not is_focal_chat(rec("x", {"is_focal_agent": True}))
    assert not is_focal_chat(rec("x", {"platform": "focal"}))
    assert not is_focal_chat(rec("x", {}, kind="focal", platform="focal"))
    assert not is_focal_chat(rec("x", {}))
    assert not is_focal_chat(None)


# -- FO2, FO3 ----------------------------------------------------------------------------------

def test_every_focal_turn_runs_under_the_policy_with_the_global_context(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    rt, brain = focal_rt
    rt.focal.register_tool("bash", group="shell")
    rt.get_or_create_focal_chat()
    rt.context.store.patch_config(FOCAL_ID, {"tools": ["bash"], "cwd": "/repo",
                                             "mcp_enabled": True}, 0)
    web = rt.create_project("web")
    rt.create_session(web.id, "Frontend")
    rt.tools_for(rt.create_session(web.id, "Docs").id).task_create("write docs")
    rt.post(FOCAL_ID, "what is going on?", sender="user")
    rt.run_until_idle()
    turn = brain.focal_turns[0]
    assert "schedule_wakeup" in turn.request.tools and "bash" in turn.request.denied_tools
    assert (turn.request.mcp_enabled, turn.request.cwd, turn.request.permission_mode) == (
        False, None, "full_access")
    assert "project web" in turn.context and "session Docs" in turn.context
    assert "Frontend" not in turn.context  # no tasks, not running


def test_a_focal_turn_reads_only_the_sessions_its_context_can_list(
        focal_rt: tuple[Runtime, FocalBrain], monkeypatch: pytest.MonkeyPatch) -> None:
    """The context lists at most ten sessions with a task or a turn: a project's hundreds
    of finished sessions are not read for it, so a Focal turn's cost does not grow with
    every session the database ever had."""
    from kinbox.persistence import sessions as session_store

    rt, _ = focal_rt
    web = rt.create_project("web")
    for i in range(200):
        rt.create_session(web.id, f"old {i}")
    rt.tools_for(rt.create_session(web.id, "Docs").id).task_create("write docs")
    read = ids_read(monkeypatch, session_store, "_session")
    context = rt.focal.global_context()
    assert "session Docs" in context and "old " not in context
    assert len(read) <= 2, f"{len(read)} sessions read for a context listing one"


def test_no_other_session_can_use_or_find_schedule_wakeup(focal_rt: tuple[Runtime, Any]) -> None:
    rt, _ = focal_rt
    other = rt.create_session(rt.create_project("p").id, "worker")
    with pytest.raises(ToolError, match="only available to the Focal agent"):
        rt.tools_for(other.id).schedule_wakeup("reminder", at=rt.clock.now() + 60)
    assert rt.focal.search_tools(other.id, "wake") == []
    with pytest.raises(ToolError, match="reserved"):
        rt.focal.register_tool("schedule_wakeup")


# -- FO4 ---------------------------------------------------------------------------------------

def test_focal_dispatches_to_a_new_session_with_a_task(focal_rt: tuple[Runtime, Any]) -> None:
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    web = rt.create_project("web")
    out = rt.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=web.id,
                                            title="Fix login", task_title="fix the login bug",
                                            message="Users cannot log in; please fix it.")
    rt.run_until_idle()
    session = rt.session(out["agent_id"])
    assert session is not None and session.project_id == web.id
    assert session.parent_id == FOCAL_ID
    assert session.config["permission_mode"] == "auto" and session.config["spawned_by_focal"]
    tasks = rt.tools_for(session.id).task_list()["tasks"]
    assert [(t["title"], t["status"]) for t in tasks] == [("fix the login bug", "in_progress")]
    assert (rt.transcript(session.id)[0].role, rt.transcript(session.id)[0].text) == (
        "user", "Users cannot log in; please fix it.")


def test_sending_to_an_existing_session_marks_it_watched(focal_rt: tuple[Runtime, Any]) -> None:
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    s = rt.create_session(rt.create_project("p").id, "worker")
    rt.tools_for(FOCAL_ID).agent_send(s.id, "status?")
    assert rt.session(s.id).config["focal_watching"] is True  # type: ignore[union-attr]


def test_only_focal_may_dispatch_new_sessions(focal_rt: tuple[Runtime, Any]) -> None:
    rt, _ = focal_rt
    p = rt.create_project("p")
    me = rt.create_session(p.id, "me")
    with pytest.raises(ToolError, match="not available"):
        rt.tools_for(me.id).agent_send("new", "hi")
    with pytest.raises(ToolError, match="exactly agent_id and message"):
        rt.tools_for(me.id).agent_send("new", "hi", project_id=p.id, title="x")
    assert len(rt.sessions(p.id)) == 1


# -- FO5 ---------------------------------------------------------------------------------------

def test_answers_blocks_and_finishes_reach_focal(focal_rt: tuple[Runtime, FocalBrain]) -> None:
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    web = rt.create_project("web")
    brain.scripts["Fix"] = lambda turn: turn.reply("x" * 5000)
    out = rt.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=web.id, title="Fix",
                                            task_title="fix it", message="go")
    rt.run_until_idle()
    replies = [r for r in rt.inbox(target=FOCAL_ID) if r["kind"] == "agent_message"]
    assert len(replies) == 1 and len(replies[0]["content"]) == 4000
    tools = rt.tools_for(out["agent_id"])
    task_id = out["task_id"]
    tools.task_update(task_id, status="blocked", blocked_on="user", reason="which browser?")
    tools.task_update(task_id, reason="which browser and OS?")
    tools.task_update(task_id, status="completed")
    rt.run_until_idle()
    assert kinds_to_focal(rt) == ["agent_message", "task_blocked_notification",
                                  "task_blocked_notification", "session_finished_notification"]
    assert rt.focal.unread >= 1  # Focal's woken replies queued user notifications


def test_a_state_noticed_before_a_rename_is_noticed_again_and_the_change_holds(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """A notice's text names the session. A session renamed between two times its task
    entered one state once made the second notice a reuse of the first's id with other
    content: the task change itself was refused (an IdempotencyConflict), and a turn
    making it failed on every attempt. Each notice now takes a fresh id."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    s = rt.create_session(rt.create_project("p").id, "first name")
    rt.tools_for(FOCAL_ID).agent_send(s.id, "look into it")  # followed from now on
    rt.run_until_idle()
    tools = rt.tools_for(s.id)
    t = tools.task_create("x", status="in_progress")["task_id"]
    tools.task_update(t, status="blocked", blocked_on="user", reason="which format?")
    tools.task_update(t, status="completed")
    assert rt.focal.rename(s.id, "second name")
    tools.task_update(t, status="in_progress")  # the user reopened it
    tools.task_update(t, status="blocked", blocked_on="user", reason="which format?")

    def settle_in_a_turn(turn: Turn) -> None:
        turn.tools.task_update(t, status="completed")
        turn.reply("done")
    brain.scripts["second name"] = settle_in_a_turn
    rt.post(s.id, "csv")
    rt.run_until_idle()
    task = rt.context.tasks.get(t)
    assert task is not None and task.status == "completed"
    assert [r["status"] for r in rt.inbox(target=s.id)] == ["delivered", "delivered"]
    notices = [r["kind"] for r in rt.inbox(target=FOCAL_ID) if r["kind"].endswith("notification")]
    assert notices == ["task_blocked_notification", "session_finished_notification"] * 2


def test_a_task_blocked_again_after_it_was_unblocked_is_noticed_again(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """Blocked on the same question twice in a row is one notice; blocked again after it
    was unblocked is a new one (the notice's id named the state, so the second was
    dropped and Focal never heard the session was waiting on the user again)."""
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    out = rt.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=rt.create_project("p").id,
                                            title="Fix", task_title="fix it", message="go")
    rt.run_until_idle()
    tools, t = rt.tools_for(out["agent_id"]), out["task_id"]
    tools.task_update(t, status="blocked", blocked_on="user", reason="which browser?")
    tools.task_update(t, status="blocked", blocked_on="user", reason="which browser?")
    tools.task_update(t, status="in_progress")  # the user answered
    tools.task_update(t, status="blocked", blocked_on="user", reason="which browser?")
    tools.task_update(t, status="completed")
    tools.task_update(t, status="in_progress")  # reopened, and finished again
    tools.task_update(t, status="completed")
    rt.run_until_idle()
    notices = [r["kind"] for r in rt.inbox(target=FOCAL_ID) if r["kind"].endswith("notification")]
    assert notices == ["task_blocked_notification"] * 2 + ["session_finished_notification"] * 2


def test_blocked_notices_never_create_the_focal_chat(focal_rt: tuple[Runtime, Any]) -> None:
    rt, _ = focal_rt
    s = rt.create_session(rt.create_project("p").id, "worker")
    tools = rt.tools_for(s.id)
    t = tools.task_create("x", status="in_progress")["task_id"]
    tools.task_update(t, status="blocked", blocked_on="user")
    assert rt.focal.exists() is False and rt.inbox() == []


def test_finished_notice_waits_while_a_focal_request_is_in_flight(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    release = threading.Event()

    def slow(turn: Turn) -> None:
        release.wait(10)
        turn.reply("y is fine too")
    brain.scripts["Slow"] = slow
    s = rt.create_session(rt.create_project("p").id, "Slow")
    tools = rt.tools_for(s.id)
    t = tools.task_create("x", status="in_progress")["task_id"]
    rt.tools_for(FOCAL_ID).agent_send(s.id, "please also check y")
    tools.task_update(t, status="completed")
    release.set()
    rt.run_until_idle()
    assert kinds_to_focal(rt) == ["agent_message"]  # the answer tells Focal


def test_a_finish_held_back_for_a_request_answered_without_a_reply_is_noticed(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """The finished notice waits while Focal's request is in flight because the answer
    tells Focal; a turn that answers with a tool call only (it completes the task, says
    nothing) sent no answer, and Focal never heard the session had finished. A closing
    noticed before Focal asked is not noticed again."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    p = rt.create_project("p")
    quiet = rt.create_session(p.id, "Quiet")
    t = rt.tools_for(quiet.id).task_create("x", status="in_progress")["task_id"]
    brain.scripts["Quiet"] = lambda turn: turn.tools.task_update(t, status="completed")
    rt.tools_for(FOCAL_ID).agent_send(quiet.id, "finish it")
    rt.run_until_idle()
    notices = [r for r in rt.inbox(target=FOCAL_ID)
               if r["kind"] == "session_finished_notification"]
    assert [(r["sender_chat_id"], r["payload"]["task_id"]) for r in notices] == [(quiet.id, t)]

    done = rt.create_session(p.id, "Done")  # finished, noticed, then asked: one notice
    rt.tools_for(FOCAL_ID).agent_send(done.id, "start")
    rt.run_until_idle()
    t2 = rt.tools_for(done.id).task_create("y", status="in_progress")["task_id"]
    rt.tools_for(done.id).task_update(t2, status="completed")
    rt.tools_for(FOCAL_ID).agent_send(done.id, "anything else?")
    rt.run_until_idle()
    assert [r["sender_chat_id"] for r in rt.inbox(target=FOCAL_ID)
            if r["kind"] == "session_finished_notification"] == [quiet.id, done.id]


def test_a_finish_noticed_then_asked_about_is_one_notice_when_its_tasks_closed_at_once(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """Two tasks closed at the same time (one clock reading, the injected clock's every
    step): the notice named the one whose change closed the session, and the held-back
    check after Focal's next request looked only at the other (the larger id breaks the
    tie), found no notice of it and told Focal the session finished a second time."""
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    done = rt.create_session(rt.create_project("p").id, "Done")
    rt.tools_for(FOCAL_ID).agent_send(done.id, "start")
    rt.run_until_idle()
    tools = rt.tools_for(done.id)
    first, second = sorted(tools.task_create(n, status="in_progress")["task_id"] for n in "xy")
    tools.task_update(second, status="completed")
    tools.task_update(first, status="completed")  # closes the session: noticed at once
    rt.tools_for(FOCAL_ID).agent_send(done.id, "anything else?")  # answered with no reply
    rt.run_until_idle()
    assert [r["payload"]["task_id"] for r in rt.inbox(target=FOCAL_ID)
            if r["kind"] == "session_finished_notification"] == [first]


@pytest.mark.timeout(60)
def test_a_finish_committed_after_focal_asked_mid_turn_is_noticed_when_no_reply_tells_it(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    """A session completed its last task in a turn on the user's message, and Focal asked
    it something while that turn still ran. The completion, committed with the turn,
    was held back for Focal's request; the request's turn then said nothing, and the
    held notice was dropped as "closed before Focal asked" (the task's time is when the
    turn called the tool, before Focal asked): Focal never heard the session finished."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    s = rt.create_session(rt.create_project("p").id, "Worker")
    t = rt.tools_for(s.id).task_create("x", status="in_progress")["task_id"]
    rt.tools_for(FOCAL_ID).agent_send(s.id, "start")  # followed from now on
    rt.run_until_idle()
    closed, go = threading.Event(), threading.Event()

    def script(turn: Turn) -> None:
        if any(m.content == "finish up" for m in turn.messages):
            turn.tools.task_update(t, status="completed")
            closed.set()
            assert go.wait(20)
            turn.reply("done, as you asked")  # to the user
    brain.scripts["Worker"] = script
    rt.post(s.id, "finish up")
    assert closed.wait(10)
    clock.advance(5)
    rt.tools_for(FOCAL_ID).agent_send(s.id, "how is it going?")  # answered with no reply
    go.set()
    rt.run_until_idle()
    assert [r["payload"]["task_id"] for r in rt.inbox(target=FOCAL_ID)
            if r["kind"] == "session_finished_notification"] == [t]


@pytest.mark.parametrize("blank", ["", " \n "])
def test_a_request_answered_with_blank_text_and_a_finish_tells_focal_it_finished(
        focal_rt: tuple[Runtime, FocalBrain], blank: str) -> None:
    """A blank reply is no answer: it woke Focal with an empty ``agent_message``, and the
    finish it held back (a Focal request was in flight) was never sent, so Focal never
    heard the session had finished (FO5)."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    s = rt.create_session(rt.create_project("p").id, "Terse")
    t = rt.tools_for(s.id).task_create("x", status="in_progress")["task_id"]

    def finish_saying_nothing(turn: Turn) -> None:
        turn.tools.task_update(t, status="completed")
        turn.reply(blank)
    brain.scripts["Terse"] = finish_saying_nothing
    rt.tools_for(FOCAL_ID).agent_send(s.id, "finish it")
    rt.run_until_idle()
    assert kinds_to_focal(rt) == ["session_finished_notification"]


# -- FO6 ---------------------------------------------------------------------------------------

def stall_a_session(rt: Runtime) -> str:
    s = rt.create_session(rt.create_project("p").id, "Stuck")
    rt.tools_for(s.id).task_create("long job", status="in_progress")
    return s.id


def heartbeats(rt: Runtime) -> list[dict[str, Any]]:
    return [r for r in rt.inbox(target=FOCAL_ID) if r["kind"] == "focal_heartbeat"]


def test_the_default_heartbeat_runs_on_new_findings_only(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert heartbeats(rt) == []  # nothing to say: skipped, schedule advanced
    job = rt.context.focal.schedule.jobs.get("focal-heartbeat")
    assert job.next_run_at == clock.now() + 30 * 60
    stall_a_session(rt)
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert len(heartbeats(rt)) == 1 and "stalled: Stuck" in heartbeats(rt)[0]["content"]
    signature = heartbeats(rt)[0]["payload"]["signature"]
    assert rt.session(FOCAL_ID).config["focal_heartbeat_signature"] == signature  # type: ignore[union-attr]
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert len(heartbeats(rt)) == 1  # same findings: skipped


def test_a_failed_check_in_raises_the_same_findings_again(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    stall_a_session(rt)
    brain.focal_fails = True
    clock.advance(30 * 60)
    for delay in (0, 2, 4, 8, 16):  # the check-in turn fails until the row is failed
        clock.advance(delay)
        rt.run_until_idle()
    assert "focal_heartbeat_signature" not in rt.session(FOCAL_ID).config  # type: ignore[union-attr]
    brain.focal_fails = False
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert len(heartbeats(rt)) == 2
    assert "focal_heartbeat_signature" in rt.session(FOCAL_ID).config  # type: ignore[union-attr]


def test_an_edited_checklist_always_runs(focal_rt: tuple[Runtime, Any], clock: ManualClock,
                                         tmp_path: Path) -> None:
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert [h["content"] for h in heartbeats(rt)] == ["- mine"]


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\n"])
def test_a_blank_checklist_is_no_checklist_and_runs_like_the_default(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock, tmp_path: Path,
        content: bytes) -> None:
    """A user who empties heartbeat.md has nothing on it to check: it counted as an
    edited checklist, which always runs, so every 30 minutes Focal took a turn (a model
    call, a notification) on a message with no text at all."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_bytes(content)
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert heartbeats(rt) == [] and brain.focal_turns == []  # no findings: skipped
    stall_a_session(rt)
    clock.advance(30 * 60)
    rt.run_until_idle()
    [beat] = heartbeats(rt)  # new findings: the default's check-in, with its text
    assert beat["content"].startswith(DEFAULT_FOCAL_HEARTBEAT)
    assert "stalled: Stuck" in beat["content"]


@pytest.mark.parametrize("content", [b"\xff\xfe- not UTF-8 \x80", b"- a NUL \x00 here",
                                     b"- cut mid-character \xe2\x82", b"- long" * 1_000_000,
                                     "folder", "pipe"])
@pytest.mark.timeout(60)
def test_any_heartbeat_file_leaves_the_wakeups_firing(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock, tmp_path: Path,
        content: bytes | str) -> None:
    """heartbeat.md is the user's file: one that is not UTF-8 raised inside every due
    look, so no Focal wake-up fired while it stood; a NUL went into a message
    PostgreSQL cannot store, a huge file whole into Focal's turn, a pipe blocked."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    path = tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md"
    path.unlink()
    if content == "folder":
        path.mkdir()
    elif content == "pipe":
        os.mkfifo(path)
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    brain.focal_reply = None
    stall_a_session(rt)  # the default checklist runs on findings
    rt.tools_for(FOCAL_ID).schedule_wakeup("reminder", at=clock.now() + 30 * 60,
                                           note="stand-up")
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert [n["text"] for n in rt.focal.notifications] == ["stand-up"]
    [beat] = heartbeats(rt)
    body = beat["content"]
    assert "\x00" not in body and len(body) <= 21_000 and "stalled: Stuck" in body
    if isinstance(content, bytes):
        assert content[2:8].decode() in body  # the user's checklist, not the default
    else:
        assert body.startswith(DEFAULT_FOCAL_HEARTBEAT)


SEED_ON_A_FULL_DISK = """
import resource, signal, sys
from kinbox.actors import Runtime
with Runtime(db=sys.argv[1], data_dir=sys.argv[2]) as rt:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))  # the disk fills 100 bytes on
    rt.get_or_create_focal_chat()
"""


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_a_seed_cut_off_half_way_leaves_no_half_checklist(tmp_path: Path, pg_url: str) -> None:
    """The default heartbeat.md was written in place: a write cut off half-way (a full
    disk, a crash) left the first part of it, which every heartbeat then read as the
    user's own edited checklist (one that always runs). The database is PostgreSQL, so
    the checklist is the only file the process writes past the limit."""
    import subprocess
    import sys

    data = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, "-c", SEED_ON_A_FULL_DISK, pg_url, str(data)], capture_output=True,
        text=True, timeout=50, env={**os.environ, "KINBOX_HOME": str(tmp_path / "home"),
                                    "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stderr
    assert "heartbeat.md cannot be written" in done.stderr, done.stderr
    folder = data / "projects" / "suzent-focal"
    assert sorted(p.name for p in folder.iterdir()) == []  # no half file, no temporary one


@pytest.mark.timeout(60)
def test_a_checklist_whose_reads_come_in_pieces_is_read_whole(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock, tmp_path: Path) -> None:
    """One ``os.read`` took its first piece for the whole checklist: a read may return
    fewer bytes than the file holds (a network or FUSE mount's may). /proc's files are
    regular files whose reads come a page at a time: the checklist here is the runtime
    process's memory map, longer than a check-in carries, so it must come out cut at the
    limit, not at the first page."""
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    path = tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md"
    path.unlink()
    path.symlink_to("/proc/self/maps")
    fd = os.open(path, os.O_RDONLY)
    try:  # the premise: the first read is short, the whole is longer than the limit
        assert len(os.read(fd, CHECKLIST_READ)) < CHECKLIST_LIMIT < len(path.read_bytes())
    finally:
        os.close(fd)
    clock.advance(30 * 60)
    rt.run_until_idle()
    [beat] = heartbeats(rt)  # an edited checklist: it runs
    assert f"(heartbeat.md is cut at {CHECKLIST_LIMIT:,} characters)" in beat["content"]


@pytest.mark.parametrize(("content", "warned"), [
    (b"- caf\xe9 au lait", True),  # Latin-1
    (b"- ok " * 10 + "\u00e9".encode() * CHECKLIST_READ, False),  # UTF-8, cut by the read
    (b"- all fine", False),
])
def test_a_checklist_that_is_not_utf8_is_named_in_the_log(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, content: bytes, warned: bool) -> None:
    """Bytes of heartbeat.md that are not UTF-8 reach Focal as U+FFFD, and nothing told
    the user why their checklist came out garbled (a file that cannot be read says so in
    the log); a read that cuts a long file mid-character is no encoding problem."""
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    folder = tmp_path / "data" / "projects" / "suzent-focal"
    (folder / "heartbeat.md").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="kinbox.schedule"):
        clock.advance(30 * 60)
        rt.run_until_idle()
    [beat] = heartbeats(rt)  # an edited checklist: it runs
    assert beat["content"].startswith("- ")
    notes = [r.getMessage() for r in caplog.records if "UTF-8" in r.getMessage()]
    if warned:
        assert len(notes) == 1 and str(folder) in notes[0], notes
    else:
        assert notes == []


def test_the_heartbeat_reads_its_checklist_and_sessions_off_the_writer(
        focal_rt: tuple[Runtime, Any], clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer commits every send of the process: the heartbeat's file read and its
    queries over every watched session must not run inside its transaction (#12.5)."""
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    stall_a_session(rt)
    focal = rt.context.focal
    threads: list[str] = []
    watched = focal.watched_sessions

    def recording() -> Any:
        threads.append(threading.current_thread().name)
        return watched()
    monkeypatch.setattr(focal, "watched_sessions", recording)
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert len(heartbeats(rt)) == 1  # it ran, and found the stalled session
    assert threads and "kinbox-writer" not in threads


@pytest.mark.timeout(60)
def test_the_heartbeat_and_wake_ups_run_on_once_a_clock_ahead_is_set_back(
        db_url: str, tmp_path: Path) -> None:
    """Written while the clock ran a day ahead, the heartbeat and a cron wake-up were due
    a day later than their schedules say once it was corrected, and stayed silent."""
    ahead = ManualClock(1_767_258_000.0 + 86400)  # 2026-01-02 09:00 UTC
    brain = FocalBrain()
    with Runtime(db=db_url, brain=brain, clock=ahead, data_dir=tmp_path / "data") as rt:
        brain.rt = rt
        rt.get_or_create_focal_chat()
        (tmp_path / "data" / "projects" / "suzent-focal" / "heartbeat.md").write_text("- mine")
        rt.tools_for(FOCAL_ID).schedule_wakeup("check", cron="*/10 * * * *", note="look")
    clock = ManualClock(1_767_258_000.0)  # a day earlier
    brain = FocalBrain()
    with Runtime(db=db_url, brain=brain, clock=clock, data_dir=tmp_path / "data") as rt:
        brain.rt = rt
        clock.advance(1)  # a look after the correction (the start looked too: 09:00 is a
        clock.advance(30 * 60)  # time of the cron wake-up's, which fires then as well)
        rt.run_until_idle()
        contents = [t.messages[0].content for t in brain.focal_turns]
        assert sorted(set(contents)) == ["- mine", "look"] and contents.count("- mine") == 1


# -- FO7 ---------------------------------------------------------------------------------------

def test_a_reminder_fires_at_its_time_and_always_notifies(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_reply = None
    tools = rt.tools_for(FOCAL_ID)
    job = tools.schedule_wakeup("reminder", at=clock.now() + 3600, note="stand-up at 10")
    clock.advance(3599)
    rt.run_until_idle()
    assert brain.focal_turns == []
    clock.advance(1)
    rt.run_until_idle()
    assert [t.messages[0].payload["job_id"] for t in brain.focal_turns] == [job["job_id"]]
    assert [n["text"] for n in rt.focal.notifications] == ["stand-up at 10"]
    assert rt.focal.panel()["wakeups"] == []  # a one-shot reminder is done


def test_every_reminder_a_silent_turn_takes_notifies_the_user(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    """Two reminders due at once meet in one Focal turn when its brain takes the second
    as steering. A turn that says nothing notified with the first reminder's note only:
    the second reminder, which always notifies (FO7), never reached the user."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_reply = None
    taken: list[str] = []

    def take_the_rest(turn: Turn) -> None:
        taken.extend(m.content for m in turn.steering())
    brain.focal_script = take_the_rest
    tools = rt.tools_for(FOCAL_ID)
    tools.schedule_wakeup("reminder", at=clock.now() + 60, note="stand-up")
    tools.schedule_wakeup("reminder", at=clock.now() + 60, note="pay the rent")
    clock.advance(60)
    rt.run_until_idle()
    assert len(brain.focal_turns) == 1 and len(taken) == 1  # both in one turn
    assert sorted(n["text"] for n in rt.focal.notifications) == ["pay the rent", "stand-up"]
    assert rt.focal.unread == 2


def test_a_check_notifies_only_when_the_turn_has_something_to_say(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_reply = None
    rt.tools_for(FOCAL_ID).schedule_wakeup("check", cron="*/10 * * * *", note="look around")
    clock.advance(600)
    rt.run_until_idle()
    assert len(brain.focal_turns) == 1 and list(rt.focal.notifications) == []
    brain.focal_reply = "the deploy failed"
    clock.advance(600)
    rt.run_until_idle()
    assert [n["text"] for n in rt.focal.notifications] == ["the deploy failed"]


@pytest.mark.parametrize("blank", ["", "  \n"])
def test_a_woken_turn_that_replies_only_blank_text_has_nothing_to_say(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock, blank: str) -> None:
    """A check notifies only when the turn has something to say (FO7): a reply of white
    space says nothing, and queued a blank notification; a reminder still notifies with
    its note."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_reply = None
    brain.focal_script = lambda turn: turn.reply(blank)
    tools = rt.tools_for(FOCAL_ID)
    tools.schedule_wakeup("check", at=clock.now() + 60, note="look around")
    clock.advance(60)
    rt.run_until_idle()
    assert len(brain.focal_turns) == 1 and list(rt.focal.notifications) == []
    tools.schedule_wakeup("reminder", at=clock.now() + 60, note="stand-up")
    clock.advance(60)
    rt.run_until_idle()
    assert [n["text"] for n in rt.focal.notifications] == ["stand-up"]


def test_the_users_own_chat_with_focal_queues_no_notification(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """The user reads Focal's answer in the chat; only a woken reply notifies (FO5)."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_reply = "on it"
    rt.post(FOCAL_ID, "what is running?")
    rt.post(FOCAL_ID, "and what is stuck?", sender="user")  # the user, spelled out
    rt.run_until_idle()
    assert 1 <= len(brain.focal_turns) <= 2
    assert list(rt.focal.notifications) == [] and rt.focal.unread == 0
    assert all(m.from_user for t in brain.focal_turns for m in t.all_messages)
    rt.post(FOCAL_ID, "the build broke", sender="ci-bot")
    rt.run_until_idle()
    assert [n["text"] for n in rt.focal.notifications] == ["on it"]


def test_wakeups_are_limited_validated_and_cancelled(focal_rt: tuple[Runtime, Any],
                                                     clock: ManualClock) -> None:
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    tools = rt.tools_for(FOCAL_ID)
    for bad, fragment in (({"kind": "alarm", "at": clock.now() + 5}, "reminder"),
                          ({"kind": "check"}, "exactly one of at or cron"),
                          ({"kind": "check", "cron": "every day"}, "crontab"),
                          ({"kind": "check", "at": clock.now() - 5}, "future"),
                          # stored once, these made every later start of the runtime fail
                          ({"kind": "check", "at": 1e20}, "year 10000"),
                          ({"kind": "check", "at": float("inf")}, "year 10000"),
                          ({"kind": "check", "at": float("nan")}, "year 10000"),
                          ({"kind": "check", "at": 10**400}, "year 10000"),
                          ({"kind": "check", "at": clock.now() + 5, "note": "a\ud800"},
                           "surrogate"),
                          ({"kind": "check", "at": clock.now() + 5, "note": "x" * 2001},
                           "limit")):
        with pytest.raises(ToolError, match=fragment) as info:
            tools.schedule_wakeup(**bad)
        assert info.value.code == "invalid_argument"
    assert rt.focal.panel()["wakeups"] == []  # nothing of them stored
    ids = [tools.schedule_wakeup("reminder", at=clock.now() + 60 + i)["job_id"]
           for i in range(20)]
    with pytest.raises(ToolError, match="already has 20 wake-ups"):
        tools.schedule_wakeup("reminder", at=clock.now() + 999)
    assert rt.focal.schedule.cancel(ids[0]) is True
    assert rt.focal.schedule.cancel("focal-heartbeat") is False  # not a wake-up
    assert rt.focal.schedule.cancel("nope") is False
    assert len(rt.focal.panel()["wakeups"]) == 19


def test_wakeups_survive_a_restart(db_url: str, clock: ManualClock, tmp_path: Path) -> None:
    brain = FocalBrain()
    with Runtime(db=db_url, brain=brain, clock=clock, data_dir=tmp_path) as rt:
        brain.rt = rt
        rt.get_or_create_focal_chat()
        rt.tools_for(FOCAL_ID).schedule_wakeup("reminder", at=clock.now() + 120, note="later")
    brain2 = FocalBrain()
    with Runtime(db=db_url, brain=brain2, clock=clock, data_dir=tmp_path) as rt2:
        brain2.rt = rt2
        clock.advance(120)
        rt2.run_until_idle()
        assert [t.messages[0].content for t in brain2.focal_turns] == ["later"]


def test_a_wake_up_due_while_the_runtime_was_stopped_fires_when_it_starts(
        db_url: str, clock: ManualClock, tmp_path: Path) -> None:
    """On the system clock a start fires what came due while the runtime was down; on an
    injected clock nothing fired until the clock next moved: a product's test that
    restarted past a wake-up's time waited for it, idle, for ever."""
    brain = FocalBrain()
    with Runtime(db=db_url, brain=brain, clock=clock, data_dir=tmp_path) as rt:
        brain.rt = rt
        rt.get_or_create_focal_chat()
        rt.tools_for(FOCAL_ID).schedule_wakeup("reminder", at=clock.now() + 120, note="later")
    clock.advance(120)  # while no runtime runs
    brain2 = FocalBrain()
    with Runtime(db=db_url, brain=brain2, clock=clock, data_dir=tmp_path) as rt2:
        brain2.rt = rt2
        rt2.run_until_idle()
        assert [t.messages[0].content for t in brain2.focal_turns] == ["later"]


def test_a_due_job_fires_once_when_two_stores_race(db_url: str) -> None:
    a, b = Stores(db_url), Stores(db_url)
    try:
        jobs_a, jobs_b = JobStore(a.tables, a.writer), JobStore(b.tables, b.writer)
        jobs_a.create(JobRecord("j", FOCAL_ID, "reminder", "", None, None, 10, 10, None, True, 0))
        fired: list[str] = []
        results = []
        barrier = threading.Barrier(2)

        def race(store: JobStore, name: str) -> None:
            barrier.wait()
            results.append(store.fire_due(11, next_after, lambda job, now: fired.append(name)))

        threads = [threading.Thread(target=race, args=(s, n))
                   for s, n in ((jobs_a, "a"), (jobs_b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(fired) == 1
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_a_cron_wake_up_that_can_never_fire_is_refused(make_runtime: MakeRuntime) -> None:
    """February 30th: stored, it would be an active wake-up that never fires, holding one
    of Focal's slots for good."""
    rt = make_runtime(brain=lambda turn: None)
    focal = rt.tools_for(rt.get_or_create_focal_chat().id)
    got = focal.call("schedule_wakeup", {"kind": "reminder", "cron": "0 9 30 2 *",
                                         "note": "Feb 30th stand-up"})
    assert got["error"] == "invalid_argument" and "never fire" in got["message"], got
    assert rt.focal.schedule is not None and rt.focal.schedule.wakeups() == []


@pytest.mark.timeout(60)
def test_focal_is_neither_offered_nor_able_to_run_the_tools_its_policy_denies(
        make_runtime: MakeRuntime) -> None:
    """FO2: Focal dispatches work and never does it itself; B4: the schemas never show a
    tool the caller lacks. Starting a sub-agent, family messages and task tools are not
    offered, and refused by name and by direct call alike."""
    seen: dict[str, Any] = {}

    def brain(turn: Turn) -> None:
        if turn.session_id != FOCAL_ID or turn.messages[0].sender_id is not None:
            return
        seen["denied"] = set(turn.request.denied_tools)
        seen["offered"] = {s["function"]["name"] for s in turn.tools.schemas()}
        seen["by name"] = turn.tools.call("agent", {"description": "do project work myself"})
        for call in (lambda: turn.tools.agent("do it myself"),
                     lambda: turn.tools.task_create("my own task"),
                     lambda: turn.tools.send("hello", receiver_role="child")):
            try:
                call()
            except ToolError as exc:
                seen.setdefault("refused", []).append(exc.code)

    rt = make_runtime(brain=brain)
    rt.create_project("web")
    chat = rt.get_or_create_focal_chat()
    rt.post(chat.id, "fix the login")
    rt.run_until_idle()
    assert "agent" in seen["denied"]
    assert seen["offered"] == {"agent_list", "agent_read", "agent_send", "agent_stop",
                               "schedule_wakeup"}
    assert "error" in seen["by name"], seen["by name"]
    assert seen["refused"] == ["execution_failed"] * 3
    assert not [s for s in rt.sessions() if s.kind == "subagent"]


@pytest.mark.timeout(60)
def test_a_stored_cron_wake_up_that_no_longer_parses_holds_up_no_other_schedule(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock,
        caplog: pytest.LogCaptureFixture) -> None:
    """A wake-up stored by an earlier kinbox, whose expression today's rules refuse
    ('mondo' is no weekday): computing its next time failed inside the firing
    transaction, which undid every due job's firing, on every tick, for good."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_reply = None
    schedule = rt.focal.schedule
    assert schedule is not None
    now = clock.now()
    schedule.jobs.create(JobRecord("wake-stored-long-ago", FOCAL_ID, "check", "old check",
                                   "0 9 * * mondo", None, None, now + 60, None, True, now))
    rt.tools_for(FOCAL_ID).schedule_wakeup("reminder", at=now + 120, note="stand-up")
    with caplog.at_level(logging.WARNING, logger="kinbox.schedule"):
        clock.advance(120)
        rt.run_until_idle()
    assert sorted(t.messages[0].content for t in brain.focal_turns) == ["old check",
                                                                       "stand-up"]
    assert schedule.wakeups() == []  # the reminder is done, the unreadable one ended
    assert [r.levelno for r in caplog.records
            if "wake-stored-long-ago" in r.getMessage()] == [logging.WARNING]


@pytest.mark.timeout(60)
def test_a_wake_up_cancelled_while_another_runtime_fires_it_stays_cancelled(
        pg_url: str) -> None:
    """Two runtimes on one PostgreSQL: one reads a due cron wake-up, the other cancels it,
    then the first moves it on. The move matched on next_run_at alone, which the cancel
    leaves as it is, and set the cancelled wake-up active again, firing for good."""
    a, b = Stores(pg_url), Stores(pg_url)
    try:
        jobs_a, jobs_b = JobStore(a.tables, a.writer), JobStore(b.tables, b.writer)
        jobs_a.create(JobRecord("wake-c", FOCAL_ID, "check", "", "* * * * *", None, None,
                                60, None, True, 0))
        cancelled: list[bool] = []

        def cancel_then_next(job: JobRecord, now: float) -> float | None:
            cancelled.append(jobs_b.deactivate(job.id))  # commits before the move below
            return next_after(job, now)

        jobs_a.fire_due(61, cancel_then_next, lambda job, now: None)
        assert cancelled == [True]
        job = jobs_b.get("wake-c")
        assert job is not None and not job.active
        assert jobs_a.fire_due(200, next_after, lambda job, now: None) == []
    finally:
        a.close()
        b.close()


def test_a_task_blocked_and_asked_again_in_one_turn_is_one_notice_and_the_turn_commits(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """One turn blocks its task, then changes the reason: Focal hears the turn's net
    change, one notice with the last question; the next turn's new question is a second
    notice of the task, its id chosen inside that turn's commit."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    out = rt.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=rt.create_project("p").id,
                                            title="Fix", task_title="fix it", message="go")
    rt.run_until_idle()
    t = out["task_id"]

    def asks_twice(turn: Turn) -> None:
        turn.tools.task_update(t, status="blocked", blocked_on="user", reason="which browser?")
        turn.tools.task_update(t, reason="which browser and OS?")
        turn.reply("asked")
    brain.scripts["Fix"] = asks_twice
    rt.post(out["agent_id"], "check the layout")
    rt.run_until_idle()

    def asks_again(turn: Turn) -> None:
        turn.tools.task_update(t, reason="which OS?")
        turn.tools.task_update(t, reason="which OS version?")
        turn.reply("asked")
    brain.scripts["Fix"] = asks_again
    rt.post(out["agent_id"], "and now?")
    rt.run_until_idle()
    assert [r["status"] for r in rt.inbox(target=out["agent_id"])] == ["delivered"] * 3
    notices = [r["content"] for r in rt.inbox(target=FOCAL_ID)
               if r["kind"] == "task_blocked_notification"]
    assert len(notices) == 2, notices
    assert "which browser and OS?" in notices[0] and "which OS version?" in notices[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", [{"cron": "*/5 * * * *"}, {"at": 1_700_000_300}])
def test_a_wake_up_cancelled_while_its_occurrence_waits_behind_a_busy_focal_is_not_delivered(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path,
        when: dict[str, Any], any_db_url: str) -> None:
    """A cron reminder came due while Focal was busy (a long turn on the user's message):
    its occurrence waited in the inbox. The user cancelled the wake-up meanwhile
    (``DELETE /focal/wakeups/{id}``), and the reminder still woke Focal and notified the
    user once the long turn ended. Cancelled means no wake-up from then on: the queued
    occurrence is cancelled with the job; another wake-up's stays. A one-shot wake-up
    that fired is done, and its cancel was refused (404) while its reminder was still
    to come."""
    holding, release = threading.Event(), threading.Event()
    woken: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != FOCAL_ID:
            return
        if any(m.content == "hold" for m in turn.messages):
            holding.set()
            assert release.wait(20)
        woken.extend(m.content for m in turn.messages if m.kind == "focal_wakeup")

    rt = make_runtime(db=any_db_url, brain=brain, data_dir=tmp_path / "data",
                      lease_seconds=7200.0)
    chat = rt.get_or_create_focal_chat()
    tools = rt.tools_for(FOCAL_ID)
    assert clock.now() + 300 == 1_700_000_300
    cancelled = tools.schedule_wakeup("reminder", note="stand-up", **when)
    kept = tools.schedule_wakeup("reminder", cron="*/5 * * * *", note="water")
    rt.post(chat.id, "hold")
    assert holding.wait(10)
    clock.advance(5 * 60)  # both due: queued behind the running turn
    wait_for(lambda: kinds_to_focal(rt).count("focal_wakeup") == 2, 10, "the occurrences")
    assert rt.focal.schedule.cancel(cancelled["job_id"]) is True
    release.set()
    rt.run_until_idle()
    assert woken == ["water"]
    assert [n["text"] for n in rt.focal.notifications] == ["water"]
    rows = {r["content"]: r["status"] for r in rt.inbox(target=FOCAL_ID)
            if r["kind"] == "focal_wakeup"}
    assert rows == {"stand-up": "cancelled", "water": "delivered"}
    assert [w["job_id"] for w in rt.focal.panel()["wakeups"]] == [kept["job_id"]]


@pytest.mark.timeout(60)
def test_a_heartbeat_due_while_a_check_in_still_waits_for_focal_queues_no_second_one(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path) -> None:
    """Focal busy for an hour (a long turn on the user's message): the check-in of the
    first due heartbeat waited in the inbox, its signature not yet stored, so the next
    due one found the same findings new and queued them again. Focal then got the same
    check-in twice. One check-in waits at a time; the skipped occurrence still advances
    the schedule, and once Focal took the check-in the next due one runs as before."""
    holding, release = threading.Event(), threading.Event()
    check_ins: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != FOCAL_ID:
            return
        if any(m.content == "hold" for m in turn.messages):
            holding.set()
            assert release.wait(20)
        check_ins.extend(m.message_id for m in turn.messages if m.kind == "focal_heartbeat")

    rt = make_runtime(brain=brain, data_dir=tmp_path / "data", lease_seconds=7200.0)
    chat = rt.get_or_create_focal_chat()
    stall_a_session(rt)  # the default checklist, with findings
    rt.post(chat.id, "hold")
    assert holding.wait(10)
    clock.advance(30 * 60)  # due: its check-in waits behind the running turn
    wait_for(lambda: len(heartbeats(rt)) == 1, 10, "the first check-in")
    clock.advance(30 * 60)  # due again while the first still waits
    rt.context.focal.schedule.fire_due()
    job = rt.context.focal.schedule.jobs.get("focal-heartbeat")
    assert job.next_run_at == clock.now() + 30 * 60  # the schedule advanced all the same
    release.set()
    rt.run_until_idle()
    assert len(check_ins) == 1, check_ins
    assert len(heartbeats(rt)) == 1
    s = rt.create_session(rt.project("p").id, "Also stuck")  # type: ignore[union-attr]
    rt.tools_for(s.id).task_create("another job", status="in_progress")
    clock.advance(30 * 60)  # Focal took it: the next one, on new findings, runs
    rt.run_until_idle()
    assert len(check_ins) == 2 and len(heartbeats(rt)) == 2


@pytest.mark.timeout(60)
def test_a_check_in_that_ends_as_the_next_heartbeat_looks_is_not_sent_again(
        make_runtime: MakeRuntime, clock: ManualClock, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A due heartbeat read the last check-in's signature, then asked whether a check-in
    still waited for Focal. A check-in turn (behind a long Focal turn) that committed
    between the two reads had stored its signature too late for the first and closed
    its row in time for the second: the same findings looked new, and Focal got them
    again."""
    taking, release = threading.Event(), threading.Event()
    check_ins: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != FOCAL_ID:
            return
        if any(m.kind == "focal_heartbeat" for m in turn.messages) and not check_ins:
            taking.set()
            assert release.wait(20)
        check_ins.extend(m.message_id for m in turn.messages if m.kind == "focal_heartbeat")
        turn.reply("noted")

    rt = make_runtime(brain=brain, data_dir=tmp_path / "data", lease_seconds=7200.0)
    rt.get_or_create_focal_chat()
    stall_a_session(rt)
    clock.advance(30 * 60)
    assert taking.wait(10)  # the first check-in's turn runs, its signature not yet stored
    journal = rt.context.journal
    is_open = journal.has_open_of_kind

    def ends_first(target: str, kind: str) -> bool:  # the check-in commits right now
        release.set()
        wait_for(lambda: "focal_heartbeat_signature" in rt.session(FOCAL_ID).config,  # type: ignore[union-attr]
                 10, "the check-in's commit")
        return is_open(target, kind)
    monkeypatch.setattr(journal, "has_open_of_kind", ends_first)
    clock.advance(30 * 60)
    rt.run_until_idle()
    assert len(check_ins) == 1 and len(heartbeats(rt)) == 1, check_ins


@pytest.mark.timeout(60)
def test_a_finish_held_back_for_a_request_whose_turn_fails_for_good_is_noticed(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    """The finished notice waits while Focal's request is in flight, for its answer tells
    Focal. A request whose every attempt failed (the model down) answered nothing, and
    Focal never heard that the session had finished its last task (FO5)."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    s = rt.create_session(rt.create_project("p").id, "Flaky")
    t = rt.tools_for(s.id).task_create("x", status="in_progress")["task_id"]
    working, go = threading.Event(), threading.Event()

    def finish_then_fail(turn: Turn) -> None:
        if any(m.sender_id == FOCAL_ID for m in turn.messages):
            raise RuntimeError("model unavailable")
        working.set()
        assert go.wait(20)
        turn.tools.task_update(t, status="completed")
        turn.reply("done")
    brain.scripts["Flaky"] = finish_then_fail
    rt.post(s.id, "finish it")
    assert working.wait(10)
    rt.tools_for(FOCAL_ID).agent_send(s.id, "how is it going?")  # in flight from now
    go.set()
    for _ in range(12):  # past every attempt's backoff
        rt.run_until_idle()
        clock.advance(60)
    rt.run_until_idle()
    asked = [r for r in rt.inbox(target=s.id) if r["sender_chat_id"] == FOCAL_ID]
    assert [r["status"] for r in asked] == ["failed"]
    assert "session_finished_notification" in kinds_to_focal(rt), kinds_to_focal(rt)


@pytest.mark.timeout(60)
def test_a_reminder_whose_focal_turn_fails_for_good_still_notifies(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    """A reminder always notifies (FO7), even a silent turn's. One whose every Focal
    turn failed (the model down at stand-up time) notified nobody: the user's alarm was
    lost without a word. Once its row ends failed, the reminder notifies with its note;
    a failed attempt that is retried does not (its retry notifies)."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    brain.focal_fails = True
    tools = rt.tools_for(FOCAL_ID)
    tools.schedule_wakeup("reminder", at=clock.now() + 60, note="stand-up")
    clock.advance(60)
    rt.run_until_idle()
    assert len(brain.focal_turns) == 1 and list(rt.focal.notifications) == []  # retried
    for _ in range(12):  # past every attempt's backoff
        clock.advance(60)
        rt.run_until_idle()
    [row] = [r for r in rt.inbox(target=FOCAL_ID) if r["kind"] == "focal_wakeup"]
    assert row["status"] == "failed"
    assert [(n["text"], n["source"]) for n in rt.focal.notifications] == [
        ("stand-up", "focal_wakeup")]


@pytest.mark.timeout(120)
def test_a_check_in_on_many_stalled_sessions_stays_within_a_messages_limit(
        focal_rt: tuple[Runtime, FocalBrain], clock: ManualClock) -> None:
    """Every finding went into the check-in, uncapped: with dozens of stalled sessions
    (titles up to 512 characters) Focal got a message far over the 20,000 characters any
    other message keeps to, and a model's context could overflow. The findings are cut,
    the longest waiting first, with one line saying how many more there are."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    project = rt.create_project("p").id
    stalled = []
    for i in range(60):
        s = rt.create_session(project, f"{59 - i:02d} " + "x" * 400)  # not in title order
        rt.tools_for(s.id).task_create("long job", status="in_progress")
        stalled.append(s.id)
        clock.advance(1)  # each stalls a second after the one before
    clock.advance(30 * 60)
    rt.run_until_idle()
    [beat] = heartbeats(rt)
    body = beat["content"]
    assert len(body) <= SEND_LIMIT, len(body)
    lines = body.split("Findings:\n", 1)[1].splitlines()
    kept = [line for line in lines if line.startswith("- stalled: ")]
    assert 0 < len(kept) < 60
    assert [line.split("(")[1].split(")")[0] for line in kept] == stalled[:len(kept)]
    assert lines[-1] == f"({60 - len(kept)} more findings left out)"
    assert brain.focal_turns and brain.focal_turns[0].messages[0].content == body
    # The row's payload keeps what the message kept: with every finding, hundreds of
    # stalled sessions made a payload past the 256 KiB any other payload keeps to, read
    # with the row at every claim.
    assert beat["payload"]["findings"] == [line[2:] for line in kept]
    assert beat["payload"]["left_out"] == 60 - len(kept)


@pytest.mark.timeout(60)
def test_a_finish_held_back_for_a_request_an_operator_cancels_is_noticed(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """The finished notice waits while Focal's request is in flight, for its answer tells
    Focal. An operator who cancelled that request (queued behind a long turn) left no turn
    to answer it, and Focal never heard that the session had finished its last task."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    s = rt.create_session(rt.create_project("p").id, "Long")
    t = rt.tools_for(s.id).task_create("x", status="in_progress")["task_id"]
    working, go = threading.Event(), threading.Event()

    def long_turn(turn: Turn) -> None:
        working.set()
        assert go.wait(20)
    brain.scripts["Long"] = long_turn
    rt.post(s.id, "keep at it")
    assert working.wait(10)
    rt.tools_for(FOCAL_ID).agent_send(s.id, "how is it going?")  # queued behind the turn
    rt.tools_for(s.id).task_update(t, status="completed")  # held back: a request in flight
    assert "session_finished_notification" not in kinds_to_focal(rt)
    [asked] = [r for r in rt.inbox(target=s.id) if r["sender_chat_id"] == FOCAL_ID]
    assert rt.cancel(asked["message_id"], "not needed")["status"] == "cancelled"
    go.set()
    rt.run_until_idle()
    assert kinds_to_focal(rt).count("session_finished_notification") == 1, kinds_to_focal(rt)


@pytest.mark.timeout(60)
def test_a_turn_that_blocks_and_unblocks_its_task_tells_focal_nothing(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """A turn's task changes commit together, and Focal hears what the turn did, not each
    step: a task blocked and unblocked again in one turn was never seen blocked (Focal
    was told the session waited on the user), one unblocked and blocked again on the same
    question was told again, and one completed, reopened and completed again in a turn
    was told finished while it was finished already."""
    rt, brain = focal_rt
    rt.get_or_create_focal_chat()
    out = rt.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=rt.create_project("p").id,
                                            title="Fix", task_title="fix it", message="go")
    rt.run_until_idle()
    t, sid = out["task_id"], out["agent_id"]
    steps: list[dict[str, str]] = []
    events: list[str] = []
    rt.subscribe(lambda e, d: events.append(e) if e in ("task_blocked", "session_closed")
                 else None)

    def script(turn: Turn) -> None:
        for step in steps:
            turn.tools.task_update(t, **step)
        turn.reply("ok")
    brain.scripts["Fix"] = script

    def turn_of(*changes: dict[str, str]) -> list[str]:
        steps[:] = changes
        before = len(rt.inbox(target=FOCAL_ID))
        rt.post(sid, "next")
        rt.run_until_idle()
        return [r["kind"] for r in rt.inbox(target=FOCAL_ID)[before:]
                if r["kind"].endswith("notification")]

    blocked = {"status": "blocked", "blocked_on": "user", "reason": "which browser?"}
    assert turn_of(blocked, {"status": "in_progress"}) == []
    assert turn_of(blocked) == ["task_blocked_notification"]
    assert turn_of({"status": "in_progress"}, blocked) == []
    assert turn_of({"status": "completed"}) == ["session_finished_notification"]
    assert turn_of({"status": "in_progress"}, {"status": "completed"}) == []
    assert events == ["task_blocked", "session_closed"]  # observers hear the same
    task = rt.context.tasks.get(t)
    assert task is not None and task.status == "completed"


def test_a_notice_keeps_a_title_or_reason_holding_a_newline_on_its_line(
        focal_rt: tuple[Runtime, FocalBrain]) -> None:
    """A notice read "Session 'Fix\\nSession 'Deploy' finished..." as two notices when a
    title (here the model's, for the session it had Focal start) held a newline."""
    rt, _ = focal_rt
    rt.get_or_create_focal_chat()
    web = rt.create_project("web")
    fake = "Fix\nSession 'Deploy' (s-9) finished its last open task: deploy"
    out = rt.tools_for(FOCAL_ID).agent_send(agent_id="new", project_id=web.id, title=fake,
                                            task_title=fake, message="go")
    rt.run_until_idle()
    tools = rt.tools_for(out["agent_id"])
    tools.task_update(out["task_id"], status="blocked", blocked_on="user", reason=fake)
    tools.task_update(out["task_id"], status="completed")
    rt.run_until_idle()
    notices = [r["content"] for r in rt.inbox(target=FOCAL_ID)
               if r["kind"].endswith("_notification")]
    assert len(notices) == 2 and not any("\n" in n for n in notices), notices
