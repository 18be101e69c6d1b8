"""The server ends every session while runtimes deliver and send (PostgreSQL).

A server restart, a failover or ``pg_terminate_backend`` on every backend, in the middle
of a stream of sends and turns: the delivering runtime ends as a kill would (its life lock
went with its connection) and a new one replays; a send-only runtime goes on. Each send
gets an answer (sent, or a ``DatabaseFailed``), none hangs; the sender's threads all live
and its later sends go through; every message whose send was answered "sent" is delivered,
with one committed turn, and none has two.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from kinbox.actors import Runtime, RuntimeStateError, Turn
from kinbox.persistence import DatabaseFailed, WriterClosed

from .helpers import database_down, end_database_sessions, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]

SENDERS, SENDS = 3, 40


def test_sends_and_turns_across_every_session_ended_lose_nothing_and_double_nothing(
        pg_url: str, tmp_path: Path, runtimes: list[Runtime]) -> None:
    turns: list[str] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            turns.extend(m.message_id for m in turn.messages)

    worker = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path / "w1"),
                     tick_interval=0.05).start()
    runtimes.append(worker)
    sender = Runtime(db=pg_url, data_dir=str(tmp_path / "s")).start()  # send-only
    runtimes.append(sender)
    project = sender.create_project("ended").id
    sessions = [sender.create_session(project, f"S{i}").id for i in range(4)]
    sent: list[str] = []
    refused: list[str] = []
    others: list[BaseException] = []

    def send(n: int) -> None:
        try:
            for i in range(SENDS):
                mid = f"m-{n}-{i}"
                try:
                    sender.post(sessions[(n + i) % len(sessions)], f"body {n} {i}",
                                sender="u", message_id=mid)
                    with lock:
                        sent.append(mid)
                except DatabaseFailed as exc:
                    with lock:
                        refused.append(exc.kind)
        except BaseException as exc:  # the test fails on it below
            others.append(exc)

    def send_to_the_worker() -> None:  # leased with its send (the fast path), until it ends
        try:
            for i in range(10 * SENDS):
                mid = f"w-{i}"
                try:
                    worker.post(sessions[i % len(sessions)], f"body w {i}", sender="u",
                                message_id=mid)
                    with lock:
                        sent.append(mid)
                except DatabaseFailed as exc:
                    with lock:
                        refused.append(exc.kind)
                except (RuntimeStateError, WriterClosed):
                    return  # the worker ended (or was ending): it says so
        except BaseException as exc:
            others.append(exc)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(SENDERS)]
    threads.append(threading.Thread(target=send_to_the_worker))
    for t in threads:
        t.start()
    wait_for(lambda: len(sent) >= SENDERS * SENDS // 2 and bool(turns), timeout=60,
             what="sends and turns under way")
    assert end_database_sessions(pg_url) > 0
    sent_then = len(sent)
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a send hung"
    assert others == []
    assert set(refused) <= {"OperationalError", "InterfaceError"}
    assert sent_then < len(sent)  # the sessions ended mid-stream
    ours = [m for m in sent if m.startswith("m-")]
    assert len(ours) >= SENDERS * SENDS - 2 * SENDERS  # at most the first call of a thread
    wait_for(lambda: worker.state == "crashed", timeout=20, what="the worker to end")
    with pytest.raises(DatabaseFailed):  # this thread's first call on its ended connection
        sender.inbox()
    replay = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path / "w2"),
                     tick_interval=0.05).start()
    runtimes.append(replay)
    try:
        sender.post(sessions[0], "after", sender="u", message_id="m-after")
    except DatabaseFailed:
        # The writer's connection may be found ended only now: pg_terminate_backend signals
        # and does not wait, so a batch can still have gone through it after the end. Its
        # call fails, nothing written, and the next connects again (the rule under test).
        sender.post(sessions[0], "after", sender="u", message_id="m-after")
    expected = {*sent, "m-after"}

    def delivered() -> set[str]:
        return {r["message_id"] for r in sender.inbox(state="delivered")}
    wait_for(lambda: expected <= delivered(), timeout=90, what="every sent message delivered")
    counts = sender.marker_counts()
    assert {mid: counts.get(mid) for mid in expected} == dict.fromkeys(expected, 1)
    assert max(counts.values()) == 1
    assert all(r["status"] == "delivered" for r in sender.inbox())


def _end_sessions_but_life_locks(pg_url: str, end: bool = True) -> int:
    """End every other session on the database but those holding a runtime's life lock
    (an administrator's ``pg_terminate_backend`` of the busy ones, a pooler or a proxy
    dropping them); how many (with ``end=False``: only count them)."""
    import psycopg2

    from kinbox.persistence.liveness import LOCK_CLASS

    admin = psycopg2.connect(pg_url)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(
                f"SELECT {'pg_terminate_backend(pid)' if end else 'pid'} "
                "FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND pid NOT IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = %s AND granted)", (LOCK_CLASS,))
            return len(cur.fetchall())
    finally:
        admin.close()


def test_a_worker_whose_other_connections_end_goes_on_delivering(
        pg_url: str, tmp_path: Path, runtimes: list[Runtime]) -> None:
    """Every session but the life lock's ends, in the middle of sends and turns, twice: the
    worker lives on (its lock is held), each of its threads connects again, and every
    message sent is delivered with one committed turn."""
    turns: list[str] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            turns.extend(m.message_id for m in turn.messages)

    worker = Runtime(db=pg_url, brain=brain, data_dir=str(tmp_path / "w"),
                     tick_interval=0.05).start()
    runtimes.append(worker)
    sender = Runtime(db=pg_url, data_dir=str(tmp_path / "s")).start()  # send-only
    runtimes.append(sender)
    project = sender.create_project("ended").id
    sessions = [sender.create_session(project, f"S{i}").id for i in range(4)]
    sent: list[str] = []
    refused: list[str] = []
    others: list[BaseException] = []

    def send(n: int, rt: Runtime) -> None:
        try:
            for i in range(SENDS):
                mid = f"m-{n}-{i}"
                try:
                    rt.post(sessions[(n + i) % len(sessions)], f"body {n} {i}", sender="u",
                            message_id=mid)
                    with lock:
                        sent.append(mid)
                except DatabaseFailed as exc:
                    with lock:
                        refused.append(exc.kind)
        except BaseException as exc:
            others.append(exc)

    threads = [threading.Thread(target=send, args=(n, sender)) for n in range(SENDERS)]
    threads.append(threading.Thread(target=send, args=(SENDERS, worker)))  # the fast path
    for t in threads:
        t.start()
    total = (SENDERS + 1) * SENDS
    wait_for(lambda: len(sent) >= total // 3 and bool(turns), timeout=60,
             what="sends and turns under way")
    assert _end_sessions_but_life_locks(pg_url) > 0
    wait_for(lambda: len(turns) >= total // 2, timeout=60, what="more turns")
    # More turns may have been counted before the first end: the second waits for the
    # threads to have connected again, as it means to end them in the middle again.
    wait_for(lambda: _end_sessions_but_life_locks(pg_url, end=False) > 0, timeout=60,
             what="the threads to connect again")
    assert _end_sessions_but_life_locks(pg_url) > 0
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a send hung"
    assert others == []
    assert set(refused) <= {"OperationalError", "InterfaceError"}
    with pytest.raises(DatabaseFailed):  # this thread's first call on its ended connection
        sender.inbox()

    def delivered() -> set[str]:
        return {r["message_id"] for r in sender.inbox(state="delivered")}
    wait_for(lambda: set(sent) <= delivered(), timeout=60, what="every sent message delivered")
    assert worker.state == "running"
    counts = sender.marker_counts()
    assert {mid: counts.get(mid) for mid in sent} == dict.fromkeys(sent, 1)
    assert max(counts.values()) == 1
    wait_for(lambda: all(r["status"] == "delivered" for r in sender.inbox()), timeout=60,
             what="nothing left open")
    worker.post(sessions[0], "after", sender="u", message_id="m-after")
    wait_for(lambda: "m-after" in delivered(), timeout=30, what="a send after")


@pytest.mark.timeout(120)
def test_sends_while_the_database_takes_no_connections_fail_at_once_and_later_ones_go(
        pg_url: str, tmp_path: Path, runtimes: list[Runtime]) -> None:
    """An outage of the database alone (``ALLOW_CONNECTIONS false``, every session ended:
    what a server down looks like to its clients, without stopping the server others
    share): each send fails at once with a ``DatabaseFailed`` (no hang), and once the
    database takes connections again the next sends go through, with nothing of the
    failed ones written."""
    sender = Runtime(db=pg_url, data_dir=str(tmp_path / "s")).start()  # send-only
    runtimes.append(sender)
    sid = sender.create_session(sender.create_project("outage").id, "S").id
    sender.post(sid, "before", sender="u")
    outcomes: list[str] = []
    with database_down(pg_url):
        for i in range(3):
            try:
                sender.post(sid, f"during {i}", sender="u")
                outcomes.append("sent")
            except DatabaseFailed as exc:
                outcomes.append(exc.kind)
    assert outcomes == ["OperationalError"] * 3
    for i in range(2):
        sender.post(sid, f"after {i}", sender="u")
    with pytest.raises(DatabaseFailed):  # this thread's first call on its ended connection
        sender.inbox()
    assert [r["content"] for r in sender.inbox()] == ["before", "after 0", "after 1"]
