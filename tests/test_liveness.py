"""On PostgreSQL a restart replays at once: a dead runtime's leases are taken over as soon
as its life lock is free, while a live, slow runtime keeps its rows."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kinbox.actors import DatabaseFailed, Runtime, Turn
from kinbox.persistence import LifeLockLost, OwnerLiveness, PersistenceError, open_database

from .helpers import end_database_sessions, wait_for

pytestmark = pytest.mark.postgres
HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(60)
def test_a_restart_after_sigkill_replays_within_a_second_not_after_the_lease(
        pg_url: str, tmp_path: Path) -> None:
    seen: list[str] = []
    setup = Runtime(db=pg_url, data_dir=str(tmp_path)).start()  # send-only: writes only
    project = setup.create_project("live")
    sid = setup.create_session(project.id, "Worker").id
    mid = setup.post(sid, "hang on this one").message_id
    setup.stop()
    child = subprocess.Popen([sys.executable, str(HERE / "liveness_child.py"), pg_url],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "turn started"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    # The dead process's lease has its full 30 s to run; the restart must not wait for it.
    started = time.monotonic()
    rt = Runtime(db=pg_url, data_dir=str(tmp_path),
                 brain=lambda turn: seen.append(turn.messages[0].message_id)).start()
    try:
        # Half the lease: a restart that waited for it could not be this early, and a
        # loaded machine takes seconds to start a runtime (3 s was the bound here).
        wait_for(lambda: seen == [mid], timeout=15, what="the replayed turn")
        assert time.monotonic() - started < 15
        wait_for(lambda: rt.inbox()[0]["status"] == "delivered", what="the replay's commit")
        assert rt.marker_counts() == {mid: 1}
    finally:
        rt.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tick", [0.05, 30.0], ids=["short-tick", "tick-longer-than-lease"])
def test_a_live_slow_runtime_is_never_robbed_of_its_rows(pg_url: str, tmp_path: Path,
                                                         tick: float) -> None:
    """A lease shorter than the turn: only renewal and the life lock keep the row with A.
    Leases were renewed only on the tick: with ``tick_interval`` longer than a third of
    ``lease_seconds`` (the README's advice for many workers is to raise it) the lease of a
    running turn ran out, and another runtime took the row over and ran the turn again
    while the first still ran it. Renewal keeps to a third of a lease whatever the tick."""
    release = threading.Event()
    holding = threading.Event()
    turns: list[str] = []

    def slow(turn: Turn) -> None:
        turns.append("slow")
        holding.set()
        release.wait(30)

    def other(turn: Turn) -> None:
        turns.append("other")

    a = Runtime(db=pg_url, brain=slow, data_dir=str(tmp_path), lease_seconds=1.0,
                tick_interval=tick).start()
    b = None
    try:
        project = a.create_project("slow")
        sid = a.create_session(project.id, "Slow").id
        mid = a.post(sid, "take your time").message_id
        assert holding.wait(10)
        b = Runtime(db=pg_url, brain=other, data_dir=str(tmp_path), lease_seconds=1.0,
                    tick_interval=0.05).start()
        deadline = time.monotonic() + 3  # several takeover checks and lease lengths
        while time.monotonic() < deadline:
            row = b.inbox()[0]
            assert (row["status"], row["lease_owner"]) == ("processing", a.owner)
            threading.Event().wait(0.1)  # sampling the row over time, not waiting for it
        release.set()
        wait_for(lambda: a.inbox()[0]["status"] == "delivered", what="A's commit")
        assert turns == ["slow"] and a.marker_counts() == {mid: 1}
    finally:
        release.set()
        a.stop()
        if b is not None:
            b.stop()


@pytest.mark.timeout(60)
def test_a_runtime_whose_connections_the_server_ended_stops_and_a_new_one_replays(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server restart or failover ends every session, the life lock's with them: the
    other runtimes take the rows over, so this one must not go on. It delivered nothing
    again and logged a traceback five times a second; now it ends as a kill would."""
    import logging

    holding, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def hanging(turn: Turn) -> None:
        holding.set()
        release.wait(30)

    a = Runtime(db=pg_url, brain=hanging, data_dir=str(tmp_path), tick_interval=0.05).start()
    try:
        project = a.create_project("drop")
        mid = a.post(a.create_session(project.id, "S").id, "hello").message_id
        assert holding.wait(10)
        with caplog.at_level(logging.ERROR, logger="kinbox.runtime"):
            end_database_sessions(pg_url)
            wait_for(lambda: a.state == "crashed", timeout=10, what="the runtime to end")
        assert any("lost the database connection that holds its life lock" in r.message
                   for r in caplog.records)
    finally:
        release.set()
    b = Runtime(db=pg_url, data_dir=str(tmp_path),
                brain=lambda turn: seen.append(turn.messages[0].message_id)).start()
    try:
        wait_for(lambda: seen == [mid], timeout=10, what="the replayed turn")
        wait_for(lambda: b.inbox()[0]["status"] == "delivered", what="the replay's commit")
        assert b.marker_counts() == {mid: 1}
    finally:
        b.stop()


@pytest.mark.timeout(60)
def test_a_send_only_runtime_connects_again_after_the_server_ended_its_sessions(
        pg_url: str, tmp_path: Path) -> None:
    """After a server restart every call failed for good ("connection already closed"):
    peewee keeps a dead connection per thread. Each thread's next statement after the one
    that found its connection gone now opens a new one; nothing is retried or doubled."""
    rt = Runtime(db=pg_url, data_dir=str(tmp_path)).start()  # send-only: no life lock
    try:
        sid = rt.create_session(rt.create_project("again").id, "S").id
        rt.post(sid, "before")
        assert [r["content"] for r in rt.inbox()] == ["before"]  # this thread's connection
        assert end_database_sessions(pg_url) > 0
        outcomes = []
        for i in range(3):
            try:
                rt.post(sid, f"after {i}")
                outcomes.append("sent")
            except DatabaseFailed as exc:  # the call that finds its connection gone
                outcomes.append(exc.kind)  # a kinbox error: the driver's was raw
        assert outcomes[0] in ("sent", "InterfaceError", "OperationalError")
        assert outcomes[1:] == ["sent", "sent"]
        with pytest.raises(DatabaseFailed):  # the first read on this thread's old connection
            rt.inbox()
        texts = [r["content"] for r in rt.inbox()]
        assert texts == ["before", *(f"after {i}" for i, o in enumerate(outcomes)
                                     if o == "sent")]
        assert rt.health()["healthy"]
    finally:
        rt.stop()



@pytest.mark.timeout(60)
def test_a_healthy_report_after_the_server_ended_its_sessions_means_a_write_goes_through(
        pg_url: str, tmp_path: Path) -> None:
    """The health check's writer probe ("commits within 2 s") was an empty operation,
    which on PostgreSQL sends the server nothing: with the writer's connection ended (a
    server restart, a failover), health said healthy, and the next write (here from a
    thread with a connection of its own) failed on the writer's dead connection. The
    probe runs a statement on the writer's connection now, so a healthy report is one
    the writer's connection answered."""
    rt = Runtime(db=pg_url, data_dir=str(tmp_path)).start()  # send-only: no life lock
    try:
        sid = rt.create_session(rt.create_project("probe").id, "S").id
        assert end_database_sessions(pg_url) > 0
        wait_for(lambda: rt.health()["healthy"], timeout=20, what="a healthy report")
        outcome: list[str] = []

        def post() -> None:  # a thread whose own read connection is new
            try:
                rt.post(sid, "after the restart")
                outcome.append("sent")
            except DatabaseFailed as exc:
                outcome.append(exc.kind)
        sender = threading.Thread(target=post)
        sender.start()
        sender.join(30)
        assert outcome == ["sent"]
    finally:
        rt.stop()


def colliding_owners(pg_url: str) -> tuple[str, str]:
    """Two owner ids whose life locks share a key (``hashtext`` is 32 bits: among a few
    hundred thousand ids some pairs collide)."""
    db = open_database(pg_url)
    try:
        row = db.execute_sql(
            "SELECT array_agg(o ORDER BY o) FROM (SELECT 'owner-' || i AS o "
            "FROM generate_series(1, 300000) AS i) ids GROUP BY hashtext(o) "
            "HAVING count(*) > 1 LIMIT 1").fetchone()
    finally:
        db.close()
    return row[0][0], row[0][1]


@pytest.mark.timeout(60)
def test_a_runtime_whose_life_lock_another_live_runtime_holds_fails_to_start_not_hangs(
        pg_url: str) -> None:
    """Two owner ids whose lock keys collide: the second runtime's start waited for the
    first one's life lock for as long as the first lived. It fails instead, and says why;
    the first keeps its lock."""
    first, second = colliding_owners(pg_url)
    db = open_database(pg_url)
    holder, late = OwnerLiveness(db, first), OwnerLiveness(db, second)
    outcome: list[BaseException | None] = []
    try:
        holder.hold()
        attempt = threading.Thread(target=lambda: outcome.append(_hold(late)), daemon=True)
        attempt.start()
        attempt.join(30)  # the lock wait, and then some
        assert len(outcome) == 1, "the second hold() still waits"
        assert isinstance(outcome[0], PersistenceError)
        assert not isinstance(outcome[0], LifeLockLost)
        assert holder.gone([]) == set()  # the first one's lock is still there
    finally:
        late.release()
        holder.release()
        db.close()


def _hold(liveness: OwnerLiveness) -> BaseException | None:
    try:
        liveness.hold()
    except BaseException as exc:
        return exc
    return None


@pytest.mark.timeout(60)
def test_the_server_notices_a_dead_host_within_about_a_lease(pg_url: str) -> None:
    """A host that dies without closing its sockets (power loss, a kernel panic, a cut
    network) left its life lock's session open until the server's TCP keepalives (2 h 11
    min by default) gave up on it: for that long the dead runtime looked alive, and the
    sessions its direct turns had marked (a mark has no lease) were claimed by no one. The
    life lock's session asks the server to probe its peer within about a lease."""
    db = open_database(pg_url)
    liveness = OwnerLiveness(db, "keepalive-owner")
    try:
        liveness.hold()
        with liveness._conn.cursor() as cur:
            cur.execute("SELECT inet_client_addr() IS NULL")
            if cur.fetchone()[0]:
                pytest.skip("a Unix-socket connection has no TCP keepalives")
            cur.execute("SELECT name, setting::int FROM pg_settings WHERE name IN "
                        "('tcp_keepalives_idle', 'tcp_keepalives_interval', "
                        "'tcp_keepalives_count')")
            got = dict(cur.fetchall())
        gives_up = (got["tcp_keepalives_idle"] + got["tcp_keepalives_interval"]
                    * got["tcp_keepalives_count"])
        assert 0 < gives_up <= 60, got
    finally:
        liveness.release()
        db.close()


@pytest.mark.timeout(60)
def test_a_check_for_gone_runtimes_stuck_on_a_lock_is_cut_short_and_proves_no_one_gone(
        pg_url: str) -> None:
    """The check ran with no statement timeout: a session holding a catalog it reads (here
    ``pg_proc``, which its first look-up of ``pg_try_advisory_lock`` scans) stalled it, and
    the runtime's ticker with it (lease renewals included), until the life lock's
    ``lock_timeout`` raised a driver error out of it. It is cut short now and proves no one
    gone; once the lock is gone the next check, on the same connection, works."""
    db = open_database(pg_url)
    checker = OwnerLiveness(db, "vm:1:checker")
    blocker = db._connect()
    blocker.autocommit = False  # a transaction of its own, as another program's would be
    outcome: list[object] = []
    try:
        checker.hold()
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLE pg_catalog.pg_proc IN ACCESS EXCLUSIVE MODE")

        def check() -> None:
            try:
                outcome.append(checker.gone({"vm:2:dead"}))
            except BaseException as exc:
                outcome.append(exc)

        checking = threading.Thread(target=check, daemon=True)
        checking.start()
        with blocker.cursor() as cur:  # the check does wait on the lock (or has waited)

            def waited() -> bool:
                cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                            "AND relation = 'pg_catalog.pg_proc'::regclass")
                return bool(cur.fetchone()[0]) or bool(outcome)

            wait_for(waited, 20, "the check to wait on pg_proc's lock")
        checking.join(30)
        assert outcome == [set()], outcome  # cut short: no one proven gone, nothing raised
    finally:
        blocker.rollback()
        blocker.close()
    try:
        assert checker.gone({"vm:2:dead"}) == {"vm:2:dead"}
    finally:
        checker.release()
        db.close()
