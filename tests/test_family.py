"""Family messaging through a real runtime: roster, send by role, broadcast, steering, limits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, ToolError, Turn, rate_limit
from kinbox.actors.outbox import Outbox
from kinbox.persistence import Journal

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def family(make_runtime: MakeRuntime) -> dict[str, Any]:
    """root -> (bob, alice, carl); bob -> gus. Turns run concurrently."""
    inbox: dict[str, list[str]] = {}
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            inbox.setdefault(turn.session_id, []).extend(m.content for m in turn.messages)

    rt = make_runtime(brain=brain, max_active_sessions=8)
    p = rt.create_project("fam")
    f: dict[str, Any] = {"rt": rt, "inbox": inbox}
    f["root"] = rt.create_session(p.id, "root").id
    for name in ("bob", "alice", "carl"):
        f[name] = rt.create_session(p.id, name, kind="subagent", parent_id=f["root"]).id
    f["gus"] = rt.create_session(p.id, "gus", kind="subagent", parent_id=f["bob"]).id
    return f


def test_list_agents_is_the_roster_in_order(family: dict[str, Any]) -> None:
    roster = family["rt"].tools_for(family["bob"]).list_agents()["agents"]
    assert [(a["relationship"], a["name"]) for a in roster] == [
        ("parent", "root"), ("sibling", "alice"), ("sibling", "carl"), ("child", "gus")]
    assert set(roster[0]) == {"relationship", "name", "id", "status"}


def test_send_by_role_reaches_parent_sibling_and_child(family: dict[str, Any]) -> None:
    rt, tools = family["rt"], family["rt"].tools_for(family["bob"])
    tools.send("hi dad", receiver_role="parent")
    tools.send("hi alice", receiver_role="sibling", receiver_name="alice")
    tools.send("hi gus", receiver_role="child", receiver_name=family["gus"])
    rt.run_until_idle()
    inbox = family["inbox"]
    assert (inbox[family["root"]], inbox[family["alice"]], inbox[family["gus"]]) == (
        ["hi dad"], ["hi alice"], ["hi gus"])
    senders = {r["sender_chat_id"] for r in rt.inbox()}
    assert senders == {family["bob"]}
    assert {r["kind"] for r in rt.inbox()} == {"family_message"}


def test_grandchildren_and_cousins_are_out_of_reach(family: dict[str, Any]) -> None:
    rt = family["rt"]
    for caller, role, name in (("root", "child", "gus"), ("gus", "sibling", "alice")):
        with pytest.raises(ToolError) as info:
            rt.tools_for(family[caller]).send("psst", receiver_role=role, receiver_name=name)
        assert info.value.message == "Agent reach is limited to parent, siblings, and children"
    assert rt.inbox() == []


@pytest.mark.parametrize(("kwargs", "code", "fragment"), [
    ({"receiver_role": "parent", "receiver_name": "root"}, "invalid_argument", "omitted"),
    ({"receiver_role": "sibling"}, "invalid_argument", "required for a sibling"),
    ({"receiver_role": "child", "receiver_name": "nobody"}, "not_found", "no child matches"),
    ({"receiver_role": "uncle", "receiver_name": "x"}, "invalid_argument", "receiver_role"),
    ({"receiver_role": None}, "invalid_argument", "receiver_role"),
])
def test_bad_roles_and_names_get_clear_errors(family: dict[str, Any], kwargs: dict[str, Any],
                                              code: str, fragment: str) -> None:
    with pytest.raises(ToolError) as info:
        family["rt"].tools_for(family["bob"]).send("hello", **kwargs)
    assert info.value.code == code and fragment in info.value.message
    assert family["rt"].inbox() == []


@pytest.mark.parametrize(("name", "fragment"), [
    ("ali\ud800ce", "lone surrogate"), ("ali\x00ce", "NUL character")])
def test_a_receiver_name_no_row_can_hold_is_refused_as_an_argument(
        family: dict[str, Any], name: str, fragment: str) -> None:
    """A name with a lone surrogate (or a NUL, which PostgreSQL refuses) went into the
    out-of-reach lookup: the driver's DataError escaped the tool (its ``call`` too), so a
    model's typo failed its whole turn instead of getting an answer it can act on."""
    tools = family["rt"].tools_for(family["bob"])
    with pytest.raises(ToolError) as info:
        tools.send("hello", receiver_role="sibling", receiver_name=name)
    assert info.value.code == "invalid_argument"
    assert "receiver_name" in info.value.message and fragment in info.value.message
    answer = tools.call("send", {"message": "hello", "receiver_role": "sibling",
                                 "receiver_name": name})
    assert answer["error"] == "invalid_argument"
    assert family["rt"].inbox() == []



@pytest.mark.parametrize(("text", "fragment"), [
    ("x" * 20_000, "is 20,000 characters; the limit is 16,384"),
    ("   ", "must not be empty"),
    ("ab\x00c", "NUL character"),
])
def test_a_bad_broadcast_text_is_named_where_the_model_put_it(
        family: dict[str, Any], text: str, fragment: str) -> None:
    """``send("all", text)`` carries its text in ``receiver_role``; a text too long (or
    blank) was refused as "message is 20,000 characters", while the model's message was
    "all": it was told to shorten the one argument that was right."""
    tools = family["rt"].tools_for(family["bob"])
    answer = tools.call("send", {"message": "all", "receiver_role": text})
    assert answer["error"] == "invalid_argument"
    assert answer["message"].startswith("receiver_role (the text to broadcast with "
                                        "message='all') "), answer
    assert fragment in answer["message"]
    assert family["rt"].inbox() == []

def test_there_is_no_from_argument(family: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        family["rt"].tools_for(family["bob"]).send(  # type: ignore[call-arg]
            "x", receiver_role="parent", sender="root")


def test_broadcast_returns_receipts_in_roster_order_and_survives_a_failure(
        family: dict[str, Any]) -> None:
    rt = family["rt"]
    tools = rt.tools_for(family["bob"])
    for _ in range(3):  # use up bob -> alice's burst so alice's entry fails
        tools.send("ping", receiver_role="sibling", receiver_name="alice")
    result = tools.send("all", "team meeting at 3")
    receipts = result["receipts"]
    assert [r.get("target") for r in receipts] == [family[n] for n in
                                                   ("root", "alice", "carl", "gus")]
    assert "Rate limit" in receipts[1]["error"]
    assert all(r["deliveryStatus"] in ("delivered", "queued") for i, r in enumerate(receipts)
               if i != 1)
    rt.run_until_idle()
    assert family["inbox"][family["carl"]] == ["team meeting at 3"]


def test_a_running_target_sees_the_message_during_its_turn(make_runtime: MakeRuntime) -> None:
    started = threading.Event()
    steered: list[str] = []
    turns: list[str] = []

    def brain(turn: Turn) -> None:
        turns.append(turn.session_id)
        if turn.messages[0].content == "long job":
            started.set()
            wait_for(lambda: bool(steered.extend(m.content for m in turn.steering())
                                  or steered), what="the steering message")

    rt = make_runtime(brain=brain, max_active_sessions=4)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    child = rt.create_session(p.id, "kid", kind="subagent", parent_id=parent).id
    rt.post(child, "long job")
    assert started.wait(10)
    receipt = rt.tools_for(parent).send("change of plan", receiver_role="child",
                                        receiver_name="kid")
    assert receipt["deliveryStatus"] == "queued" and "queuedAt" in receipt
    rt.run_until_idle()
    assert steered == ["change of plan"]
    assert turns == [child]  # seen inside the running turn, not as a second turn


def test_an_idle_completed_child_is_woken_for_a_follow_up_turn(family: dict[str, Any]) -> None:
    rt = family["rt"]
    receipt = rt.tools_for(family["root"]).send("one more thing", receiver_role="child",
                                                receiver_name="carl")
    assert receipt["deliveryStatus"] == "delivered" and receipt["deliveredAt"].endswith("Z")
    rt.run_until_idle()
    assert family["inbox"][family["carl"]] == ["one more thing"]
    assert rt.transcript(family["carl"])[0].text == "one more thing"


def test_the_rate_limit_refills_on_the_injected_clock(family: dict[str, Any],
                                                      clock: ManualClock) -> None:
    tools = family["rt"].tools_for(family["bob"])
    for _ in range(3):
        tools.send("x", receiver_role="parent")
    with pytest.raises(ToolError, match=r"retry in 1\.0s"):
        tools.send("x", receiver_role="parent")
    clock.advance(1.0)
    tools.send("x", receiver_role="parent")
    assert len(family["rt"].inbox()) == 4


@pytest.mark.timeout(60)
def test_message_size_and_pending_limits(make_runtime: MakeRuntime,
                                         clock: ManualClock) -> None:
    """F6: at most 20 pending per target. The message its running turn is handling is
    not pending (it was refused with 19 waiting and 1 running, as '20 waiting')."""
    release = threading.Event()
    rt = make_runtime(brain=lambda turn: release.wait(20), max_active_sessions=2)
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    kid = rt.create_session(p.id, "kid", kind="subagent", parent_id=parent).id
    tools = rt.tools_for(parent)
    with pytest.raises(ToolError, match="16,385 characters; the limit is 16,384"):
        tools.send("x" * 16_385, receiver_role="child", receiver_name="kid")
    tools.send("x" * 16_384, receiver_role="child", receiver_name="kid")
    try:
        wait_for(lambda: [r["status"] for r in rt.inbox(target=kid)] == ["processing"],
                 what="the kid's turn on the first message")
        for _ in range(20):
            clock.advance(1)
            tools.send("more", receiver_role="child", receiver_name="kid")
        assert sorted(r["status"] for r in rt.inbox(target=kid)) == ["pending"] * 20 + [
            "processing"]
        clock.advance(1)
        with pytest.raises(ToolError, match=r"Pending limit: .* already has 20 messages"):
            tools.send("one too many", receiver_role="child", receiver_name="kid")
    finally:
        release.set()
    rt.run_until_idle(30)


def test_a_child_is_reachable_only_until_its_parent_session_closes(
        family: dict[str, Any]) -> None:
    tools = family["rt"].tools_for(family["root"])
    task = tools.task_create("coordinate", status="in_progress")["task_id"]
    tools.send("still here", receiver_role="child", receiver_name="bob")
    tools.task_update(task, status="completed")
    with pytest.raises(ToolError, match="only until their parent session closes"):
        tools.send("too late", receiver_role="child", receiver_name="bob")


def test_family_messages_survive_a_restart(db_url: str, clock: ManualClock) -> None:
    seen: list[str] = []
    rt = Runtime(db=db_url, clock=clock, brain=lambda turn: seen.append(
        turn.messages[0].content)).start()
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    rt.create_session(p.id, "kid", kind="subagent", parent_id=parent)
    rt.crash()  # nothing delivered yet... and the runtime is gone
    hold = threading.Event()
    rt2 = Runtime(db=db_url, clock=clock, brain=lambda turn: hold.wait(10)).start()
    rt2.tools_for(parent).send("durable hello", receiver_role="child", receiver_name="kid")
    rt2.crash()  # committed, maybe claimed, never acknowledged
    hold.set()
    with Runtime(db=db_url, clock=clock,
                 brain=lambda turn: seen.append(turn.messages[0].content)) as rt3:
        rt3.run_until_idle()
    assert seen == ["durable hello"]


def test_kinship_never_crosses_the_project_boundary(make_runtime: MakeRuntime) -> None:
    """Focal's dispatches to two projects share a parent, yet stay strangers (S2)."""
    rt = make_runtime(brain=lambda turn: None)
    rt.get_or_create_focal_chat()
    focal = rt.tools_for("focal-suzent")
    web, ops = rt.create_project("web"), rt.create_project("ops")
    a = focal.agent_send(agent_id="new", project_id=web.id, title="alpha", message="go")
    b = focal.agent_send(agent_id="new", project_id=ops.id, title="beta", message="go")
    c = focal.agent_send(agent_id="new", project_id=web.id, title="gamma", message="go")
    rt.run_until_idle()
    tools = rt.tools_for(a["agent_id"])
    assert [(e["relationship"], e["name"]) for e in tools.list_agents()["agents"]] == [
        ("sibling", "gamma")]
    for name in ("beta", b["agent_id"]):
        with pytest.raises(ToolError) as info:
            tools.send("psst", receiver_role="sibling", receiver_name=name)
        assert info.value.code == "not_found"
        assert info.value.message == f"no sibling matches receiver_name {name!r}."
    with pytest.raises(ToolError) as info:
        tools.send("hi", receiver_role="parent")
    assert info.value.code == "not_found"
    receipts = tools.send("all", "status?")["receipts"]
    assert [r["target"] for r in receipts] == [c["agent_id"]]
    rt.run_until_idle()
    family_rows = [r for r in rt.inbox() if r["kind"] == "family_message"]
    assert family_rows == rt.inbox(target=c["agent_id"])[-1:]
    assert family_rows[0]["sender_chat_id"] == a["agent_id"]


def test_a_failed_attempt_gives_its_rate_limit_tokens_back(make_runtime: MakeRuntime,
                                                           clock: ManualClock) -> None:
    """Its sends never happened, so they do not count against the rate (F6)."""
    attempts: list[int] = []
    refused: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "bob":
            return
        attempts.append(len(attempts) + 1)
        for n in range(3):
            try:
                turn.tools.send(f"try {attempts[-1]} #{n}", receiver_role="sibling",
                                receiver_name="alice")
            except ToolError as exc:
                refused.append(exc.message)
        if len(attempts) == 1:
            raise RuntimeError("the model failed after sending")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    root = rt.create_session(p.id, "root").id
    rt.create_session(p.id, "bob", kind="subagent", parent_id=root, session_id="bob")
    alice = rt.create_session(p.id, "alice", kind="subagent", parent_id=root).id
    rt.post("bob", "go")
    rt.run_until_idle()
    clock.advance(2.0)  # the retry's backoff; two tokens would have come back by now
    rt.run_until_idle()
    assert attempts == [1, 2] and refused == []
    assert [r["content"] for r in rt.inbox(target=alice)] == [f"try 2 #{n}" for n in range(3)]
    assert rt.context.queued_sends.count(alice) == 0  # dropped or durable: no longer counted


def test_an_undo_kept_after_the_attempt_ended_runs_at_once_and_once() -> None:
    box, given = Outbox("m"), []
    box.keep_undo(lambda: given.append("first"))
    box.discard()
    box.discard()
    assert given == ["first"]
    box.keep_undo(lambda: given.append("late"))  # a call still running when it ended
    assert given == ["first", "late"]


@pytest.mark.timeout(60)
def test_a_send_still_running_when_its_async_brain_is_cancelled_gives_its_token_back(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """An async brain's tool call runs on a worker: the brain can be cancelled (past its
    turn_timeout and grace) and its attempt discarded while the send goes on."""
    in_send, release = threading.Event(), threading.Event()
    pending_count = Journal.pending_count

    def slow(self: Journal, target: str) -> int:
        if target == "alice" and not release.is_set():
            in_send.set()
            release.wait(20)
        return pending_count(self, target)

    monkeypatch.setattr(Journal, "pending_count", slow)

    async def brain(turn: Turn) -> None:
        if turn.session_id == "bob":
            await turn.tools.send("hi", receiver_role="sibling", receiver_name="alice")

    rt = make_runtime(brain=brain, turn_timeout=10.0, stop_grace=5.0)
    p = rt.create_project("p")
    root = rt.create_session(p.id, "root").id
    rt.create_session(p.id, "bob", kind="subagent", parent_id=root, session_id="bob")
    rt.create_session(p.id, "alice", kind="subagent", parent_id=root, session_id="alice")
    rt.post("bob", "go")
    assert in_send.wait(10)
    clock.advance(11)  # past turn_timeout: asked to stop
    wait_for(lambda: rt.context.turns.stopped_by("bob") is not None, what="the stop")
    clock.advance(6)  # past the grace: cancelled, its attempt recorded as failed
    wait_for(lambda: rt.inbox(target="bob")[0]["attempts"] == 1, what="the failed attempt")
    release.set()
    wait_for(lambda: rt.context.buckets.tokens(("bob", "alice")) == 3.0, timeout=10,
             what="the late send's token to come back")
    assert rt.inbox(target="alice") == []


def test_a_hidden_session_gets_the_answer_a_missing_one_gets(family: dict[str, Any]) -> None:
    """"Out of reach" for a hidden session's name would say that it exists (S3)."""
    rt = family["rt"]
    project = rt.session(family["root"]).project_id
    dream = rt.create_session(project, "night dream", kind="dream").id
    tools = rt.tools_for(family["bob"])
    answers = []
    for name in (dream, "night dream", "chat-doesnotexist"):
        with pytest.raises(ToolError) as info:
            tools.send("psst", receiver_role="sibling", receiver_name=name)
        answers.append((info.value.code, info.value.message.replace(name, "<name>")))
    assert answers == [("not_found", "no sibling matches receiver_name '<name>'.")] * 3


@pytest.mark.timeout(60)
def test_a_pair_has_one_bucket_however_many_runtimes_share_the_database(
        any_db_url: str, clock: ManualClock) -> None:
    """A sender whose turns land in another process gets no fresh burst there (F6 with
    several processes on one database: a worker beside ``kinbox serve``, or several
    workers on PostgreSQL)."""
    with Runtime(db=any_db_url, brain=lambda turn: None, clock=clock) as here, \
            Runtime(db=any_db_url, clock=clock) as there:
        p = here.create_project("p")
        root = here.create_session(p.id, "root").id
        bob = here.create_session(p.id, "bob", kind="subagent", parent_id=root).id
        for _ in range(3):
            here.tools_for(bob).send("x", receiver_role="parent")
        with pytest.raises(ToolError, match=r"Rate limit: .* retry in 1\.0s"):
            there.tools_for(bob).send("one too many", receiver_role="parent")
        clock.advance(1.0)
        there.tools_for(bob).send("one more", receiver_role="parent")
        assert here.context.buckets.tokens((bob, root)) == 0.0
        assert [r["content"] for r in here.inbox(target=root)] == ["x"] * 3 + ["one more"]


def test_a_bucket_read_by_a_clock_a_little_behind_counts_no_interval_twice() -> None:
    """Processes sharing a bucket tell the time a few milliseconds apart: a take stamped
    before the bucket's time must not move the bucket back, or the next take refills
    the same interval again."""
    bucket = rate_limit.Bucket(1.0, 10.0)
    behind, wait = rate_limit.take(bucket, 9.5)  # the other process's clock, half a second
    assert (behind, wait) == (rate_limit.Bucket(0.0, 10.0), 0.0)
    assert rate_limit.take(behind, 10.5) == (rate_limit.Bucket(0.5, 10.5), 0.5)  # not 1


def test_a_bucket_stamped_far_ahead_does_not_freeze() -> None:
    """One take by a process whose clock reads ten minutes ahead stamped the shared
    bucket in the future: every other process then refilled nothing for ten minutes."""
    skewed, _ = rate_limit.take(rate_limit.Bucket(3.0, 0.0), 600.0)
    bucket = skewed
    for now in (1.0, 2.0, 3.0):  # the other processes' clocks, a second apart
        bucket, wait = rate_limit.take(bucket, now)
        assert wait == 0.0, (now, bucket)


@pytest.mark.timeout(60)
def test_family_sends_queued_in_one_turn_respect_the_pending_limit(
        make_runtime: MakeRuntime) -> None:
    release = threading.Event()
    receipts: list[Any] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "kid":
            release.wait(20)
        elif turn.messages[0].content == "go":
            for n in range(3):
                try:
                    receipts.append(turn.tools.send(f"note {n}", receiver_role="child",
                                                    receiver_name="kid"))
                except ToolError as exc:
                    receipts.append(exc.message)

    rt = make_runtime(brain=brain, max_active_sessions=2)
    p = rt.create_project("p")
    rt.create_session(p.id, "parent", session_id="parent")
    rt.create_session(p.id, "kid", kind="subagent", parent_id="parent", session_id="kid")
    for n in range(19):
        rt.post("kid", f"backlog {n}")
    rt.post("parent", "go")
    wait_for(lambda: len(receipts) == 3, timeout=20, what="the parent's three sends")
    wait_for(lambda: rt.inbox(target="parent")[0]["status"] == "delivered", timeout=20,
             what="the parent's commit")
    waiting = [r for r in rt.inbox(target="kid") if r["status"] == "pending"]
    release.set()
    # F6: at most 20 pending messages per target, the turn's own queued sends included.
    assert len(waiting) <= 20, (len(waiting), receipts)
    rt.run_until_idle(30)


@pytest.mark.timeout(60)
def test_a_parent_that_closes_in_its_turn_cannot_then_reach_its_child_in_that_turn(
        make_runtime: MakeRuntime) -> None:
    got: list[Any] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "parent" and turn.messages[0].content == "wrap up":
            [task] = turn.tools.task_list()["tasks"]
            turn.tools.task_update(task["task_id"], status="completed")
            try:
                got.append(turn.tools.send("one more thing", receiver_role="child",
                                           receiver_name="kid"))
            except ToolError as exc:
                got.append(exc)

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    rt.create_session(p.id, "parent", session_id="parent")
    rt.create_session(p.id, "kid", kind="subagent", parent_id="parent", session_id="kid")
    rt.tools_for("parent").task_create("coordinate", status="in_progress")
    rt.post("parent", "wrap up")
    rt.run_until_idle()
    # Outside a turn the same two calls refuse the send; in a turn the close it queued
    # counts as well.
    assert isinstance(got[0], ToolError), got
    assert [r for r in rt.inbox(target="kid")] == []


@pytest.mark.timeout(60)
def test_a_child_started_in_a_turn_is_on_that_turns_family_roster(
        make_runtime: MakeRuntime) -> None:
    got: list[Any] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == "lead" and turn.messages[0].content == "go":
            child = turn.tools.agent("collect the logs", title="collector")
            got.append([a["id"] for a in turn.tools.list_agents()["agents"]])
            try:
                got.append(turn.tools.send("also the metrics", receiver_role="child",
                                           receiver_name="collector"))
            except ToolError as exc:
                got.append(exc)
            got.append(child["agent_id"])

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    rt.create_session(p.id, "lead", session_id="lead")
    rt.post("lead", "go")
    rt.run_until_idle()
    roster, sent, child_id = got
    # Later calls in the same turn see its writes: a child it started is on its roster.
    assert roster == [child_id], got
    assert not isinstance(sent, ToolError), sent


@pytest.mark.timeout(60)
def test_a_send_answered_after_its_wait_keeps_its_rate_limit_token(
        family: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A send outside a turn whose batch ran past the caller's wait (WriteTimeout, not
    withdrawn) committed after all, yet gave its token back: a burst of three let a
    fourth message through (F6). It now waits for its write's outcome (it landed: the
    receipt), and keeps its token."""
    from kinbox.actors import steps

    from .helpers import SHORT, heard_from, hold_next_batch

    rt = family["rt"]
    tools = rt.tools_for(family["bob"])
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", SHORT)
    heard = heard_from("slow-sender", monkeypatch)
    landed = threading.Event()
    writer, buckets = rt.context.journal.writer, rt.context.buckets
    real_take = buckets.take

    def take(*args: Any) -> float:
        wait = real_take(*args)  # the token taken, the next write (the send) ...
        hold_next_batch(writer, landed)  # ... waits past SHORT
        return wait

    monkeypatch.setattr(buckets, "take", take)
    answer: list[Any] = []
    sender = threading.Thread(name="slow-sender", target=lambda: answer.append(
        tools.send("slow", receiver_role="parent")))
    sender.start()
    assert heard.wait(10)  # its wait ran out, and it waits on
    monkeypatch.setattr(buckets, "take", real_take)
    landed.set()  # ... then commits
    sender.join(10)
    assert answer[0]["target"] == family["root"]
    assert any(r["content"] == "slow" for r in rt.inbox())
    for _ in range(2):
        tools.send("x", receiver_role="parent")
    with pytest.raises(ToolError, match="Rate limit"):
        tools.send("one too many", receiver_role="parent")


@pytest.mark.parametrize(("role", "name", "is_"), [
    ("child", "alice", "sibling"), ("sibling", "gus", "child"), ("sibling", "root", "parent"),
    ("child", "root", "parent")])
def test_a_relative_named_with_the_wrong_role_is_not_called_out_of_reach(
        family: dict[str, Any], role: str, name: str, is_: str) -> None:
    """Bob may message alice (his sibling): asked for her as his child, he was told that
    reach is limited to parent, siblings and children, as if she were a cousin. The
    answer says no such relative has that role, and what she is to him."""
    tools = family["rt"].tools_for(family["bob"])
    with pytest.raises(ToolError) as info:
        tools.send("psst", receiver_role=role, receiver_name=name)
    assert (info.value.code, info.value.message) == (
        "not_found", f"no {role} matches receiver_name {name!r} ({name!r} is your {is_})."
    )
    assert family["rt"].inbox() == []


@pytest.mark.timeout(60)
def test_two_turns_sending_to_one_target_at_once_respect_the_pending_limit(
        make_runtime: MakeRuntime) -> None:
    """Each turn counted the target's pending rows and its own queued sends, not those
    another running turn had queued: two siblings, each in a turn, both sent to a parent
    with 19 waiting, and it had 21 (F6: at most 20)."""
    release = threading.Event()
    both_sent = threading.Barrier(2, timeout=20)
    answers: dict[str, Any] = {}

    def brain(turn: Turn) -> None:
        if turn.session_id == "root":
            release.wait(20)
        elif turn.messages[0].content == "go":
            try:
                answers[turn.session_id] = turn.tools.send("done", receiver_role="parent")
            except ToolError as exc:
                answers[turn.session_id] = exc.message
            both_sent.wait()  # neither turn commits before both have sent

    rt = make_runtime(brain=brain, max_active_sessions=4)
    p = rt.create_project("p")
    rt.create_session(p.id, "root", session_id="root")
    for name in ("bob", "alice"):
        rt.create_session(p.id, name, kind="subagent", parent_id="root", session_id=name)
    try:
        rt.post("root", "busy")
        wait_for(lambda: rt.context.turns.is_running("root"), what="the root's turn")
        for n in range(19):
            rt.post("root", f"backlog {n}")
        rt.post("bob", "go")
        rt.post("alice", "go")
        wait_for(lambda: all(rt.inbox(target=s)[0]["status"] == "delivered"
                             for s in ("bob", "alice")), timeout=20, what="both commits")
        waiting = [r for r in rt.inbox(target="root") if r["status"] == "pending"]
        assert len(waiting) <= 20, (len(waiting), answers)
        assert sorted(isinstance(a, str) for a in answers.values()) == [False, True], answers
    finally:
        release.set()
    rt.run_until_idle(30)
    assert rt.context.queued_sends.count("root") == 0  # each counted send let go once


def test_the_rate_limit_never_says_to_retry_sooner_than_a_token_is_back(
        family: dict[str, Any], clock: ManualClock) -> None:
    """A token 0.04 s away was "retry in 0.0s": a caller retrying at once, as told, was
    refused again. The wait is rounded up, so a retry after it is allowed."""
    tools = family["rt"].tools_for(family["bob"])
    for _ in range(3):
        tools.send("x", receiver_role="parent")
    clock.advance(0.96)
    with pytest.raises(ToolError) as info:
        tools.send("x", receiver_role="parent")
    assert info.value.message.endswith("retry in 0.1s."), info.value.message
    clock.advance(0.1)
    tools.send("x", receiver_role="parent")


def test_a_rate_limited_send_says_when_to_retry_in_an_attribute(
        family: dict[str, Any], clock: ManualClock) -> None:
    """A caller decides on attributes, never on message text: the wait was only in the
    message ("retry in 0.5s"), so a program retrying a refused send had to parse it. The
    refusal carries it as ``retry_after`` (the time the message tells), and a retry after
    that long is let through; other refusals carry None."""
    tools = family["rt"].tools_for(family["bob"])
    for _ in range(3):
        tools.send("x", receiver_role="parent")
    clock.advance(0.5)  # exact in binary at the clock's epoch time: half a token back
    with pytest.raises(ToolError) as info:
        tools.send("x", receiver_role="parent")
    assert info.value.retry_after == 0.5
    assert info.value.message.endswith("retry in 0.5s.")
    clock.advance(info.value.retry_after)
    tools.send("x", receiver_role="parent")
    with pytest.raises(ToolError) as other:
        tools.send("x", receiver_role="sibling", receiver_name="nobody")
    assert other.value.retry_after is None


@pytest.mark.timeout(60)
def test_a_send_of_a_turn_whose_commit_broke_outside_the_journal_is_no_longer_counted(
        make_runtime: MakeRuntime) -> None:
    """A bug outside the brain (an outbox hook that raises) ends the delivery without a
    commit: the row comes back by its lease, and nothing of the turn is written. The
    family send the turn made stayed counted against its target for the life of the
    process (each retry one more), until the target refused every send as full."""
    hook_raised = threading.Event()

    def brain(turn: Turn) -> None:
        if turn.session_id == "bob":
            turn.tools.send("done", receiver_role="parent")

    def broken_hook(ctx: Any, turn: Turn, outcome: Any) -> None:
        if turn.session_id == "bob":
            hook_raised.set()
            raise RuntimeError("a bug in an outbox hook")

    rt = make_runtime(brain=brain)
    p = rt.create_project("p")
    rt.create_session(p.id, "root", session_id="root")
    rt.create_session(p.id, "bob", kind="subagent", parent_id="root", session_id="bob")
    rt.context.outbox_hooks.append(broken_hook)
    rt.post("bob", "go")
    assert hook_raised.wait(20)
    wait_for(lambda: rt.context.queued_sends.count("root") == 0, timeout=30,
             what="the dropped send let go")
    assert [r for r in rt.inbox(target="root")] == []


@pytest.mark.timeout(60)
def test_a_send_of_a_direct_turn_whose_commit_broke_outside_the_journal_is_no_longer_counted(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """The same for a direct turn (a cron run): a bug outside the brain (an outbox hook
    that raises) ended the turn without its commit, and the family send it made stayed
    counted against its target for the life of the process."""
    from kinbox.actors.cron_rules import session_id_for

    sending = threading.Event()
    hook_raised = threading.Event()

    def brain(turn: Turn) -> str:
        if sending.is_set():
            turn.tools.send("done", receiver_role="child", receiver_name="kid")
        return "ok"

    def broken_hook(ctx: Any, turn: Turn, outcome: Any) -> None:
        if sending.is_set():
            hook_raised.set()
            raise RuntimeError("a bug in an outbox hook")

    rt = make_runtime(brain=brain)
    job = rt.cron.add("digest", "0 0 1 1 *", "write the digest")["job_id"]
    rt.cron.trigger(job)  # makes the job's session
    assert rt.cron.wait_idle(20)
    sid = session_id_for(job)
    rt.create_session(rt.session(sid).project_id, "kid", kind="subagent", parent_id=sid,
                      session_id="kid")
    rt.context.outbox_hooks.append(broken_hook)
    sending.set()
    clock.advance(60)  # a run of its own (one run per job and time)
    rt.cron.trigger(job)
    assert hook_raised.wait(20)
    assert rt.cron.wait_idle(20)
    assert rt.context.queued_sends.count("kid") == 0
    assert rt.inbox(target="kid") == []


@pytest.mark.timeout(60)
def test_a_child_named_after_its_description_can_be_messaged_by_the_name_it_is_listed_under(
        make_runtime: MakeRuntime) -> None:
    """A child started without a title is named after the first 60 characters of its
    description. When the 60th was a space, the name ended with one: ``list_agents``
    showed it so, and ``send`` (which strips the name it is given, as every argument)
    found no child of that name: the parent could reach its child only by id."""
    rt = make_runtime(brain=lambda turn: None)
    p = rt.create_project("p")
    lead = rt.create_session(p.id, "lead").id
    description = "Collect the logs of last night's deploy, then find out what it was that failed"
    assert description[59] == " "
    tools = rt.tools_for(lead)
    child = tools.agent(description)["agent_id"]
    [entry] = tools.list_agents()["agents"]
    assert entry["id"] == child
    receipt = tools.send("also the metrics", receiver_role="child", receiver_name=entry["name"])
    assert receipt["target"] == child


@pytest.mark.timeout(60)
def test_a_rate_limit_token_whose_write_outruns_its_wait_is_waited_for(
        family: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking a token is a write of its own (the pair's bucket row). When its batch ran
    past the wait, the send raised WriteTimeout though the take could still commit, and
    then did: the send failed, its token was gone all the same (F6: refunded when a send
    fails), and the sender met the rate limit one message early. The take now waits for
    its outcome, as the send's own write does, and the send goes on."""
    from kinbox.persistence import writer as writer_module

    from .helpers import SHORT, heard_from, hold_next_batch

    rt = family["rt"]
    tools = rt.tools_for(family["bob"])
    monkeypatch.setattr(writer_module, "WRITE_TIMEOUT", SHORT)
    monkeypatch.setattr(writer_module.GroupCommitWriter.call, "__defaults__", (SHORT,))
    heard = heard_from("slow-taker", monkeypatch)
    landed = threading.Event()
    answer: list[Any] = []

    def send() -> None:
        try:
            answer.append(tools.send("slow", receiver_role="parent"))
        except Exception as exc:
            answer.append(exc)

    sender = threading.Thread(name="slow-taker", target=send)
    hold_next_batch(rt.context.journal.writer, landed)  # the take's batch waits ...
    sender.start()
    wait_for(lambda: heard.is_set() or bool(answer), 10, "the take to outrun its wait")
    landed.set()  # ... then commits
    sender.join(10)
    monkeypatch.undo()  # the runtime's other writes wait as long as ever again
    assert isinstance(answer[0], dict) and answer[0]["target"] == family["root"], answer
    for _ in range(2):
        tools.send("x", receiver_role="parent")
    with pytest.raises(ToolError, match="Rate limit"):
        tools.send("one too many", receiver_role="parent")
