"""Family sends and broadcasts whose write is slow or fails: what the caller is told, what
the pending limit counts, and what a retry sends (F3, F6, F7)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, ToolError, Turn
from kinbox.persistence import DatabaseFailed

from .helpers import SHORT, heard_from, wait_for

pytestmark = pytest.mark.timeout(60)

MakeRuntime = Callable[..., Runtime]


def _refuse_rows(rt: Runtime, table: str, column: str, value: str) -> Callable[[], None]:
    """Make the database itself refuse a new ``table`` row whose ``column`` is ``value`` (a
    trigger, made on the runtime's own connection); return what drops it again."""
    db = rt.context.journal.writer._db  # the runtime's own connection
    if "postgres" in type(db).__name__.lower():
        make = [
            "CREATE OR REPLACE FUNCTION refuse_row() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql",
            f"CREATE TRIGGER refuse BEFORE INSERT ON {table} FOR EACH ROW "
            f"WHEN (NEW.{column} = '{value}') EXECUTE FUNCTION refuse_row()"]
        drop = [f"DROP TRIGGER refuse ON {table}", "DROP FUNCTION refuse_row()"]
    else:
        make = [f"CREATE TRIGGER refuse BEFORE INSERT ON {table} "
                f"WHEN NEW.{column} = '{value}' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"]
        drop = ["DROP TRIGGER refuse"]

    def run(statements: list[str]) -> None:
        rt.context.journal.writer.call(lambda: [db.execute_sql(s) for s in statements])
    run(make)
    return lambda: run(drop)


def test_a_send_whose_write_outlasts_its_wait_keeps_its_pending_place_until_it_lands(
        pg_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A send outside a turn whose batch ran past the caller's wait (the row may yet land)
    let its place under the pending limit go at once: a second send to a target with 19
    then went through too, and the target had 21 waiting (F6: at most 20). The send now
    waits for its row's outcome, holding its place meanwhile."""
    import psycopg2

    from kinbox.actors import context, steps

    monkeypatch.setattr(context, "WRITE_TIMEOUT", SHORT)
    monkeypatch.setattr(steps, "WRITE_TIMEOUT", SHORT)
    heard = heard_from("slow-sender", monkeypatch)
    release = threading.Event()
    holder = psycopg2.connect(pg_url)  # holds the lock the "slow" row's insert waits for
    holder.autocommit = True
    rt = Runtime(db=pg_url, brain=lambda turn: release.wait(20), clock=clock,
                 max_active_sessions=2).start()
    try:
        _slow_send_holds_its_place(rt, holder, clock, heard, release)
    finally:
        holder.close()
        release.set()
        rt.stop()


def _slow_send_holds_its_place(rt: Runtime, holder: Any, clock: ManualClock,
                               heard: threading.Event, release: threading.Event) -> None:
    p = rt.create_project("p")
    parent = rt.create_session(p.id, "parent").id
    kid = rt.create_session(p.id, "kid", kind="subagent", parent_id=parent).id
    tools = rt.tools_for(parent)

    def send(text: str) -> Any:
        clock.advance(1)  # a token is back: only the pending limit may refuse
        try:
            return tools.send(text, receiver_role="child", receiver_name="kid")
        except Exception as exc:  # the answer is what is checked
            return exc

    db = rt.context.journal.writer._db  # the runtime's own connection
    rt.context.journal.writer.call(lambda: [db.execute_sql(s) for s in (
        "CREATE OR REPLACE FUNCTION slow_row() RETURNS trigger AS $$ BEGIN "
        "PERFORM pg_advisory_xact_lock(4242); RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER slow BEFORE INSERT ON agent_inbox_messages FOR EACH ROW "
        "WHEN (NEW.content = 'slow') EXECUTE FUNCTION slow_row()")])
    try:
        send("first")
        wait_for(lambda: [r["status"] for r in rt.inbox(target=kid)] == ["processing"],
                 what="the kid's turn on the first message")
        for _ in range(19):
            send("more")
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_lock(4242)")
        slow: list[Any] = []
        sender = threading.Thread(target=lambda: slow.append(send("slow")), name="slow-sender")
        sender.start()
        wait_for(lambda: heard.is_set() or not sender.is_alive(),
                 what="the slow send's wait to run out")
        late = send("one too many")
        assert isinstance(late, ToolError), late
        assert "Pending limit" in late.message
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(4242)")
        sender.join(20)
        assert isinstance(slow[0], dict), slow  # the outcome, not "maybe"
        assert slow[0]["target"] == kid
        pending = [r["content"] for r in rt.inbox(target=kid) if r["status"] == "pending"]
        assert len(pending) == 20 and pending[-1] == "slow"
    finally:
        release.set()
    rt.run_until_idle(30)
    assert rt.context.queued_sends.count(kid) == 0


def test_a_broadcast_that_meets_a_database_error_sends_to_no_one_and_a_retry_sends_once(
        any_db_url: str, clock: ManualClock) -> None:
    """A broadcast outside a turn wrote to its targets one by one and stopped at the first
    database error: the parent had the message, the others not, and the caller got only
    the error, with no way to know who had it; its retry sent the parent a second copy.
    The broadcast is one transaction: all of its sends land, or none."""
    got: list[tuple[str, str]] = []

    def brain(turn: Turn) -> None:
        got.extend((turn.session_id, m.content) for m in turn.messages)

    with Runtime(db=any_db_url, brain=brain, clock=clock) as rt:
        p = rt.create_project("fam")
        rt.create_session(p.id, "root", session_id="root")
        for name in ("alice", "bob", "carl"):
            rt.create_session(p.id, name, kind="subagent", parent_id="root", session_id=name)
        tools = rt.tools_for("bob")
        # The database refuses the row of carl, the third of bob's roster.
        allow = _refuse_rows(rt, "agent_inbox_messages", "target_chat_id", "carl")
        with pytest.raises(DatabaseFailed):
            tools.send("all", "we ship on Friday")
        assert rt.inbox() == []
        for target in ("root", "alice", "carl"):  # nothing of it is counted or taken
            assert rt.context.queued_sends.count(target) == 0
            wait_for(lambda t=target: rt.context.buckets.tokens(("bob", t)) in (None, 3.0),
                     what="the broadcast's tokens given back")
        allow()
        receipts = tools.send("all", "we ship on Friday")["receipts"]
        assert [r["target"] for r in receipts] == ["root", "alice", "carl"]
        rt.run_until_idle(30)
        assert sorted(got) == [("alice", "we ship on Friday"), ("carl", "we ship on Friday"),
                               ("root", "we ship on Friday")]


def test_a_broadcast_in_a_turn_that_meets_a_database_error_queues_nothing(
        make_runtime: MakeRuntime) -> None:
    """In a turn, a broadcast that failed part-way (the database refused the third
    target's rate bucket) had queued its first targets' sends in the turn's outbox: a
    brain that took the error as a failed tool call and went on committed them, and its
    retry of the broadcast sent them twice. Nothing of a failed broadcast is queued."""
    answers: list[Any] = []

    def brain(turn: Turn) -> None:
        if turn.session_id != "bob":
            return
        try:
            answers.append(turn.tools.send("all", "we ship on Friday"))
        except Exception as exc:  # as a model loop takes a failed call
            answers.append(exc)

    rt = make_runtime(brain=brain)
    p = rt.create_project("fam")
    rt.create_session(p.id, "root", session_id="root")
    for name in ("alice", "bob", "carl"):
        rt.create_session(p.id, name, kind="subagent", parent_id="root", session_id=name)
    # carl's bucket, taken on the way (bob's first send to him), is refused.
    _refuse_rows(rt, "rate_buckets", "target_id", "carl")
    rt.post("bob", "tell everyone")
    rt.run_until_idle(30)
    assert isinstance(answers[0], DatabaseFailed), answers
    assert [r for r in rt.inbox() if r["kind"] == "family_message"] == []
    for target in ("root", "alice"):
        wait_for(lambda t=target: rt.context.buckets.tokens(("bob", t)) in (None, 3.0),
                 what="the broadcast's tokens given back")
        assert rt.context.queued_sends.count(target) == 0


def test_a_target_full_of_another_processs_sends_is_full_here_too(
        any_db_url: str, clock: ManualClock) -> None:
    """The pending limit across processes, as the README states it: the target's committed
    rows count in every process sharing the database, whichever process wrote them."""
    release = threading.Event()
    with Runtime(db=any_db_url, brain=lambda turn: release.wait(20), clock=clock) as here, \
            Runtime(db=any_db_url, clock=clock) as there:
        try:
            p = here.create_project("p")
            root = here.create_session(p.id, "root").id
            kid = here.create_session(p.id, "kid", kind="subagent", parent_id=root).id
            here.tools_for(root).send("first", receiver_role="child", receiver_name="kid")
            wait_for(lambda: [r["status"] for r in here.inbox(target=kid)] == ["processing"],
                     what="the kid's turn on the first message")
            for _ in range(20):
                clock.advance(1)
                there.tools_for(root).send("more", receiver_role="child", receiver_name="kid")
            clock.advance(1)
            with pytest.raises(ToolError, match=r"Pending limit: .* already has 20 messages"):
                here.tools_for(root).send("one too many", receiver_role="child",
                                          receiver_name="kid")
        finally:
            release.set()


def test_a_broadcast_every_target_refuses_writes_nothing(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every target refused by the rules (here each pair's rate limit, the clock
    standing still), there is nothing to write: the call answers with the refusals and
    never waits on the writer (which, closing, made it an error instead)."""
    with Runtime(db=db_url, brain=lambda turn: None, clock=clock) as rt:
        p = rt.create_project("fam")
        rt.create_session(p.id, "root", session_id="root")
        for name in ("alice", "bob"):
            rt.create_session(p.id, name, kind="subagent", parent_id="root", session_id=name)
        tools = rt.tools_for("bob")
        refused: list[dict[str, Any]] = []
        for _ in range(10):  # until the buckets are empty
            refused = tools.send("all", "again")["receipts"]
            if all("error" in r for r in refused):
                break
        assert refused and all("error" in r for r in refused)
        writer = rt.context.journal.writer
        submitted: list[object] = []
        real = writer.submit

        def counting(op: Any, *args: Any, **kwargs: Any) -> Any:
            submitted.append(op)
            return real(op, *args, **kwargs)
        monkeypatch.setattr(writer, "submit", counting)
        again = tools.send("all", "again")["receipts"]
        assert [r["target"] for r in again] == [r["target"] for r in refused]
        assert all("error" in r for r in again)
        # (the rate buckets' own writes go on: the pair's bucket is shared across processes)
        assert [op for op in submitted if "commit_together" in getattr(op, "__qualname__", "")
                ] == []
