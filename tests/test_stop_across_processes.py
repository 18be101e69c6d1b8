"""``agent_stop`` reaches a turn another process runs (T4 across processes).

The stop flag lives in the memory of the process running the turn: asked from a
send-only process (``kinbox serve`` beside ``kinbox worker``) or another worker on
the same PostgreSQL, ``agent_stop`` answered "not active" though ``agent_list`` showed
the session active, and the turn ran to its end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from kinbox.actors import Runtime, SystemClock, ToolError, Turn
from kinbox.actors.cron_rules import session_id_for
from kinbox.actors.running import RunningTurns

from .helpers import wait_for

pytestmark = pytest.mark.timeout(60)


def _waiting_for_its_stop() -> tuple[threading.Event, threading.Event, list[bool],
                                     Callable[[Turn], str]]:
    """A brain whose turn waits for its stop: events for its start and end, and whether
    each turn was stopped."""
    started, ended = threading.Event(), threading.Event()
    outcome: list[bool] = []

    def brain(turn: Turn) -> str:
        started.set()
        turn.wait_stop_requested(30)
        outcome.append(turn.stop_requested)
        ended.set()
        return "stopped" if turn.stop_requested else "ran to its end"
    return started, ended, outcome, brain


def test_a_stop_asked_in_another_process_stops_the_turn(pg_url: str) -> None:
    started, ended, outcome, brain = _waiting_for_its_stop()

    worker = Runtime(db=pg_url, brain=brain, clock=SystemClock()).start()
    front = Runtime(db=pg_url, clock=SystemClock()).start()  # send-only, as kinbox serve
    try:
        project = front.create_project("p")
        bob = front.create_session(project.id, "Bob").id
        boss = front.tools_for(front.create_session(project.id, "Boss").id)
        front.post(bob, "work long")
        assert started.wait(20)
        assert boss.agent_stop(bob) == {"agent_id": bob, "status": "stop_requested"}
        assert ended.wait(10) and outcome == [True]
        wait_for(lambda: front.inbox(target=bob)[0]["status"] == "delivered", 10,
                 what="the stopped turn's commit")
        assert [e.text for e in front.transcript(bob)][-1] == "stopped"
        wait_for(lambda: front.context.stops.pending() == [], 10,  # type: ignore[union-attr]
                 what="the request to be forgotten")
        with pytest.raises(ToolError, match="is not active"):
            boss.agent_stop(bob)
    finally:
        front.stop()
        worker.stop()


def test_a_request_for_a_finished_turn_never_stops_the_next(
        make_runtime: Callable[..., Runtime]) -> None:
    turns: list[tuple[str, bool]] = []
    rt = make_runtime(brain=lambda turn: turns.append(
        (turn.messages[0].content, turn.stop_requested)))
    project = rt.create_project("p")
    bob = rt.create_session(project.id, "Bob").id
    first = rt.post(bob, "one").message_id
    rt.run_until_idle()
    assert rt.context.stops is not None
    rt.context.stops.ask(first, bob, "late", rt.clock.now())  # arrives after the turn
    rt.post(bob, "two")
    rt.run_until_idle()
    assert turns == [("one", False), ("two", False)]
    rt.clock.advance(1)  # type: ignore[attr-defined]
    wait_for(lambda: rt.context.stops.pending() == [], 10,  # type: ignore[union-attr]
             what="the stale request to be forgotten")


def test_a_stop_asked_in_another_process_stops_a_cron_turn(any_db_url: str) -> None:
    """A direct turn (a cron run, a social event) has no row being processed: its
    session's mark names the turn, and the process running it carries the stop out."""
    started, ended, outcome, brain = _waiting_for_its_stop()

    worker = Runtime(db=any_db_url, brain=brain, clock=SystemClock()).start()
    front = Runtime(db=any_db_url, clock=SystemClock()).start()  # send-only, as kinbox serve
    try:
        job = front.cron.add("digest", "0 0 1 1 *", "write the digest")
        # Triggered where it runs: another process sees a trigger at its next look at the
        # job tables (every 15 s, see "Cron jobs"); the stop is what crosses processes here.
        worker.cron.trigger(job["job_id"])
        assert started.wait(30)
        session = session_id_for(job["job_id"])
        project = front.session(session).project_id
        boss = front.tools_for(front.create_session(project, "Boss").id)
        assert boss.agent_stop(session) == {"agent_id": session, "status": "stop_requested"}
        assert ended.wait(10) and outcome == [True]
        wait_for(lambda: [r["status"] for r in front.cron.runs(job["job_id"])] == ["success"],
                 10, what="the stopped run's commit")
        wait_for(lambda: front.context.stops.pending() == [], 10,  # type: ignore[union-attr]
                 what="the request to be forgotten")
        with pytest.raises(ToolError, match="is not active"):
            boss.agent_stop(session)
    finally:
        front.stop()
        worker.stop()


def test_a_request_names_its_turn_and_never_stops_another_of_the_session() -> None:
    """A request from another process names a turn (a row, a cron run, a social event):
    when the session runs another turn here first (the asked one waiting for it), that
    one is not stopped; the asked one is, once it runs."""
    turns = RunningTurns()
    inbox = turns.try_begin("s", 0.0, "m1")
    assert inbox is not None
    assert not turns.request_stop("s", "boss", 1.0, "cron-run-7")
    assert not inbox.is_set()
    turns.end("s")
    cron, _ = turns.begin("s", lambda: 2.0, "cron-run-7")
    assert turns.request_stop("s", "boss", 3.0, "cron-run-7") and cron.is_set()


def test_a_stop_from_another_process_stops_the_cron_turn_not_the_inbox_turn_behind_it(
        db_url: str) -> None:
    """A message sent to a cron session while its run's turn runs is leased at once on
    SQLite (the fast path) and waits for that turn. A stop asked from another process
    then named that waiting row, being processing, instead of the cron turn the session's
    mark names: the cron turn ran to its end, and the request stopped the next turn."""
    cron_started, cron_ended = threading.Event(), threading.Event()
    inbox_started, release_inbox = threading.Event(), threading.Event()
    stopped: dict[str, bool] = {}

    def brain(turn: Turn) -> str:
        content = turn.messages[0].content
        if content.endswith("write the digest"):
            cron_started.set()
            turn.wait_stop_requested(30)
            stopped["cron"] = turn.stop_requested
            cron_ended.set()
        else:
            inbox_started.set()
            release_inbox.wait(30)
            stopped["inbox"] = turn.stop_requested
        return "done"

    worker = Runtime(db=db_url, brain=brain, clock=SystemClock()).start()
    front = Runtime(db=db_url, clock=SystemClock()).start()  # send-only, as kinbox serve
    try:
        job = worker.cron.add("digest", "0 0 1 1 *", "write the digest")
        worker.cron.trigger(job["job_id"])
        assert cron_started.wait(30)
        session = session_id_for(job["job_id"])
        worker.post(session, "a message for the cron session")
        assert [r["status"] for r in front.inbox(target=session)] == ["processing"]
        boss = front.tools_for(front.create_session(front.session(session).project_id,
                                                    "Boss").id)
        assert boss.agent_stop(session) == {"agent_id": session, "status": "stop_requested"}
        assert cron_ended.wait(10) and stopped == {"cron": True}
        assert inbox_started.wait(10)
        wait_for(lambda: front.context.stops.pending() == [], 10,  # type: ignore[union-attr]
                 what="the request to be carried out and forgotten")
        release_inbox.set()
        wait_for(lambda: front.inbox(target=session)[0]["status"] == "delivered", 10,
                 what="the inbox turn's commit")
        assert stopped == {"cron": True, "inbox": False}
    finally:
        release_inbox.set()
        front.stop()
        worker.stop()


def test_a_stop_from_another_process_stops_the_inbox_turn_a_cron_turn_waits_for(
        db_url: str) -> None:
    """The other way round: the cron run's turn has marked its session and waits for the
    session's inbox turn in the same process. From the database that looks as the mark's
    turn running; the process running them stops the inbox turn, which ran when asked,
    and not the cron turn after it."""
    cron_runs, inbox_started, release_cron = [], threading.Event(), threading.Event()
    stopped: dict[str, bool] = {}

    def brain(turn: Turn) -> str:
        if turn.messages[0].content.endswith("write the digest"):
            cron_runs.append(turn)
            if len(cron_runs) > 1:
                release_cron.wait(30)
                stopped["cron"] = turn.stop_requested
        else:
            inbox_started.set()
            turn.wait_stop_requested(30)
            stopped["inbox"] = turn.stop_requested
        return "done"

    worker = Runtime(db=db_url, brain=brain, clock=SystemClock()).start()
    front = Runtime(db=db_url, clock=SystemClock()).start()  # send-only, as kinbox serve
    try:
        job = worker.cron.add("digest", "0 0 1 1 *", "write the digest")
        worker.cron.trigger(job["job_id"])  # the first run makes the session
        wait_for(lambda: [r["status"] for r in front.cron.runs(job["job_id"])] == ["success"],
                 30, what="the first run")
        session = session_id_for(job["job_id"])
        worker.post(session, "a message for the cron session")
        assert inbox_started.wait(30)
        worker.cron.trigger(job["job_id"])
        wait_for(lambda: front.context.store.direct_turn(session) is not None, 30,
                 what="the second run's mark")
        boss = front.tools_for(front.create_session(front.session(session).project_id,
                                                    "Boss").id)
        assert boss.agent_stop(session) == {"agent_id": session, "status": "stop_requested"}
        wait_for(lambda: "inbox" in stopped, 10, what="the inbox turn's end")
        assert stopped == {"inbox": True}
        wait_for(lambda: len(cron_runs) == 2, 10, what="the cron turn's start")
        wait_for(lambda: front.context.stops.pending() == [], 10,  # type: ignore[union-attr]
                 what="the request to be carried out and forgotten")
        release_cron.set()
        wait_for(lambda: "cron" in stopped, 10, what="the cron turn's end")
        assert stopped == {"inbox": True, "cron": False}
    finally:
        release_cron.set()
        front.stop()
        worker.stop()


class DiesOnce:
    """A brain whose first turn hangs until ``die`` (its worker is killed there, so the
    turn is over); a later turn, a takeover's, runs until the lingering stop request is
    gone (carried out or dropped), then notes whether it was stopped."""

    def __init__(self, front: list[Runtime]) -> None:
        self.first, self.die = threading.Event(), threading.Event()
        self.stopped: list[bool] = []
        self.front = front  # the send-only runtime, once started

    def __call__(self, turn: Turn) -> str:
        if not self.first.is_set():
            self.first.set()
            self.die.wait(30)
            raise RuntimeError("killed")
        stops = self.front[0].context.stops
        assert stops is not None
        wait_for(lambda: stops.pending() == [], 20, what="the stale request to go")
        self.stopped.append(turn.stop_requested)
        return "done"


def _dying_worker(db_url: str) -> tuple[DiesOnce, Runtime, list[Runtime]]:
    """A worker whose first turn hangs (:class:`DiesOnce`), and beside it a send-only
    runtime (``front[0]``) that outlives it."""
    front: list[Runtime] = []
    brain = DiesOnce(front)
    worker = Runtime(db=db_url, brain=brain, clock=SystemClock()).start()
    front.append(Runtime(db=db_url, clock=SystemClock()).start())  # send-only
    return brain, worker, front


def test_a_request_for_a_turn_that_died_never_stops_the_turn_that_takes_it_over(
        db_url: str) -> None:
    """The worker running the turn dies (a kill, a lost machine) before its tick carried
    out a stop another process asked of it: that turn is over. Its row, still
    ``processing`` under the dead worker's lease, is taken over by the next worker, whose
    turn of it is a new one; the request named the dead turn, yet it lingered under the
    row's id and stopped the takeover's turn as it began, which committed the message
    with nothing done (the brain ended on the stop), contrary to "a request that arrives
    after the turn ended is dropped and never stops the next one"."""
    brain, worker, front = _dying_worker(db_url)
    first, die, stopped = brain.first, brain.die, brain.stopped
    after: Runtime | None = None
    try:
        project = front[0].create_project("p")
        bob = front[0].create_session(project.id, "Bob").id
        boss = front[0].tools_for(front[0].create_session(project.id, "Boss").id)
        front[0].post(bob, "work long")
        assert first.wait(20)
        worker.crash()  # dies before its next tick reads any request
        # From the database the dead worker's row still looks like a running turn.
        assert boss.agent_stop(bob)["status"] == "stop_requested"
        die.set()
        after = Runtime(db=db_url, brain=brain, clock=SystemClock()).start()
        wait_for(lambda: front[0].inbox(target=bob)[0]["status"] == "delivered", 30,
                 what="the takeover's commit")
        assert stopped == [False]
        assert [e.text for e in front[0].transcript(bob)][-1] == "done"
    finally:
        die.set()
        if after is not None:
            after.stop()
        front[0].stop()


def test_a_request_for_a_cron_turn_that_died_never_stops_the_run_taken_over(
        db_url: str) -> None:
    """The direct-turn analogue: the worker running a cron run's turn dies; a stop asked
    after that names the run (the mark the dead worker left). The next worker ends the
    dead mark and takes the run over, whose turn carries the same id: the request
    lingered and stopped it as it began (its brain ended on the stop)."""
    brain, worker, front = _dying_worker(db_url)
    first, die, stopped = brain.first, brain.die, brain.stopped
    after: Runtime | None = None
    try:
        job = front[0].cron.add("digest", "0 0 1 1 *", "write the digest")
        worker.cron.trigger(job["job_id"])
        assert first.wait(30)
        session = session_id_for(job["job_id"])
        project = front[0].session(session).project_id
        boss = front[0].tools_for(front[0].create_session(project, "Boss").id)
        worker.crash()  # dies before its next tick reads any request
        assert boss.agent_stop(session)["status"] == "stop_requested"  # the dead mark
        die.set()
        after = Runtime(db=db_url, brain=brain, clock=SystemClock()).start()
        wait_for(lambda: [r["status"] for r in front[0].cron.runs(job["job_id"])]
                 == ["success"], 30, what="the taken-over run's commit")
        assert stopped == [False]
    finally:
        die.set()
        if after is not None:
            after.stop()
        front[0].stop()
