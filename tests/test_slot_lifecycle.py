"""The slot table beside direct turns and over time: a row waiting for its session's cron
turn holds no thread, idle actors passivate on the injected clock, room goes by last use.

(A graceful stop handing back the rows waiting for a slot: tests/test_runtime_stop_honoured.py.)"""

from __future__ import annotations

import threading

import pytest

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors.cron_rules import session_id_for

from .helpers import wait_for

pytestmark = pytest.mark.timeout(60)


def test_a_row_waiting_for_its_session_s_cron_turn_holds_no_session_thread(
        db_url: str, clock: ManualClock) -> None:
    """A message to a session whose cron run's turn runs is leased at once (SQLite's fast
    path) and must wait for that turn. It waited on a session thread, holding one of the
    ``max_active_sessions`` slots for the whole cron turn: with one slot, every other
    session's messages waited for a cron run they have nothing to do with."""
    cron_started, release_cron = threading.Event(), threading.Event()
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.messages[0].kind == "cron":
            cron_started.set()
            release_cron.wait(30)
        ran.append(turn.messages[0].content)

    rt = Runtime(db=db_url, brain=brain, clock=clock, max_active_sessions=1).start()
    try:
        job = rt.cron.add("digest", "0 0 1 1 *", "write the digest")
        rt.cron.trigger(job["job_id"])
        assert cron_started.wait(20)
        rt.post(session_id_for(job["job_id"]), "for the cron session")
        other = rt.create_session(None, "Other").id
        rt.post(other, "for another session")
        wait_for(lambda: "for another session" in ran, 15,
                 what="another session's turn while the cron turn runs")
        assert "for the cron session" not in ran
        release_cron.set()
        rt.run_until_idle(20)
        assert ran[-1] == "for the cron session"
    finally:
        release_cron.set()
        rt.stop()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_idle_ttl_passivates_on_the_injected_clock_and_the_session_wakes_on_demand(
        db_url: str, clock: ManualClock, kind: str) -> None:
    """``idle_ttl`` counts on the runtime's clock (not the wall clock): an actor idle one
    second short of it stays live however long the test takes, and goes once the clock
    reaches it; its session's next message activates it again."""
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.append(turn.messages[0].content)

    async def async_brain(turn: Turn) -> None:
        seen.append(turn.messages[0].content)

    rt = Runtime(db=db_url, brain=brain if kind == "sync" else async_brain, clock=clock,
                 idle_ttl=60).start()
    try:
        sid = rt.create_session(None, "S").id
        rt.post(sid, "one")
        rt.run_until_idle(20)
        assert rt.statistics()["live"] == 1
        clock.advance(59)
        rt.run_until_idle(20)
        assert rt.statistics()["live"] == 1 and rt.statistics()["passivations"] == 0
        clock.advance(1)
        wait_for(lambda: rt.statistics()["live"] == 0, 20, what="the idle actor to go")
        assert rt.statistics()["passivations"] == 1
        rt.post(sid, "two")
        rt.run_until_idle(20)
        assert seen == ["one", "two"] and rt.statistics()["live"] == 1
    finally:
        rt.stop()


def test_the_actor_passivated_for_room_is_the_least_recently_used_not_started(
        db_url: str, clock: ManualClock) -> None:
    """The live actors were ordered by when their turns started: a session whose long turn
    had just ended was evicted first, before one idle since long before (the least
    recently used goes first, README)."""
    release_a = threading.Event()

    def brain(turn: Turn) -> None:
        if turn.messages[0].content == "long":
            release_a.wait(30)

    rt = Runtime(db=db_url, brain=brain, clock=clock, max_active_sessions=2,
                 max_live_sessions=2).start()
    try:
        a, b, c = (rt.create_session(None, name).id for name in "ABC")
        rt.post(a, "long")
        wait_for(lambda: rt.statistics()["running"] == [a], 20, what="A's long turn")
        rt.post(b, "short")
        wait_for(lambda: rt.inbox(target=b)[0]["status"] == "delivered", 20,
                 what="B's short turn")
        release_a.set()
        rt.run_until_idle(20)  # A's turn ended last: B is the least recently used
        rt.post(c, "new")
        rt.run_until_idle(20)
        assert set(rt.context.slots.live) == {a, c}  # type: ignore[union-attr]
    finally:
        release_a.set()
        rt.stop()


def test_a_row_its_commit_chained_behind_a_cron_turn_waits_without_a_session_thread(
        db_url: str, clock: ManualClock) -> None:
    """A turn's commit leases its session's next row (chaining) while a cron run of that
    session waits for the turn to end: the cron turn takes the session first, and the
    chained row waited on the session thread for the whole cron turn, as a row leased with
    its send once did (the test above); with one slot, every other session waited too."""
    cron_runs: list[str] = []
    first_started, release_first = threading.Event(), threading.Event()
    cron_started, release_cron = threading.Event(), threading.Event()
    ran: list[str] = []

    def brain(turn: Turn) -> None:
        if turn.messages[0].kind == "cron":
            cron_runs.append(turn.messages[0].message_id)
            if len(cron_runs) > 1:  # the first run made the session
                cron_started.set()
                release_cron.wait(30)
        elif turn.messages[0].content == "first":
            first_started.set()
            release_first.wait(30)
        ran.append(turn.messages[0].content)

    def hold_the_commit(event: str, data: dict[str, object]) -> None:
        # The board is free from here: the cron turn waiting for it takes it before the
        # chained row's turn tries to start.
        if event == "turn_committed" and data["message_ids"] == ["first-id"]:
            assert cron_started.wait(30)

    rt = Runtime(db=db_url, brain=brain, clock=clock, max_active_sessions=1).start()
    rt.subscribe(hold_the_commit)
    try:
        job = rt.cron.add("digest", "0 0 1 1 *", "write the digest")
        rt.cron.trigger(job["job_id"])
        assert rt.cron.wait_idle(20)
        session = session_id_for(job["job_id"])
        rt.post(session, "first", message_id="first-id")
        rt.post(session, "chained")
        assert first_started.wait(20)
        clock.advance(1)  # a run of its own, not the first one's again
        rt.cron.trigger(job["job_id"])  # its turn waits for the first one's end
        release_first.set()
        assert cron_started.wait(20)
        other = rt.create_session(None, "Other").id
        rt.post(other, "for another session")
        wait_for(lambda: "for another session" in ran, 20,
                 what="another session's turn while the cron turn runs")
        assert "chained" not in ran
        release_cron.set()
        rt.run_until_idle(20)
        assert ran[-1] == "chained"
        assert {r["status"] for r in rt.inbox(target=session)} == {"delivered"}
    finally:
        release_first.set()
        release_cron.set()
        rt.stop()
