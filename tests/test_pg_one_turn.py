"""One committed turn per message and one turn at a time per session, across processes
sharing a PostgreSQL (#16), where a read and the write it licenses are not one statement.

Each test drives the interleaving that broke it: a commit whose lease check was a plain
read, a send that commits after a later-numbered one, a cron run beside an inbox turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg2
import pytest

from kinbox.actors import Runtime, Turn
from kinbox.actors.cron_rules import session_id_for
from kinbox.persistence import DatabaseFailed, NewMessage, open_database, pg_database

from .conftest import Stores
from .helpers import lock_waits, wait_for

pytestmark = pytest.mark.timeout(120)


def _row_is_locked(pg_url: str, message_id: str) -> bool:
    """Does another transaction hold ``message_id``'s row lock (as a takeover would meet)?"""
    probe = psycopg2.connect(pg_url)
    try:
        with probe.cursor() as cur:
            cur.execute("SELECT 1 FROM agent_inbox_messages WHERE message_id = %s "
                        "FOR UPDATE NOWAIT", (message_id,))
        return False
    except psycopg2.errors.LockNotAvailable:
        return True
    finally:
        probe.close()


def test_a_commit_holds_its_rows_from_its_lease_check_to_its_end(
        pg_url: str, pg_runtimes: Callable[..., Runtime]) -> None:
    """A turn that sent something commits row by row: its lease check, then its writes.
    The check was a plain read, so another worker could take the row over between the two
    (A's writer stalled past its lease) and both turns committed, the send twice."""
    sent: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.session_id == sid:
            turn.tools.agent_send(other, "effect")
        else:
            sent.append(turn.messages[0].content)

    a = pg_runtimes(brain=brain, lease_seconds=1.0)
    sid = a.create_session("default", "T").id
    other = a.create_session("default", "U").id
    hot = a.context.journal.hot
    real_fence = hot.fence_rows
    checked, go = threading.Event(), threading.Event()

    def check_then_stall(ids: Any) -> Any:
        rows = real_fence(ids)
        if "m1" in ids and not checked.is_set():
            checked.set()  # the lease check passed; the writer stalls before the writes
            assert go.wait(60)
        return rows

    hot.fence_rows = check_then_stall  # type: ignore[method-assign]
    try:
        a.post(sid, "hello", message_id="m1")
        assert checked.wait(30)
        assert _row_is_locked(pg_url, "m1"), "a takeover could commit a second turn now"
        b = pg_runtimes(brain=brain)  # a second worker, there to take the row over if it could
        go.set()
        a.run_until_idle(30)
        b.run_until_idle(30)
        wait_for(lambda: sent == ["effect"], 30, what="the one effect")
        assert b.marker_counts().get("m1") == 1
    finally:
        go.set()


def _late_commit_after_a_claim(first: Stores, second: Stores) -> None:
    """m-early to T is numbered first (in ``first``'s transaction) and commits second,
    after m-late (``second``'s) was claimed by A."""
    written, commit = threading.Event(), threading.Event()

    def slow_send() -> None:
        first.journal.enqueue_now(NewMessage("m-early", "T", "numbered first"), time.time())
        written.set()
        assert commit.wait(60)

    sending = threading.Thread(target=lambda: first.writer.call(slow_send, timeout=90))
    sending.start()
    try:
        assert written.wait(30)
        second.journal.enqueue(NewMessage("m-late", "T", "numbered second"), time.time())
        assert [r.message_id for r in second.journal.claim("A", time.time()).rows] == [
            "m-late"]
    finally:
        commit.set()
        sending.join(30)


def test_a_send_that_commits_after_a_later_numbered_one_waits_for_its_turn(
        pg_url: str) -> None:
    """PostgreSQL numbers a row when it is written, not when it commits. A send numbered
    first that commits second (two processes sending to one session; a batch waiting on
    its disk) became the session's head while the other's turn ran, and another worker
    claimed it: two turns of one session at once."""
    first, second = Stores(pg_url), Stores(pg_url)  # two sending processes' journals
    try:
        _late_commit_after_a_claim(first, second)
        assert first.journal.get("m-early")["status"] == "pending"
        assert second.journal.claim("B", time.time()).rows == [], \
            "a second turn of T would start while A's runs"
        second.journal.ack("A", ["m-late"], time.time())
        assert [r.message_id for r in second.journal.claim("B", time.time()).rows] == [
            "m-early"]
    finally:
        first.close()
        second.close()


def test_a_session_whose_cron_turn_runs_is_claimed_by_no_process(
        pg_url: str, pg_runtimes: Callable[..., Runtime]) -> None:
    """A cron run is a direct turn: no inbox row is processing for it, and its exclusion
    was the memory of the process running it, so another worker claimed a message to
    the cron session and ran it beside the run."""
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.messages[0].kind == "cron":
            started.set()
            assert gate.wait(60)
        ran.append(turn.messages[0].message_id)

    a = pg_runtimes(brain=brain)
    job = a.cron.add("digest", "0 9 * * *", "Summarize")
    session = session_id_for(job["job_id"])
    other = Stores(pg_url)  # another worker's journal
    try:
        a.cron.trigger(job["job_id"])
        assert started.wait(30)
        a.post(session, "a question", message_id="m-q")
        assert other.journal.claim("B", time.time()).rows == []
        assert other.journal.get("m-q")["status"] == "pending"  # nor did A claim it
        gate.set()
        wait_for(lambda: ran[-1:] == ["m-q"], 30, what="the question's turn after the run")
    finally:
        gate.set()
        other.close()


def test_a_direct_turn_waits_for_its_sessions_inbox_turn_in_any_process(
        pg_url: str) -> None:
    """The other side of the rule: a direct turn marks its session, which then gets no new
    lease, and waits for the inbox turn another runtime runs of it to end."""
    stores = Stores(pg_url)
    try:
        now = time.time()
        stores.store.create_session("T", None, "T", "interactive", now)
        stores.journal.enqueue(NewMessage("m1", "T", "hello"), now)
        stores.journal.enqueue(NewMessage("m2", "T", "and then"), now)
        assert [r.message_id for r in stores.journal.claim("A", now).rows] == ["m1"]
        assert stores.store.take_direct_turn("T", "B", "cron-run-1", now)
        assert not stores.store.take_direct_turn("T", "C", "social-x", now)  # B's, for now
        assert stores.store.others_processing("T", "B")  # A's turn: B's waits for it
        assert stores.journal.complete_turn("A", "T", ["m1"], [], now,
                                            next_lease=30.0) is None  # m2 not chained
        assert not stores.store.others_processing("T", "B")
        assert stores.journal.claim("A", now).rows == []  # nor claimed while B's runs
        assert stores.store.direct_turn("T") == ("B", "cron-run-1")
    finally:
        stores.close()


def test_one_message_id_enqueued_by_two_processes_at_once_is_one_row(pg_url: str) -> None:
    """An enqueue reads whether its id has a row, then inserts. Another process's insert of
    the same id between the two (two pg_runtimes reporting one orphaned sub-agent task at
    their start) made the insert write nothing, and the enqueue raised an internal error
    instead of applying the idempotence rule."""
    first, second = Stores(pg_url), Stores(pg_url)
    try:
        written, commit = threading.Event(), threading.Event()
        message = NewMessage("subagent-result-t1", "parent", "the child failed")

        def slow() -> None:
            first.journal.enqueue_now(message, time.time())
            written.set()
            assert commit.wait(60)

        sending = threading.Thread(target=lambda: first.writer.call(slow, timeout=90))
        sending.start()
        assert written.wait(30)
        answer: list[object] = []
        racing = threading.Thread(target=lambda: answer.append(second.writer.call(
            lambda: second.journal.enqueue_now(message, time.time()), timeout=90)))
        racing.start()
        wait_for(lambda: lock_waits(pg_url) > 0, 30, what="the second insert to wait")
        commit.set()
        sending.join(30)
        racing.join(30)
        [result] = answer
        assert getattr(result, "created", None) is False, result
        assert [r["message_id"] for r in second.journal.rows()] == ["subagent-result-t1"]
    finally:
        first.close()
        second.close()


def test_a_dead_owners_row_ahead_of_a_late_commit_is_taken_over(pg_url: str) -> None:
    """A dies running m-late; m-early, numbered first, committed after A's claim. The
    takeover waited for m-late to be its session's oldest open row (m-early is), and
    m-early waits for no row of the session to be processing (m-late is): the session
    was never claimed again."""
    first, second = Stores(pg_url), Stores(pg_url)
    try:
        _late_commit_after_a_claim(first, second)
        assert second.journal.expire_leases(time.time(), owners={"A"}) == 1  # A is gone
        taken = second.journal.claim("B", time.time()).rows
        assert [r.message_id for r in taken] == ["m-late"]
        second.journal.ack("B", ["m-late"], time.time())
        assert [r.message_id for r in second.journal.claim("B", time.time()).rows] == [
            "m-early"]
    finally:
        first.close()
        second.close()


@pytest.mark.timeout(60)
def test_a_direct_turn_mark_left_by_a_failed_unmark_does_not_wedge_its_session(
        pg_url: str) -> None:
    """A direct turn that does not commit ends its mark in a write of its own; when that
    write fails (the database away a moment: DatabaseFailed) the mark stays, owned by a
    live runtime, so nothing clears it, and on PostgreSQL the session's messages are
    never claimed again (before, the mark only coloured the session's view)."""
    ran: list[str] = []

    def brain(turn: Turn) -> str:
        if turn.messages[0].kind == "cron":
            raise RuntimeError("the model is down")
        ran.append(turn.messages[0].message_id)
        return "ok"

    with Runtime(db=pg_url, brain=brain) as rt:
        store = rt.context.store
        real_end = store.end_direct_turn
        failed: list[str] = []

        def flaky(session_id: str, *rest: Any) -> bool:
            if not failed:
                failed.append(session_id)
                raise DatabaseFailed("the connection was lost")
            return real_end(session_id, *rest)

        store.end_direct_turn = flaky  # type: ignore[method-assign]
        job = rt.cron.add("digest", "0 9 * * *", "Summarize")
        rt.cron.trigger(job["job_id"])
        wait_for(lambda: bool(failed), 20, what="the failed unmark")
        session = session_id_for(job["job_id"])
        rt.post(session, "a question", message_id="m-q")
        wait_for(lambda: ran == ["m-q"], 20, what="the question's turn")


def test_a_claim_racing_a_direct_turns_mark_does_not_run_beside_it(pg_url: str) -> None:
    """The direct turn's mark and a claim of the session's row at once: the claim's
    snapshot did not show the mark, so it leased the row; the direct turn then sees
    that row processing and waits for its turn, instead of running beside it."""
    direct, worker = Stores(pg_url), Stores(pg_url)
    try:
        now = time.time()
        direct.store.create_session("T", None, "T", "interactive", now)
        direct.journal.enqueue(NewMessage("m1", "T", "hello"), now)
        real = direct.store.writer
        marked, commit = threading.Event(), threading.Event()

        class Stalling:
            """The writer, its transaction held open after the op (a commit on its way)."""

            def held(self, op: Callable[[], Any]) -> Callable[[], Any]:
                def held() -> Any:
                    result = op()
                    marked.set()
                    assert commit.wait(60)
                    return result
                return held

            def call(self, op: Callable[[], Any], timeout: float | None = 90) -> Any:
                return real.call(self.held(op), timeout=timeout)

            def call_landed(self, op: Callable[[], Any]) -> Any:  # the mark's (c651f71)
                return real.call_landed(self.held(op))

        direct.store.writer = Stalling()  # type: ignore[assignment]
        took: list[bool] = []
        t = threading.Thread(target=lambda: took.append(
            direct.store.take_direct_turn("T", "D", "cron-run-1", now)))
        t.start()
        assert marked.wait(30)
        claimed = [r.message_id for r in worker.journal.claim("B", time.time()).rows]
        commit.set()
        t.join(30)
        direct.store.writer = real
        assert took == [True]
        assert claimed == [] or direct.store.others_processing("T", "D"), \
            "a direct turn and an inbox turn of T would both run"
    finally:
        commit.set()
        direct.close()
        worker.close()


def test_a_claim_that_missed_anothers_lease_of_its_session_stands_back(pg_url: str) -> None:
    """Two claims at once, of a session's late-committed row and of its other row, each
    check "no row processing" in a snapshot without the other's lease; what the later one
    reads after its commit shows the other's, and it hands its row back unrun."""
    stores = Stores(pg_url)
    try:
        now = time.time()
        j = stores.journal
        j.enqueue(NewMessage("m-late", "T", "leased by A"), now)
        j.enqueue(NewMessage("m-other", "U", "another session"), now)
        assert {r.message_id for r in j.claim("A", now).rows} == {"m-late", "m-other"}
        j.enqueue(NewMessage("m-early", "T", "leased by B as A leased m-late"), now)
        stores.db.execute_sql(  # what B's claim did, its snapshot not showing A's lease
            "UPDATE agent_inbox_messages SET status = 'processing', lease_owner = 'B', "
            "lease_until = %s WHERE message_id = 'm-early'", (now + 30,))
        pg = j.bulk.pg
        assert pg is not None
        assert pg.stand_back("B", ["m-early"], now) == {"m-early"}
        assert j.get("m-early")["status"] == "pending"
        assert pg.stand_back("A", ["m-late", "m-other"], now) == set()  # A's stand
    finally:
        stores.close()


def test_a_dead_owners_steered_row_does_not_make_its_takeover_stand_back(pg_url: str) -> None:
    """Z claimed m10, steered m11 into the turn later (m11's lease ends later), and died.
    B took m10 over once its lease ran out; standing back (m11: another owner's, its
    lease live) handed m10 back, and when m11's lease ran out m11 ran before m10."""
    stores = Stores(pg_url)
    try:
        j = stores.journal
        t0 = time.time()
        j.enqueue(NewMessage("m10", "T", "first"), t0)
        assert [r.message_id for r in j.claim("Z", t0, lease=10).rows] == ["m10"]
        j.enqueue(NewMessage("m11", "T", "steered in"), t0 + 1)
        assert [r.message_id for r in j.claim_more("Z", "T", "m10", 1, t0 + 5, lease=10)] == ["m11"]
        # Z dies. At t0 + 12 m10's lease (t0 + 10) ran out, m11's (t0 + 15) not yet.
        taken = [r.message_id for r in j.claim("B", t0 + 12).rows]
        # At t0 + 16 m11's lease ran out too.
        later = [r.message_id for r in j.claim("B", t0 + 16).rows]
        assert taken == ["m10"] or later == ["m10"], (
            f"m10 stood back ({j.get('m10')['status']}); then {later} was run before it")
    finally:
        stores.close()


def test_a_social_event_waiting_on_another_processs_turn_is_kept_by_a_graceful_stop(
        pg_url: str) -> None:
    """A social event whose turn waits for another process's inbox turn of its thread is
    taken off the events no turn took; a graceful stop that ended the wait dropped it,
    though the platform had its 202. It is handed to the inbox instead."""
    holding, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> str:
        if turn.messages[0].content == "hold":
            holding.set()
            assert release.wait(60)
        return "ok"

    def event(text: str, event_id: str) -> dict[str, Any]:
        return {"platform": "slack", "sender_id": "U1", "thread_id": "T1", "text": text,
                "event_id": event_id}

    def social(rt: Runtime) -> Runtime:
        rt.social.allow("slack", ["U1"])
        rt.social.register_channel("slack", send=lambda _route, _text: None)
        return rt

    other = social(Runtime(db=pg_url, brain=brain).start())
    try:
        other.social.ingest(event("hello", "Ev-1"))
        sid = "social-slack-T1"
        assert other.social.wait_idle(20)  # the first event's turn made the thread
        other.post(sid, "hold")
        assert holding.wait(20)  # the other process runs an inbox turn of the thread
        here = social(Runtime(db=pg_url, brain=brain).start())
        store = here.context.store
        waiting: list[str] = []
        others = store.others_processing

        def watched(session_id: str, owner: str) -> bool:
            busy = others(session_id, owner)
            if busy:
                waiting.append(session_id)
            return busy

        store.others_processing = watched  # type: ignore[method-assign]
        here.social.ingest(event("second", "Ev-2"))
        wait_for(lambda: sid in waiting, 20, what="its turn to wait")
        here.stop()
        handed = other.context.journal.get("social-slack-Ev-2")  # handed to the inbox
        assert handed["status"] in ("pending", "processing")
        release.set()
        wait_for(lambda: other.context.journal.get("social-slack-Ev-2")["status"]
                 == "delivered", 30, what="the handed-over event's turn")
    finally:
        release.set()
        other.stop()


def test_a_cron_turn_gets_in_between_another_processs_stream_of_turns(pg_url: str) -> None:
    """Each of another process's turn commits leased the session's next row in the same
    transaction: a cron turn waiting for no row of the session to be processing waited
    for the whole stream. Its mark now stops the chain, so it runs after the turn then
    running."""
    ran: list[str] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            ran.append(turn.messages[0].kind)
        if turn.messages[0].kind != "cron":
            time.sleep(0.05)  # a model's answer takes a while: the stream is 2 s long

    stream = Runtime(db=pg_url, brain=brain).start()
    cron_here = Runtime(db=pg_url, brain=brain).start()
    try:
        job = stream.cron.add("digest", "0 0 1 1 *", "Summarize")
        session = session_id_for(job["job_id"])
        stream.cron.trigger(job["job_id"])  # makes the session; its turn runs there
        wait_for(lambda: ran == ["cron"], 20, what="the first cron turn")
        for i in range(40):
            stream.post(session, f"question {i}")
        wait_for(lambda: len(ran) > 1, 20, what="the stream to start")
        marked_at: list[int] = []

        def counting(rt: Runtime) -> None:
            take = rt.context.store.take_direct_turn

            def counted(*args: Any) -> bool:
                taken = take(*args)
                if taken and not marked_at:
                    with lock:
                        marked_at.append(len(ran))
                return taken
            rt.context.store.take_direct_turn = counted  # type: ignore[method-assign]

        # Asked here; the trigger notifies the stream's process too, and either may run
        # it (a process's own direct turn waited for its own stream the same way).
        for rt in (cron_here, stream):
            counting(rt)
        cron_here.cron.trigger(job["job_id"])
        wait_for(lambda: ran.count("cron") == 2, 30, what="the second cron turn")
        with lock:
            waited = ran.index("cron", 1) - marked_at[0]
        assert marked_at[0] < 30, "the stream was nearly over before the mark: no test"
        assert waited <= 3, f"the cron turn waited for {waited} turns after its mark"
    finally:
        cron_here.stop()
        stream.stop()


def test_a_lock_a_stuck_client_keeps_fails_the_write_that_waits_and_halts_nothing_else(
        pg_url: str, pg_runtimes: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch) -> None:
    """A psql session left in an open transaction holding a session's row lock used to
    halt the writer at the first write of that row, and with it every send of the runtime,
    until the client let go. The waiting write now fails after the lock wait (a
    :class:`DatabaseFailed`, nothing of it written) and the writer goes on."""
    monkeypatch.setattr(pg_database, "LOCK_WAIT_MS", 300)  # read when a connection opens
    rt = pg_runtimes(brain=lambda turn: None)
    for sid in ("stuck", "free"):
        rt.create_session("default", sid, session_id=sid)
    holder = psycopg2.connect(pg_url)
    try:
        with holder.cursor() as cur:  # BEGIN, and the row lock, until the rollback
            cur.execute("SELECT id FROM sessions WHERE id = 'stuck' FOR UPDATE")
        store = rt.context.store
        with pytest.raises(DatabaseFailed) as failed:
            store.patch_config_now("stuck", {"k": "v"}, rt.clock.now())
        assert failed.value.sqlstate == "55P03"  # lock_not_available: the lock timeout
        rt.post("free", "still moving", message_id="m-free")  # the writer was not halted
    finally:
        holder.rollback()
        holder.close()
    assert "k" not in (rt.context.store.session("stuck").config or {})
    rt.context.store.patch_config_now("stuck", {"k": "v"}, rt.clock.now())
    assert rt.context.store.session("stuck").config["k"] == "v"


def test_kinbox_connections_wait_for_a_lock_at_most_the_lock_wait(pg_url: str) -> None:
    db = open_database(pg_url)
    try:
        assert db.execute_sql("SHOW lock_timeout").fetchone()[0] == (
            f"{pg_database.LOCK_WAIT_MS // 1000}s")
    finally:
        db.close()
