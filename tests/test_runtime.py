"""The runtime end to end: delivery, retries, passivation, rehydration, steering."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pykka
import pytest

from kinbox.actors import (
    ConfigError,
    IdleTimeout,
    KinboxError,
    ManualClock,
    Runtime,
    RuntimeStateError,
    Turn,
)
from kinbox.actors import slots as slots_module
from kinbox.actors.context import TurnEffects
from kinbox.actors.services import Services
from kinbox.persistence import (
    DatabaseFailed,
    DatabaseInUse,
    DatabaseOpenError,
    Journal,
    NewMessage,
)
from kinbox.persistence.driver_errors import OperationalError
from kinbox.transport.identity import SEAL_NONCE_BYTES, DeviceIdentity

from .conftest import Stores
from .helpers import failing_once, quiet_brain, wait_for

MakeRuntime = Callable[..., Runtime]


def recorder() -> tuple[list[tuple[str, str]], Callable[[Turn], None]]:
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            for m in turn.messages:
                seen.append((turn.session_id, m.content))
        turn.reply(f"ack {turn.messages[0].content}")
    return seen, brain


def two_sessions(rt: Runtime) -> tuple[str, str]:
    project = rt.create_project("p")
    return (rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id)


def test_a_sent_message_runs_one_turn_and_lands_in_the_transcript(
        make_runtime: MakeRuntime) -> None:
    seen, brain = recorder()
    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    receipt = rt.tools_for(a).agent_send(b, "  hello  ")
    assert receipt["agent_id"] == b and receipt["status"] == "pending"
    assert rt.inbox()[0]["status"] in ("pending", "processing", "delivered")  # committed at once
    rt.run_until_idle()
    assert seen == [(b, "hello")]
    assert [(e.role, e.text, e.visible) for e in rt.transcript(b)] == [
        ("user", "hello", True), ("assistant", "ack hello", True)]
    assert rt.inbox()[0]["sender_chat_id"] == a
    assert rt.marker_counts() == {receipt["message_id"]: 1}


def test_messages_to_one_target_run_in_order_and_targets_run_concurrently(
        make_runtime: MakeRuntime) -> None:
    running: set[str] = set()
    overlap = threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def brain(turn: Turn) -> None:
        with lock:
            running.add(turn.session_id)
            order.append(turn.messages[0].content)
            if len(running) > 1:
                overlap.set()
        overlap.wait(20)  # both targets' turns must be able to run at the same time
        with lock:
            running.discard(turn.session_id)

    rt = make_runtime(brain=brain)
    project = rt.create_project("p")
    sender = rt.create_session(project.id, "S").id
    x, y = rt.create_session(project.id, "X").id, rt.create_session(project.id, "Y").id
    for i in range(5):
        rt.post(x, f"x{i}", sender=sender)
        rt.post(y, f"y{i}", sender=sender)
    rt.run_until_idle(30)
    assert overlap.is_set()
    assert [o for o in order if o[0] == "x"] == [f"x{i}" for i in range(5)]
    assert [o for o in order if o[0] == "y"] == [f"y{i}" for i in range(5)]


def test_a_failing_brain_is_retried_with_backoff_on_the_injected_clock(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    calls: list[float] = []

    def brain(turn: Turn) -> None:
        calls.append(clock.now())
        if len(calls) <= 2:
            raise RuntimeError("model timeout")
        turn.reply("finally")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    rt.post(b, "work", sender=a)
    rt.run_until_idle()
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    # The attempt keeps its whole traceback, down to the brain's own frame.
    assert row["last_error"].startswith("Traceback (most recent call last):")
    assert 'test_runtime.py", line' in row["last_error"]
    assert row["last_error"].rstrip().endswith("RuntimeError: model timeout")
    clock.advance(1.9)
    rt.run_until_idle()
    assert len(calls) == 1
    clock.advance(0.1)
    rt.run_until_idle()
    assert len(calls) == 2
    clock.advance(4)
    rt.run_until_idle()
    assert rt.inbox()[0]["status"] == "delivered"
    assert [c - calls[0] for c in calls] == [0, 2, 6]


def test_five_failures_make_a_row_failed_and_requeue_delivers_it(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    broken = threading.Event()
    broken.set()

    def brain(turn: Turn) -> None:
        if broken.is_set():
            raise ValueError("bad tool output")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    mid = rt.post(b, "work", sender=a).message_id
    for delay in (0, 2, 4, 8, 16):
        clock.advance(delay)
        rt.run_until_idle()
    assert rt.inbox()[0]["status"] == "failed"
    broken.clear()
    rt.requeue(mid)
    rt.run_until_idle()
    assert rt.inbox()[0]["status"] == "delivered"
    assert rt.marker_counts() == {mid: 1}


def test_idle_session_actors_are_passivated_so_live_actors_stay_bounded(
        make_runtime: MakeRuntime) -> None:
    seen, brain = recorder()
    rt = make_runtime(brain=brain, max_active_sessions=2, max_live_sessions=3)
    project = rt.create_project("p")
    ids = [rt.create_session(project.id, f"S{i}").id for i in range(12)]
    for sid in ids:
        for k in range(2):
            rt.post(sid, f"{sid}-{k}")
    rt.run_until_idle(30)
    stats = rt.statistics()
    assert len(seen) == 24
    assert stats["peak_live"] <= 3
    assert stats["passivations"] >= 9
    assert stats["activations"] >= 12
    # a passivated session is re-activated on demand
    rt.post(ids[0], "again")
    rt.run_until_idle()
    assert seen[-1] == (ids[0], "again")


def test_threads_stay_at_the_pool_size_however_many_sessions_run(
        make_runtime: MakeRuntime) -> None:
    counts: list[int] = []
    rt = make_runtime(brain=lambda turn: counts.append(threading.active_count()),
                      max_active_sessions=3)
    started_with = threading.active_count()  # the pool's threads start with the runtime
    project = rt.create_project("p")
    ids = [rt.create_session(project.id, f"S{i}").id for i in range(40)]
    for sid in ids:
        rt.post(sid, "hello")
    rt.run_until_idle(30)
    assert len(counts) == 40
    assert rt.statistics()["peak_live"] == 40  # every session's actor is alive...
    assert max(counts) <= started_with  # ...and none of them added a thread


def test_start_replays_exactly_the_unacknowledged_rows_in_order(db_url: str,
                                                                clock: ManualClock) -> None:
    prepared = Stores(db_url)
    for i in range(3):
        prepared.store.create_session(f"s{i}", None, f"S{i}", "interactive", 0)
    j = prepared.journal
    j.enqueue(NewMessage("done", "s0", "old news"), 0)
    j.claim("dead-worker", 0)
    j.complete_turn("dead-worker", "s0", ["done"], [], 0)
    for i in range(4):
        j.enqueue(NewMessage(f"s0-{i}", "s0", f"s0 #{i}"), 1)
        j.enqueue(NewMessage(f"s1-{i}", "s1", f"s1 #{i}"), 1)
    j.claim("dead-worker", 1, lease=10_000)  # in flight when the old process died
    prepared.close()

    seen, brain = recorder()
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        rt.run_until_idle()
        assert [c for s, c in seen if s == "s0"] == [f"s0 #{i}" for i in range(4)]
        assert [c for s, c in seen if s == "s1"] == [f"s1 #{i}" for i in range(4)]
        assert "old news" not in [c for _, c in seen]
        assert set(rt.marker_counts().values()) == {1}


@pytest.mark.timeout(60)
def test_a_turn_that_runs_while_the_runtime_starts_has_its_tools(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dispatcher claims as soon as it runs, while the rest of start() goes on (the
    peer links, the services; slow on a loaded machine). A replayed turn that asked for
    its tools then was refused, "the runtime is not started", and failed into a backoff:
    after a deploy, the parent that had waited for a foreground child took its restart's
    turn as a failure, and the child's result waited behind it."""
    laptop = DeviceIdentity.from_seed(bytes(32))
    with Runtime(db=db_url, clock=clock) as first:  # send-only: the row waits for the start
        me = first.peers.identity
        first.peers.peers.save_outbound(  # a paired device: the tools list it after sessions
            laptop.device_id, "laptop", laptop.public_key, "http://127.0.0.1:9",
            me.seal("token", bytes(SEAL_NONCE_BYTES)), frozenset({"agent"}), clock.now())
        first.create_session(None, "S0", session_id="s0")
        first.post("s0", "hello", message_id="m1")
    asked = threading.Event()
    answers: list[object] = []

    def brain(turn: Turn) -> None:
        try:
            answers.append([a["agent_id"] for a in turn.tools.agent_list()["agents"]])
        except KinboxError as exc:
            answers.append(exc)
        finally:
            asked.set()

    real_start = Services.start

    def slow_start(services: Services, **options: Any) -> None:  # the turn runs meanwhile
        services.cron.ctx.wake_dispatcher()
        assert asked.wait(20), "no turn ran while the runtime started"
        real_start(services, **options)

    monkeypatch.setattr(Services, "start", slow_start)
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        rt.run_until_idle()
        assert answers == [["s0", f"peer:{laptop.device_id}"]]
        assert rt.context.journal.get("m1")["status"] == "delivered"


def test_rows_taken_over_after_a_crash_run_back_to_back_not_one_per_tick(
        db_url: str, clock: ManualClock) -> None:
    prepared = Stores(db_url)
    for i in range(4):
        prepared.store.create_session(f"s{i}", None, f"S{i}", "interactive", 0)
        prepared.journal.enqueue(NewMessage(f"m{i}", f"s{i}", f"#{i}"), 1)
    assert len(prepared.journal.claim("dead-worker", 1, lease=10_000).rows) == 4
    prepared.close()
    # Taken-over rows run one at a time; with no tick in the test's time (and no
    # run_until_idle, which nudges), each must start the next when it is done.
    seen, brain = recorder()
    rt = Runtime(db=db_url, brain=brain, clock=clock, tick_interval=3600,
                 lease_seconds=4 * 3600).start()
    try:
        wait_for(lambda: len(seen) == 4, timeout=20, what="the four taken-over rows to run")
        assert sorted(c for _, c in seen) == ["#0", "#1", "#2", "#3"]
    finally:
        rt.stop()


def test_suspects_held_back_behind_one_that_fails_at_its_takeover_still_run(
        db_url: str, clock: ManualClock) -> None:
    prepared = Stores(db_url)
    j = prepared.journal
    # The oldest row had started its last allowed attempt: its takeover fails it.
    j.enqueue(NewMessage("poison", "s0", "boom", max_attempts=1), 1)
    for i in range(1, 4):
        j.enqueue(NewMessage(f"m{i}", f"s{i}", f"#{i}"), 1)
    assert len(j.claim("dead-worker", 1, lease=10_000).rows) == 4
    j.mark_turn_started("dead-worker", "poison", 1)
    prepared.close()
    seen, brain = recorder()
    rt = Runtime(db=db_url, brain=brain, clock=clock, tick_interval=3600,
                 lease_seconds=4 * 3600).start()
    try:
        wait_for(lambda: len(seen) == 3, timeout=20, what="the three other rows to run")
        assert sorted(c for _, c in seen) == ["#1", "#2", "#3"]
        assert rt.inbox(state="failed")[0]["message_id"] == "poison"
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_suspects_filling_a_claim_do_not_hold_back_a_fresh_row_behind_them(
        db_url: str, clock: ManualClock) -> None:
    """Rows taken over from a dead worker (suspects) run one at a time; the other due
    heads must not wait for them. On SQLite the claim read the due heads of both states
    oldest first, as many as it had room for, and then left the suspects past the first
    out: with as many suspects as free slots, older than a fresh row, that row was never
    read, and waited until the suspects had run one by one (here, for ever)."""
    prepared = Stores(db_url)
    j = prepared.journal
    for i in range(8):
        j.enqueue(NewMessage(f"m{i}", f"dead{i}", f"#{i}"), 1)
    assert len(j.claim("dead-worker", 1, lease=10_000).rows) == 8
    j.enqueue(NewMessage("fresh", "idle", "fresh"), 2)
    prepared.close()
    hold = threading.Event()
    seen: list[str] = []

    def brain(turn: Turn) -> None:
        seen.append(turn.messages[0].content)
        if turn.session_id.startswith("dead"):
            hold.wait(30)  # the one running suspect takes its time
        turn.reply("ok")

    rt = Runtime(db=db_url, brain=brain, clock=clock, max_active_sessions=4).start()
    try:
        wait_for(lambda: "fresh" in seen, timeout=20, what="the fresh row to run")
        wait_for(lambda: any(c.startswith("#") for c in seen), timeout=20,
                 what="a suspect to run")
        assert len([c for c in seen if c.startswith("#")]) == 1  # one suspect at a time
        hold.set()
        rt.run_until_idle(30)
        assert sorted(seen) == sorted(["fresh", *(f"#{i}" for i in range(8))])
    finally:
        hold.set()
        rt.stop()


def test_a_suspect_whose_actor_fails_to_start_runs_once_its_lease_runs_out(
        db_url: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = Stores(db_url)
    prepared.store.create_session("s0", None, "S0", "interactive", 0)
    prepared.journal.enqueue(NewMessage("m0", "s0", "#0"), 1)
    assert len(prepared.journal.claim("dead-worker", 1, lease=10_000).rows) == 1
    prepared.close()
    failures: list[str] = []
    monkeypatch.setattr(slots_module.SessionActor, "start", failing_once(
        slots_module.SessionActor.start, RuntimeError("no actor today"), failures, "start"))
    seen, brain = recorder()
    rt = Runtime(db=db_url, brain=brain, clock=clock, lease_seconds=5).start()
    try:
        wait_for(lambda: bool(failures), what="the taken-over row's actor to fail to start")
        clock.advance(6)  # the lease of the row that never started runs out
        rt.run_until_idle(10)  # it is the suspect no more: the next claim takes it
        assert seen == [("s0", "#0")]
    finally:
        rt.stop()


def test_a_crash_mid_turn_reruns_that_message_once_after_restart(db_url: str,
                                                                 clock: ManualClock) -> None:
    in_turn = threading.Event()
    release = threading.Event()
    runs: list[str] = []

    def brain(turn: Turn) -> None:
        runs.append(turn.messages[0].content)
        if len(runs) == 1:
            in_turn.set()
            release.wait(10)
        turn.reply("done")

    rt = Runtime(db=db_url, brain=brain, clock=clock).start()
    a, b = two_sessions(rt)
    rt.post(b, "important", sender=a)
    assert in_turn.wait(10)
    rt.crash()
    release.set()  # the old turn finishes after the crash: its commit must not land
    with Runtime(db=db_url, brain=brain, clock=clock) as rt2:
        rt2.run_until_idle()
        assert runs == ["important", "important"]
        assert list(rt2.marker_counts().values()) == [1]
        assert [e.text for e in rt2.transcript(b)] == ["important", "done"]


class _WitnessFlag(threading.Event):
    """A runtime's crash flag that notes, as it is raised, whether its writer still
    accepted writes (a test seam: the runtime reads ``ctx.crashed`` and ``ctx.closed``)."""

    def __init__(self, writer_closed: Callable[[], bool]) -> None:
        super().__init__()
        self.writer_closed = writer_closed
        self.saw: list[bool] = []

    def set(self) -> None:
        self.saw.append(self.writer_closed())
        super().set()


@pytest.mark.timeout(60)
def test_a_turn_that_notices_the_crash_writes_no_failed_attempt_after_it(
        any_db_url: str, clock: ManualClock) -> None:
    # Found by tests/test_marker_forging.py on PostgreSQL (1 run in ~35): a turn whose
    # tool call met the crashed runtime failed, and its failed attempt (with a backoff
    # the injected clock never ends) was committed while crash() was still shutting
    # down, so the restarted runtime found the session's head in backoff and went idle.
    in_turn = threading.Event()
    first: list[Runtime] = []
    failed: list[BaseException] = []

    def brain(turn: Turn) -> None:
        if first and first[0].state == "running":  # the first runtime: crash, then a tool
            in_turn.set()
            assert first[0].context.crashed.wait(10)
            try:
                turn.tools.agent_send(turn.session_id, "after the crash")
            except Exception as exc:  # the tools refuse: the runtime is crashed
                failed.append(exc)
                raise
        turn.reply("done")

    rt = Runtime(db=any_db_url, brain=brain, clock=clock).start()
    first.append(rt)
    writer = rt.context.journal.writer
    flags = [_WitnessFlag(lambda: writer.closed) for _ in range(2)]
    rt.context.crashed, rt.context.closed = flags
    a, b = two_sessions(rt)
    rt.post(b, "important", sender=a)
    assert in_turn.wait(10)
    rt.crash()
    # Nothing can notice the crash while the writer still takes writes.
    assert [f.saw for f in flags] == [[True], [True]]
    wait_for(lambda: bool(failed), 10, "the old turn to fail after the crash")
    with Runtime(db=any_db_url, brain=brain, clock=clock) as rt2:
        rt2.run_until_idle(timeout=30)  # the clock never moves: no backoff may be pending
        [row] = rt2.inbox(target=b)
        assert (row["status"], row["attempts"]) == ("delivered", 0)
        assert [e.text for e in rt2.transcript(b)] == ["important", "done"]


def test_a_turn_sees_messages_that_arrive_while_it_runs(make_runtime: MakeRuntime) -> None:
    started = threading.Event()
    steered: list[str] = []
    turns: list[str] = []

    def brain(turn: Turn) -> None:
        turns.append(turn.messages[0].content)
        if turn.messages[0].content != "first":
            return
        started.set()
        wait_for(lambda: bool(steered.extend(m.content for m in turn.steering()) or steered),
                 what="the steering message")
        turn.reply("saw it")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    rt.post(b, "first", sender=a)
    assert started.wait(10)
    second = rt.tools_for(a).agent_send(b, "second")
    rt.run_until_idle()
    assert steered == ["second"] and turns == ["first"]
    assert [e.text for e in rt.transcript(b)] == ["first", "second", "saw it"]
    assert rt.marker_counts()[second["message_id"]] == 1


@pytest.mark.timeout(30)
def test_a_turn_whose_row_was_taken_over_hands_its_steered_rows_back(
        make_runtime: MakeRuntime) -> None:
    """Its commit is refused (another worker holds its row now); the rows steering leased
    into it are still this runtime's, and nothing renews them once the run is over: left
    leased, they waited a whole lease and were then taken over as suspects."""
    steered: list[str] = []
    took: list[str] = []
    holder: list[Runtime] = []

    def brain(turn: Turn) -> None:
        if turn.messages[0].content != "first":
            return
        wait_for(lambda: bool(steered.extend(m.content for m in turn.steering()) or steered),
                 what="the steering message")
        rt = holder[0]
        m = rt.context.journal.t.inbox
        # Another worker takes the turn's own row over (its lease ran out, say).
        rt.context.journal.writer.call(lambda: m.update(lease_owner="another-worker").where(
            m.message_id == turn.messages[0].message_id).execute())
        took.append(turn.messages[0].message_id)
        turn.reply("never committed")

    rt = make_runtime(brain=brain)
    holder.append(rt)
    lost: list[dict[str, Any]] = []
    rt.subscribe(lambda event, data: lost.append(data) if event == "lease_lost" else None)
    a, b = two_sessions(rt)
    rt.post(b, "first", sender=a)
    rt.post(b, "second", sender=a)
    wait_for(lambda: bool(lost) and rt.statistics()["busy"] == 0, what="the refused commit")
    assert steered == ["second"] and [e.text for e in rt.transcript(b)] == []
    rows = {r["content"]: r for r in rt.inbox()}
    assert rows["first"]["lease_owner"] == "another-worker"
    assert (rows["second"]["status"], rows["second"]["lease_owner"]) == ("pending", None)


def test_leases_are_renewed_while_a_long_turn_runs(make_runtime: MakeRuntime,
                                                   clock: ManualClock) -> None:
    started, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        release.wait(10)

    rt = make_runtime(brain=brain, lease_seconds=30)
    a, b = two_sessions(rt)
    rt.post(b, "slow", sender=a)
    assert started.wait(10)
    first = rt.inbox()[0]["lease_until"]
    clock.advance(20)
    wait_for(lambda: rt.inbox()[0]["lease_until"] > first, what="a renewed lease")
    assert rt.inbox()[0]["lease_until"] == clock.now() + 30
    release.set()
    rt.run_until_idle()


def test_run_until_idle_times_out_while_a_turn_is_stuck(make_runtime: MakeRuntime) -> None:
    release = threading.Event()
    rt = make_runtime(brain=lambda turn: release.wait(10))
    a, b = two_sessions(rt)
    rt.post(b, "x", sender=a)
    with pytest.raises(IdleTimeout) as info:
        rt.run_until_idle(timeout=0.3)
    assert info.value.statistics["busy"] == 1
    release.set()
    rt.run_until_idle()


def test_concurrent_sends_are_committed_in_shared_batches(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=quiet_brain)
    a, b = two_sessions(rt)
    tools = rt.tools_for(a)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: tools.agent_send(b, f"m{i}"), range(200)))
    rt.run_until_idle()
    assert rt.statistics()["writer"]["largest_batch"] > 1
    assert rt.statistics()["rows"] == {"delivered": 200}


def test_a_stopped_runtime_refuses_work_with_a_clear_error(make_runtime: MakeRuntime) -> None:
    rt = make_runtime()
    a, b = two_sessions(rt)
    tools = rt.tools_for(a)
    rt.stop()
    with pytest.raises(RuntimeStateError, match="stopped"):
        rt.post(b, "late")
    with pytest.raises(RuntimeStateError):
        tools.agent_send(b, "late")
    with pytest.raises(RuntimeStateError, match="starts once"):
        rt.start()


def test_a_second_runtime_on_the_same_sqlite_file_is_refused(make_runtime: MakeRuntime,
                                                              db_url: str) -> None:
    make_runtime(brain=quiet_brain)
    with pytest.raises(DatabaseInUse) as refused:
        Runtime(db=db_url, brain=quiet_brain).start()
    assert refused.value.path == db_url.removeprefix("sqlite:///")
    assert isinstance(refused.value, KinboxError)


def test_a_start_whose_last_reads_fail_leaves_nothing_running(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's last reads (the open rows it logs, the child tasks it reports) ran after
    the runtime said ``running``: a database failing there raised from start() with the
    dispatcher, the writer and the file's lock left running, and no caller to stop them."""
    def failing(self: Journal) -> dict[str, int]:
        raise DatabaseFailed("the database went away")
    monkeypatch.setattr(Journal, "counts", failing)
    before = set(threading.enumerate())
    rt = Runtime(db=db_url, brain=quiet_brain)
    with pytest.raises(DatabaseFailed):
        rt.start()
    assert rt.state == "new"
    wait_for(lambda: not [t for t in set(threading.enumerate()) - before
                          if not t.daemon or t.name.startswith("kinbox")],
             what="the failed start's threads to end")
    monkeypatch.undo()
    Runtime(db=db_url, brain=quiet_brain).start().stop()  # the file's lock was let go


def test_a_lock_file_that_cannot_be_made_is_a_database_open_error_naming_it(
        tmp_path: Path) -> None:
    """The lock beside the file could not be opened (here a folder in its place; a folder
    the user may not write): a bare ``IsADirectoryError`` / ``PermissionError`` escaped,
    outside kinbox's exception tree and naming no lock."""
    db = tmp_path / "kinbox.db"
    (tmp_path / "kinbox.db.lock").mkdir()
    rt = Runtime(db=f"sqlite:///{db}", brain=quiet_brain)
    with pytest.raises(DatabaseOpenError) as refused:
        rt.start()
    assert "kinbox.db.lock" in refused.value.reason
    assert rt.state == "new"


def test_a_second_runtime_reaching_the_file_through_a_symlink_is_refused(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    real = tmp_path / "real" / "kinbox.db"
    make_runtime(db=f"sqlite:///{real}", brain=quiet_brain)
    link = tmp_path / "link.db"
    link.symlink_to(real)
    with pytest.raises(DatabaseInUse):
        Runtime(db=f"sqlite:///{link}", brain=quiet_brain).start()


def test_a_sqlite_file_with_a_second_name_by_a_hard_link_is_refused(
        make_runtime: MakeRuntime, tmp_path: Path) -> None:
    # A second name would get a lock of its own, and SQLite a WAL of its own: two runtimes
    # delivering from one file, or one not seeing what the other committed.
    real = tmp_path / "real" / "kinbox.db"
    make_runtime(db=f"sqlite:///{real}", brain=quiet_brain)
    link = tmp_path / "link.db"
    link.hardlink_to(real)
    with pytest.raises(DatabaseOpenError) as refused:
        Runtime(db=f"sqlite:///{link}", brain=quiet_brain).start()
    assert "hard link" in str(refused.value)
    assert not (tmp_path / "link.db-wal").exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"max_active_sessions": 0}, "max_active_sessions must be an integer >= 1, got 0"),
    ({"max_live_sessions": "many"}, "max_live_sessions must be an integer >= 1, got 'many'"),
    ({"lease_seconds": 0}, "lease_seconds must be a number of seconds > 0, got 0"),
    ({"idle_ttl": "1"}, "idle_ttl must be a number of seconds > 0, got '1'"),
    ({"tick_interval": None}, "tick_interval must be a number of seconds > 0, got None"),
    ({"tick_interval": float("inf")}, "tick_interval must be a number of seconds > 0"),
    ({"turn_timeout": float("nan")}, "turn_timeout must be a number of seconds > 0"),
    ({"stop_grace": float("inf")}, "stop_grace must be a number of seconds > 0"),
    # An int no float holds: math.isfinite raised OverflowError past the check.
    ({"lease_seconds": 10**400}, "lease_seconds must be a number of seconds > 0"),
    ({"db": 123}, "db must be a database URL string, got int"),
    ({"data_dir": 123}, "data_dir must be a path, got int"),
    ({"clock": "x"}, "clock must have a now()"),
    ({"ids": "x"}, "ids must be callable"),
    ({"brain": "not callable"}, "brain must be callable"),
    ({"max_live_sessions": 2, "max_active_sessions": 4},
     "max_live_sessions (2) must be >= max_active_sessions (4)"),
])
def test_bad_runtime_options_are_refused_before_anything_starts(
        db_url: str, options: dict[str, object], message: str) -> None:
    """Each is a ConfigError naming its option (a string where a number goes used to be a
    TypeError, an infinite tick interval killed the ticker thread after the start)."""
    with pytest.raises(ConfigError) as caught:
        Runtime(**{"db": db_url, **options})  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert caught.value.field == next(iter(options))


def test_an_unexpected_error_in_the_dispatcher_does_not_stop_delivery(
        make_runtime: MakeRuntime) -> None:
    seen, brain = recorder()
    rt = make_runtime(brain=brain)
    journal = rt.context.journal
    failures: list[str] = []
    journal.claim = failing_once(  # type: ignore[method-assign]
        journal.claim, RuntimeError("a bug in a claim"), failures, "claim")
    _, b = two_sessions(rt)
    rt.post(b, "still delivered")
    rt.run_until_idle(10)
    assert failures == ["claim"]
    assert seen == [(b, "still delivered")]


def test_a_delivery_that_fails_outside_its_brain_comes_back_by_lease(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    seen, brain = recorder()
    rt = make_runtime(brain=brain, lease_seconds=5)
    broken: list[str] = []

    def outbox_failing_once(ctx: Any, turn: Turn, outcome: Any) -> Any:
        if not broken:
            broken.append(turn.session_id)
            raise RuntimeError("a bug after the turn, before its commit")
        return TurnEffects()

    rt.context.outbox_hooks.append(outbox_failing_once)
    _, b = two_sessions(rt)
    rt.post(b, "hello")
    wait_for(lambda: bool(broken), what="the failing hook to run")
    slots = rt.context.slots
    assert slots is not None
    actor = slots.live[b]
    # Once the failed run let go of its session: a clock moved while it still held it
    # renews the row's lease (as for any running turn), and the row would wait for that.
    wait_for(lambda: b not in slots.held(), what="the failed run to end")
    clock.advance(6)  # the failed run's lease runs out; the row is claimed again
    rt.run_until_idle(10)
    assert seen == [(b, "hello"), (b, "hello")]  # the first run never committed
    assert rt.marker_counts() == {rt.inbox()[0]["message_id"]: 1}
    assert slots.live[b] is actor and actor.is_alive()  # the same actor lived on


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_commit_the_journal_always_refuses_is_a_failed_attempt_not_a_hot_loop(
        make_runtime: MakeRuntime, clock: ManualClock, kind: str) -> None:
    """A commit the database refuses every time (a value it will not store, a hook's write
    that conflicts) handed its rows straight back: the brain, a model call, ran again at
    once, for ever, and the row never left ``processing``. Each refusal is a failed
    attempt now: the row waits out its backoff (2, 4, 8, 16 s), then is ``failed``."""
    seen, sync_brain = recorder()

    async def async_brain(turn: Turn) -> None:
        sync_brain(turn)

    rt = make_runtime(brain=sync_brain if kind == "sync" else async_brain)

    def refusing(ctx: Any, turn: Turn, outcome: Any) -> Any:
        def op() -> None:
            raise OperationalError("value too long for type character varying(64)")
        return TurnEffects(ops=[op]) if outcome.ok else None

    rt.context.outbox_hooks.append(refusing)
    _, b = two_sessions(rt)
    rt.post(b, "hello")
    for attempt, backoff in enumerate((2.0, 4.0, 8.0, 16.0), start=1):
        wait_for(lambda attempt=attempt: rt.inbox()[0]["attempts"] == attempt, 10,
                 f"failed attempt {attempt} recorded ({len(seen)} turns ran)")
        row = rt.inbox()[0]
        assert row["status"] == "pending" and "value too long" in row["last_error"]
        assert len(seen) == attempt  # nothing runs it again before its backoff ends
        clock.advance(backoff)
    wait_for(lambda: rt.inbox()[0]["status"] == "failed", 10, "the row failed")
    assert len(seen) == 5 and rt.transcript(b) == []


class _StoppedActorRef:
    """A session actor's ref that stopped just after the slot table picked it."""

    def is_alive(self) -> bool:
        return True  # it was alive when the table looked

    def tell(self, message: object) -> None:
        raise pykka.ActorDeadError("stopped")

    def stop(self, block: bool = True) -> None:
        pass


def test_a_row_for_an_actor_that_stopped_under_the_table_is_handed_back(
        make_runtime: MakeRuntime) -> None:
    seen, brain = recorder()
    rt = make_runtime(brain=brain)
    _, b = two_sessions(rt)
    rt.post(b, "first")
    rt.run_until_idle(10)
    slots = rt.context.slots
    assert slots is not None
    slots.live[b] = _StoppedActorRef()  # type: ignore[assignment]
    rt.post(b, "second")  # its turn is started on the stopped actor: the tell fails
    rt.run_until_idle(10)  # the slot is freed and the row claimed again, on a new actor
    assert seen == [(b, "first"), (b, "second")]
    assert rt.statistics()["busy"] == 0 and len(rt.inbox(state="delivered")) == 2


def test_a_turn_ending_while_the_runtime_stops_leases_no_next_row(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its next row could not run here: leased by the commit, it would only be handed back.
    asked: list[tuple[str, object]] = []
    submit_turn, release = Journal.submit_turn, Journal.release

    def seen_submit(self: Journal, *args: Any, **kwargs: Any) -> Any:
        asked.append(("commit", kwargs.get("next_lease")))
        return submit_turn(self, *args, **kwargs)

    def seen_release(self: Journal, owner: str, ids: Any, now: float) -> None:
        asked.append(("release", list(ids)))
        release(self, owner, ids, now)

    monkeypatch.setattr(Journal, "submit_turn", seen_submit)
    monkeypatch.setattr(Journal, "release", seen_release)
    running, finish = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        running.set()
        assert finish.wait(10)
        turn.reply("done")

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    rt.post(b, "one", sender=a)
    assert running.wait(10)
    second = rt.post(b, "two", sender=a).message_id
    stopping = threading.Thread(target=rt.stop)
    stopping.start()
    wait_for(rt.context.closed.is_set, what="the runtime to start stopping")
    finish.set()
    stopping.join(20)
    assert asked == [("commit", None)]  # the turn committed; nothing leased, nothing released
    again = make_runtime(brain=quiet_brain)  # the second message waits for the next start
    again.run_until_idle()
    assert [r["message_id"] for r in again.inbox(state="delivered")][-1] == second


@pytest.mark.timeout(60)
def test_a_stop_past_its_timeout_still_ends_the_runtime_and_frees_the_database(
        db_url: str, clock: ManualClock) -> None:
    """A sync turn that ignores its stop outlived ``stop(timeout)``: pykka's Timeout came
    out of stop, the runtime was left half-stopped, and the SQLite file stayed locked."""
    started, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        release.wait(20)  # a model call that does not look at the stop flag

    rt = Runtime(db=db_url, brain=brain, clock=clock).start()
    rt.post(rt.create_session(rt.create_project("p").id, "A").id, "go")
    assert started.wait(10)
    try:
        rt.stop(timeout=1)
        assert rt.state == "stopped"
        Runtime(db=db_url, brain=lambda turn: None, clock=clock).start().stop()
    finally:
        release.set()


@pytest.mark.timeout(60)
def test_health_answers_within_its_timeout_while_the_database_hangs(
        pg_url: str, tmp_path: Any) -> None:
    """A table locked by a migration (or a network that drops packets): the database
    read of health() had no deadline, so health(timeout=2), and /healthz with it, hung
    for as long as the database did instead of saying it is unhealthy."""
    import psycopg2

    rt = Runtime(db=pg_url, data_dir=str(tmp_path), brain=lambda turn: None).start()
    other = psycopg2.connect(pg_url)
    try:
        with other.cursor() as cur:  # what ALTER TABLE or VACUUM FULL takes
            cur.execute("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
        answers: list[dict[str, Any]] = []
        asking = threading.Thread(target=lambda: answers.append(rt.health(timeout=2.0)),
                                  daemon=True)
        asking.start()
        asking.join(10)
        assert answers, "health(timeout=2) did not answer within 10 s"
        assert not answers[0]["healthy"]
        assert "TimeoutError" in answers[0]["checks"]["database"]["error"]
        other.rollback()  # the lock goes: the next look is healthy again
        wait_for(lambda: rt.health(timeout=2.0)["healthy"], timeout=20, what="healthy again")
    finally:
        other.close()
        rt.stop()


def deaf_brain() -> tuple[Callable[[Turn], None], set[str], threading.Event]:
    """A sync brain whose turns ignore their stop until ``release`` is set (a model call
    that does not look at the flag), the sessions it started turns of, and ``release``."""
    release = threading.Event()
    started: set[str] = set()

    def brain(turn: Turn) -> None:
        started.add(turn.session_id)
        release.wait(30)

    return brain, started, release


@pytest.mark.timeout(60)
def test_a_stop_waits_for_deaf_session_actors_once_and_names_them(
        db_url: str, clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    """Each session actor still running a turn deaf to its stop was given 30 s of its
    own, one after the other (three such turns held the stop for 90 s), and the warning
    said only "a session actor did not stop in time", once each, naming none."""
    import time

    brain, started, release = deaf_brain()
    rt = Runtime(db=db_url, brain=brain, clock=clock).start()
    try:
        project = rt.create_project("p").id
        deaf = sorted(rt.create_session(project, f"S{i}").id for i in range(3))
        for session_id in deaf:
            rt.post(session_id, "go")
        wait_for(lambda: len(started) == 3, what="three turns to start")
        slots = rt.context.slots
        assert slots is not None
        began = time.monotonic()
        with caplog.at_level("WARNING", logger="kinbox.dispatcher"):
            lagging = slots.stop(timeout=3.0)
        # One deadline for all three, not 3 s each; the slack is a loaded machine's.
        assert time.monotonic() - began < 7.0
        assert sorted(lagging) == deaf
        assert all(session_id in caplog.text for session_id in deaf)
    finally:
        release.set()
        rt.stop()


@pytest.mark.timeout(60)
def test_a_stop_with_deaf_inbox_and_cron_turns_takes_its_timeout_once(
        db_url: str, clock: ManualClock) -> None:
    """``stop(timeout)`` gave each of its waits the whole timeout, one after the other:
    the direct turns (a cron run), then the session actors, then the writer. With a cron
    brain and an inbox brain both deaf to the stop, ``stop(timeout=5)`` took 10 s; the
    waits for turns now share one deadline (past it the dispatcher and the writer get a
    second each)."""
    import time

    brain, started, release = deaf_brain()
    rt = Runtime(db=db_url, brain=brain, clock=clock).start()
    try:
        project = rt.create_project("p").id
        rt.post(rt.create_session(project, "S").id, "go")
        rt.cron.trigger(rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"])
        wait_for(lambda: len(started) == 2, what="an inbox turn and a cron turn to start")
        began = time.monotonic()
        rt.stop(timeout=5.0)
        # 5 s once and a second's floor, not 5 s twice; the slack is a loaded machine's.
        assert time.monotonic() - began < 9.0
    finally:
        release.set()


@pytest.mark.timeout(60)
def test_run_until_idle_does_not_hammer_the_database_while_another_process_runs_a_turn(
        pg_url: str, tmp_path: Path) -> None:
    """A row another runtime is running keeps this one from being idle; each pass of
    ``run_until_idle`` asked for a claim, whose end woke the next pass at once: thousands
    of claims a second for as long as the other turn ran."""
    started, release = threading.Event(), threading.Event()

    def slow(turn: Turn) -> None:
        started.set()
        release.wait(30)

    other = Runtime(db=pg_url, brain=slow, data_dir=str(tmp_path / "a")).start()
    other.post(other.create_session(other.create_project("p").id, "A").id, "go")
    here: Runtime | None = None
    try:
        assert started.wait(10)
        here = Runtime(db=pg_url, brain=quiet_brain, data_dir=str(tmp_path / "b")).start()
        journal, claims = here.context.journal, []
        real_claim = journal.claim

        def claim(*args: Any, **kwargs: Any) -> Any:
            claims.append(1)
            return real_claim(*args, **kwargs)

        journal.claim = claim  # type: ignore[method-assign]
        with pytest.raises(IdleTimeout):
            here.run_until_idle(timeout=1.0)
        assert len(claims) <= 40, f"{len(claims)} claims in the 1 s wait"
    finally:
        release.set()
        if here is not None:
            here.stop()
        other.stop()


def test_every_folder_a_runtime_makes_is_its_users_alone(tmp_path: Path,
                                                         clock: ManualClock) -> None:
    """``mkdir(parents=True, mode=0o700)`` gave 0700 to the last folder only: the ones
    above it (a fresh ``$KINBOX_HOME``, say) took the umask's 0755, for anyone to list."""
    import stat

    top = tmp_path / "home"
    rt = Runtime(db=f"sqlite:///{top / 'a' / 'b' / 'kinbox.db'}", brain=quiet_brain,
                 clock=clock).start()
    rt.stop()  # its start made the database's folders and the data folder beside it
    made = [top, top / "a", top / "a" / "b", top / "a" / "b" / "kinbox-data"]
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in made} == {
        str(p): "0o700" for p in made}


@pytest.mark.timeout(60)
def test_a_post_or_session_too_long_for_its_column_is_refused_alike_on_both_backends(
        any_db_url: str, tmp_path: Path, clock: ManualClock) -> None:
    """SQLite stored a 65-character kind, a 257-character message id, a 129-character
    sender or session id; PostgreSQL failed the same call with a database error (value
    too long). Each is a ConfigError naming its field, on both, and nothing is written."""
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path / "data"), clock=clock).start()
    try:
        project = rt.create_project("p").id
        sid = rt.create_session(project, "S").id
        for field, options in (("kind", {"kind": "k" * 65}),
                               ("message_id", {"message_id": "m" * 257}),
                               ("sender", {"sender": "s" * 129})):
            with pytest.raises(ConfigError) as refused:
                rt.post(sid, "hello", **options)  # type: ignore[arg-type]
            assert refused.value.field == field
        with pytest.raises(ConfigError) as refused:
            rt.create_session(project, "T", session_id="x" * 129)
        assert refused.value.field == "session_id"
        assert rt.inbox() == []
        rt.post(sid, "hello", kind="k" * 64, message_id="m" * 256, sender="s" * 128)
        assert [r["message_id"] for r in rt.inbox()] == ["m" * 256]
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_a_project_name_too_long_for_its_column_is_refused_alike_on_both_backends(
        any_db_url: str, tmp_path: Path, clock: ManualClock) -> None:
    """A project's name was checked against a session title's limit (512 characters)
    while its column holds 256: SQLite stored a 300-character name, PostgreSQL failed the
    same call with a database error (value too long). It is a ConfigError naming the
    field on both, and no project is made; a name of 256 characters is taken."""
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path / "data"), clock=clock).start()
    try:
        with pytest.raises(ConfigError) as refused:
            rt.create_project("long", "n" * 257)
        assert refused.value.field == "name"
        assert rt.project("long") is None
        assert rt.create_project("long", "n" * 256).name == "n" * 256
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_a_payload_or_config_nested_too_deep_for_json_is_refused_at_the_call(
        any_db_url: str, tmp_path: Path, clock: ManualClock) -> None:
    """The call's check caught what ``json.dumps`` raises for a value it cannot write
    (TypeError, ValueError) but not its RecursionError: a payload or config nested
    deeper than the interpreter's recursion limit escaped ``rt.post`` and
    ``rt.create_session`` as a bare RecursionError, outside the runtime's errors. Each is
    a ConfigError naming its field, and nothing is written."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path / "data"), clock=clock).start()
    try:
        project = rt.create_project("p").id
        sid = rt.create_session(project, "S").id
        with pytest.raises(ConfigError) as refused:
            rt.post(sid, "hello", payload={"deep": deep})
        assert refused.value.field == "payload"
        with pytest.raises(ConfigError) as refused:
            rt.create_session(project, "T", config={"deep": deep})
        assert refused.value.field == "config"
        assert rt.inbox() == []
        assert [s.id for s in rt.sessions()] == [sid]
    finally:
        rt.stop()


@pytest.mark.timeout(60)
def test_a_payload_or_config_whose_keys_cannot_be_sorted_is_refused_at_the_call(
        any_db_url: str, tmp_path: Path, clock: ManualClock) -> None:
    """A payload or a session config is stored as JSON with its keys sorted; the call's
    check serialised it unsorted, so keys of two types (``{1: "a", "b": 2}``) passed it and
    the write raised a bare ``TypeError`` from the writer thread. Each is a ConfigError
    naming its field, and nothing is written."""
    rt = Runtime(db=any_db_url, data_dir=str(tmp_path / "data"), clock=clock).start()
    try:
        project = rt.create_project("p").id
        sid = rt.create_session(project, "S").id
        with pytest.raises(ConfigError) as refused:
            rt.post(sid, "hello", payload={1: "a", "b": 2})
        assert refused.value.field == "payload"
        with pytest.raises(ConfigError) as refused:
            rt.create_session(project, "T", config={1: "a", "b": 2})
        assert refused.value.field == "config"
        assert rt.inbox() == []
        assert [s.id for s in rt.sessions()] == [sid]
    finally:
        rt.stop()


@pytest.mark.timeout(120)
def test_a_payload_or_config_larger_than_the_limit_is_refused_at_the_call(
        any_db_url: str, tmp_path: Path, clock: ManualClock) -> None:
    """A session's config (read by every turn of the session) and a message's payload (read
    with its row at every claim) had no size limit: a config of megabytes was stored, and
    every turn read it back. Each is a ConfigError naming its field and the limit, nothing
    written; one at the limit is taken."""
    from kinbox.actors.validation import JSON_OBJECT_LIMIT

    rt = Runtime(db=any_db_url, data_dir=str(tmp_path / "data"), clock=clock).start()
    try:
        project = rt.create_project("p").id
        sid = rt.create_session(project, "S").id
        # {"k": "..."} as stored: 9 characters around the text.
        over = {"k": "x" * (JSON_OBJECT_LIMIT - 8)}
        with pytest.raises(ConfigError) as refused:
            rt.post(sid, "hello", payload=over)
        assert refused.value.field == "payload"
        assert f"{JSON_OBJECT_LIMIT:,}" in str(refused.value)
        with pytest.raises(ConfigError) as refused:
            rt.create_session(project, "T", config=over)
        assert refused.value.field == "config"
        assert f"{JSON_OBJECT_LIMIT:,}" in str(refused.value)
        assert rt.inbox() == []
        assert [s.id for s in rt.sessions()] == [sid]
        at_limit = {"k": "x" * (JSON_OBJECT_LIMIT - 9)}
        kept = rt.create_session(project, "U", config=at_limit).id
        assert rt.post(kept, "hello", payload=at_limit).created
    finally:
        rt.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("failing", ["services", "peers"])
def test_a_start_that_fails_late_leaves_no_thread_of_it_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """A start that failed after the dispatcher started (cron's first look met a database
    error, the device key could not be read) closed the writer and raised, but left the
    dispatcher, its 64 session threads and APScheduler running: a product retrying its
    start until the database came back gathered 66 threads a try."""
    from kinbox.actors import peers as peers_module

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("the disk went away")

    if failing == "services":
        monkeypatch.setattr(Services, "start", boom)
    else:
        monkeypatch.setattr(peers_module.PeerService, "start", boom)
    before = set(threading.enumerate())
    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=quiet_brain,
                 data_dir=tmp_path / "data")
    with pytest.raises(OSError, match="the disk went away"):
        rt.start()

    def left() -> list[str]:
        return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
    wait_for(lambda: not left(), timeout=20, what=f"the start's threads to end: {left()}")
    monkeypatch.undo()  # the disk is back
    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=quiet_brain,
                 data_dir=tmp_path / "data") as again:  # the file's lock was let go
        assert again.state == "running"


@pytest.mark.timeout(60)
def test_a_start_retried_after_a_late_failure_ticks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same runtime started again once the failure is over (the database came back):
    the failed start's wind-down had stopped its ticker, which never ticked again, and
    nothing renewed the leases of the turns the retried start ran."""
    real_start = Services.start
    tries: list[int] = []

    def fails_once(self: Services, *args: Any, **kwargs: Any) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("the disk went away")
        real_start(self, *args, **kwargs)

    monkeypatch.setattr(Services, "start", fails_once)
    rt = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=quiet_brain,
                 data_dir=tmp_path / "data", tick_interval=0.05)
    with pytest.raises(OSError, match="the disk went away"):
        rt.start()
    with rt:
        assert rt._ticker.running, "the retried start has no ticker"
