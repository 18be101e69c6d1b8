"""A lease that committed on the server while its answer was lost with the connection
(PostgreSQL).

The server commits a claim's lease, then the connection goes (a restart, a failover, a
network cut) before the answer reaches the runtime: the runtime sees a connection error
and takes the claim for failed, while the rows are leased to it, a live runtime, with
nothing running them. No one takes them over (their owner holds its life lock) and the
runtime never renews them: the sessions stalled until the lease ran out, and the rows
came back as suspects. The runtime takes back the rows leased to itself that it does not
run, and delivers them within seconds.

Where the answer is lost cannot be timed from outside, so the test wraps the claim's
lease statement: it runs for real, then its connection is ended by the server
(``pg_terminate_backend``) and the caller gets the driver's real error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from kinbox.actors import Runtime, Turn

from .helpers import end_backends, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def _answer_lost(pg_url: str, rt: Runtime, run: Callable[..., Any],
                 lost: list[bool]) -> Callable[..., Any]:
    """``run`` (a prepared statement's), but its first call's connection is ended by the
    server once the statement committed, and the caller gets the error of the next use."""
    db = rt.context.journal.t.db

    def call(params: Any) -> Any:
        rows = run(params)
        if lost:
            return rows
        lost.append(any(r[-1] for r in rows))  # it leased a row
        end_backends(pg_url, [db.execute_sql("SELECT pg_backend_pid()").fetchone()[0]])
        db.execute_sql("SELECT 1")  # the driver's own error: the connection is gone
        raise AssertionError("the connection outlived its backend")
    return call


def test_rows_whose_lease_committed_as_the_claim_lost_its_connection_are_delivered_soon(
        pg_url: str, tmp_path: Path, runtimes: list[Runtime]) -> None:
    """The claim's lease committed, its answer was lost: the message is delivered once,
    long before its 120 s lease would have run out."""
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.append(turn.messages[0].content)

    rt = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path / "w"), tick_interval=0.1,
                 lease_seconds=120.0).start()
    runtimes.append(rt)
    pg = rt.context.journal.bulk.pg
    assert pg is not None
    lost: list[bool] = []
    pg.lease_plain.run = _answer_lost(pg_url, rt, pg.lease_plain.run, lost)  # type: ignore[method-assign]
    sender = Runtime(db=pg_url, data_dir=str(tmp_path / "s")).start()  # send-only
    runtimes.append(sender)
    sid = sender.create_session(sender.create_project("lost").id, "S").id
    sender.post(sid, "hello", sender="u")
    wait_for(lambda: bool(lost), timeout=20, what="the claim whose answer is lost")
    assert lost == [True]
    wait_for(lambda: seen == ["hello"], timeout=20, what="the delivery")
    wait_for(lambda: sender.inbox()[0]["status"] == "delivered", timeout=20,
             what="the commit")
    assert seen == ["hello"]
    assert sender.inbox()[0]["attempts"] == 0


def test_a_turn_that_runs_for_many_looks_keeps_its_row(
        pg_url: str, tmp_path: Path, runtimes: list[Runtime]) -> None:
    """The rows of turns that run here, and of the turns waiting behind them for a slot,
    are held: however long they take, none is taken back (its commit would be refused, and
    the turn run again)."""
    from kinbox.actors.unheld_leases import LOOK_INTERVAL

    started, release = threading.Event(), threading.Event()
    seen: list[str] = []
    lost: list[object] = []

    def brain(turn: Turn) -> None:
        started.set()
        release.wait(60)
        seen.append(turn.messages[0].content)

    rt = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path / "w"), tick_interval=0.05,
                 max_active_sessions=1).start()
    runtimes.append(rt)
    rt.subscribe(lambda event, data: lost.append(data) if event == "lease_lost" else None)
    project = rt.create_project("long").id
    first = rt.create_session(project, "A").id
    second = rt.create_session(project, "B").id
    rt.post(first, "one", sender="u")
    assert started.wait(20)
    rt.post(second, "two", sender="u")  # waits for the one slot
    since = rt.context.now()
    wait_for(lambda: rt.context.now() - since > 4 * LOOK_INTERVAL, timeout=30,
             what="several looks for rows nothing runs")
    release.set()
    wait_for(lambda: sorted(seen) == ["one", "two"], timeout=20, what="both turns")
    wait_for(lambda: all(r["status"] == "delivered" for r in rt.inbox()), timeout=20,
             what="both commits")
    assert lost == []
    assert [r["attempts"] for r in rt.inbox()] == [0, 0]



def test_the_next_row_a_lost_turn_commit_leased_is_delivered_soon(
        pg_url: str, tmp_path: Path, runtimes: list[Runtime]) -> None:
    """A turn's commit acknowledges its row and leases the session's next one. It
    committed, and the writer's connection went before its answer: the turn is told its
    commit failed, and the next row, leased to the runtime, was started by no run. It is
    delivered in seconds, not at its 120 s lease, and the first message has one turn."""
    seen: list[str] = []
    posted = threading.Event()

    def brain(turn: Turn) -> None:
        seen.extend(m.content for m in turn.messages)
        posted.wait(20)

    rt = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path / "w"), tick_interval=0.1,
                 lease_seconds=120.0).start()
    runtimes.append(rt)
    sender = Runtime(db=pg_url, data_dir=str(tmp_path / "s")).start()  # send-only
    runtimes.append(sender)
    sid = sender.create_session(sender.create_project("lost").id, "S").id
    db = rt.context.journal.t.db
    real_commit = db.commit
    lost: list[tuple[str, str]] = []

    def commit() -> None:
        real_commit()
        if lost or threading.current_thread().name != "kinbox-writer":
            return
        admin = psycopg2.connect(pg_url)
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute("SELECT message_id, status FROM agent_inbox_messages "
                            "WHERE lease_owner = %s OR status = 'delivered' "
                            "ORDER BY message_id", (rt.owner,))
                rows = cur.fetchall()
                if rows != [("m1", "delivered"), ("m2", "processing")]:
                    return  # another batch
                lost.extend(rows)
                cur.execute("SELECT pg_terminate_backend(%s)",
                            (db.connection().info.backend_pid,))
        finally:
            admin.close()
        db.execute_sql("SELECT 1")  # the driver's own error: the connection is gone
        raise AssertionError("the connection outlived its backend")

    db.commit = commit  # type: ignore[method-assign]
    sender.post(sid, "one", sender="u", message_id="m1")
    wait_for(lambda: seen == ["one"], timeout=20, what="the first turn")
    sender.post(sid, "two", sender="u", message_id="m2")
    posted.set()
    wait_for(lambda: bool(lost), timeout=20, what="the commit whose answer is lost")
    wait_for(lambda: seen == ["one", "two"], timeout=20, what="the next row's turn")
    wait_for(lambda: [r["status"] for r in sender.inbox()] == ["delivered"] * 2, timeout=20,
             what="its commit")
    assert seen == ["one", "two"]
    assert sender.marker_counts() == {"m1": 1, "m2": 1}
    assert [r["attempts"] for r in sender.inbox()] == [0, 0]


@pytest.mark.timeout(10)
def test_a_row_goes_back_once_two_looks_saw_it_unheld_with_the_same_lease() -> None:
    """The rule apart: a row unheld at one look only (a send's row between its commit
    and its offer), or leased again between two (a new lease end), stays."""
    from kinbox.actors.unheld_leases import seen_twice, unheld

    leased = [("a", "s1", 10.0), ("b", "s2", 10.0), ("c", "s3", 12.0)]
    first = unheld(leased, {"s2"})
    assert first == {"a": 10.0, "c": 12.0}
    assert seen_twice({}, first) == []
    assert seen_twice(first, {"a": 10.0, "c": 13.0, "d": 9.0}) == ["a"]
    # A row whose send is still handing it over is never unheld, however many looks.
    assert unheld(leased, {"s2"}, {"a"}) == {"c": 12.0}
