"""Pooled pykka actors: the actor contract on a fixed set of shared threads."""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from kinbox.actors import pooled
from kinbox.actors.pooled import ActorPool, PooledActor

from .helpers import wait_for


class Recorder(PooledActor):
    """Records what it handles and checks that it never runs twice at once."""

    def __init__(self, pool: ActorPool) -> None:
        super().__init__(pool)
        self.seen: list[Any] = []
        self.running = False
        self.overlaps = 0
        self.threads: set[str] = set()
        self.events: list[str] = []

    def on_start(self) -> None:
        self.events.append("start")

    def on_stop(self) -> None:
        self.events.append("stop")

    def on_failure(self, *exc_info: Any) -> None:
        self.events.append("failure")

    def on_receive(self, message: Any) -> Any:
        if self.running:
            self.overlaps += 1
        self.running = True
        try:
            self.threads.add(threading.current_thread().name)
            if message == "boom":
                raise ValueError("boom")
            self.seen.append(message)
            return ("got", message)
        finally:
            self.running = False

    def snapshot(self) -> tuple[list[Any], int, set[str], list[str]]:
        return list(self.seen), self.overlaps, set(self.threads), list(self.events)


@pytest.fixture
def pool() -> Iterator[ActorPool]:
    p = ActorPool(2, name="test-pool")
    yield p
    p.stop()


def test_one_actors_messages_run_in_order_and_never_at_once(pool: ActorPool) -> None:
    ref = Recorder.start(pool)
    senders = [threading.Thread(target=lambda k=k: [ref.tell((k, i)) for i in range(300)])
               for k in range(3)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(10)
    seen, overlaps, threads, events = ref.proxy().snapshot().get(timeout=10)
    assert overlaps == 0
    assert events == ["start"]
    for k in range(3):
        assert [i for s, i in seen if s == k] == list(range(300))
    assert threads <= {"test-pool-0", "test-pool-1"}
    ref.stop()


def test_many_actors_share_the_pool_without_new_threads(pool: ActorPool) -> None:
    before = threading.active_count()
    refs = [Recorder.start(pool) for _ in range(200)]
    for n, ref in enumerate(refs):
        ref.tell(n)
    assert [ref.ask("ping", timeout=10) for ref in refs] == [("got", "ping")] * 200
    assert [ref.proxy().seen.get(timeout=10) for ref in refs] == [[n, "ping"] for n in
                                                                   range(200)]
    assert threading.active_count() == before
    for ref in refs:
        ref.stop()


def test_ask_carries_errors_back_and_a_failed_tell_stops_the_actor(pool: ActorPool) -> None:
    ref = Recorder.start(pool)
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=10)
    assert ref.is_alive()  # an error answered to the asker is not the actor's failure
    actor = ref.proxy().snapshot().get(timeout=10)
    assert actor[3] == ["start"]
    ref.tell("boom")  # nobody to answer: the actor fails and stops
    wait_for(lambda: not ref.is_alive(), what="the failed actor to stop")
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")


def test_stop_runs_on_stop_and_answers_queued_asks_with_actor_dead(pool: ActorPool) -> None:
    gate = threading.Event()
    events: list[str] = []

    class Slow(Recorder):
        def on_stop(self) -> None:
            events.append("stop")

        def on_receive(self, message: Any) -> Any:
            if message == "wait":
                gate.wait(10)
            return super().on_receive(message)

    ref = Slow.start(pool)
    first = ref.ask("wait", block=False)
    stopped = ref.stop(block=False)  # queued behind "wait"
    queued = ref.ask("after", block=False)  # queued behind the stop
    gate.set()
    assert first.get(timeout=10) == ("got", "wait")
    stopped.get(timeout=10)
    with pytest.raises(pykka.ActorDeadError):
        queued.get(timeout=10)
    assert events == ["stop"]


def test_stopping_the_pool_runs_each_threads_exit_hook() -> None:
    exits: list[str] = []
    lock = threading.Lock()

    def on_exit() -> None:
        with lock:
            exits.append(threading.current_thread().name)

    pool = ActorPool(3, name="exit", on_exit=on_exit)
    ref = Recorder.start(pool)
    assert ref.ask("hi", timeout=10) == ("got", "hi")
    ref.stop()
    pool.stop()
    assert sorted(exits) == ["exit-0", "exit-1", "exit-2"]


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        ActorPool(0)


class Crasher(Recorder):
    """Raises a ``BaseException`` (neither ``Exception`` nor caught by one) on request."""

    def on_receive(self, message: Any) -> Any:
        if message == "exit":
            raise SystemExit("handler asked the process to exit")
        return super().on_receive(message)


@pytest.mark.timeout(30)
def test_a_base_exception_on_a_one_thread_pool_stops_every_actor_without_deadlock() -> None:
    """pykka stops all actors when a handler raises a BaseException; with a single pool
    thread, ``stop_all()`` run on that thread would wait for actors only it can stop."""
    pool = ActorPool(1, name="solo")
    try:
        others = [Recorder.start(pool) for _ in range(3)]
        crasher = Crasher.start(pool)
        assert [r.ask("hi", timeout=10) for r in others] == [("got", "hi")] * 3
        crasher.tell("exit")
        wait_for(lambda: not any(r.is_alive() for r in [*others, crasher]), timeout=10,
                 what="every actor to stop after the BaseException")
        later = Recorder.start(pool)  # the one thread is free again
        assert later.ask("after", timeout=10) == ("got", "after")
        later.stop()
    finally:
        pool.stop()


@pytest.mark.timeout(30)
def test_a_base_exception_stops_the_actors_running_then_not_those_started_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stops run on a thread of their own, which may start late: the actors it stops
    are the ones registered when the handler raised, not what the registry holds then."""
    started: list[Any] = []

    class Held:  # the stop thread, held until the test runs it
        def __init__(self, target: Any, **_: Any) -> None:
            self.target = target

        def start(self) -> None:
            started.append(self.target)

    # pykka stops every registered actor: one an earlier test in this process left
    # registered on a pool since stopped would never answer its stop, and the stops this
    # test runs would wait for it (the test hung, without PostgreSQL, twice).
    for stray in pykka.ActorRegistry.get_all():
        pykka.ActorRegistry.unregister(stray)
    pool = ActorPool(2, name="held")
    # Only the pool module's threads are held (its own run already): patching
    # threading.Thread itself also held any thread another test's runtime, still winding
    # down in this process, started meanwhile (an executor's worker), and started[0]
    # could be that one (1 run in many under xdist).
    held_threading = types.SimpleNamespace(
        **{name: getattr(threading, name) for name in dir(threading)
           if not name.startswith("__")})
    held_threading.Thread = Held
    monkeypatch.setattr(pooled, "threading", held_threading)
    try:
        before = Recorder.start(pool)
        crasher = Crasher.start(pool)
        assert before.ask("hi", timeout=10) == ("got", "hi")
        crasher.tell("exit")
        wait_for(lambda: len(started) == 1, what="the stops to be handed to their thread")
        after = Recorder.start(pool)  # started once the handler had raised
        started[0]()
        assert not before.is_alive() and not crasher.is_alive()
        assert after.ask("still here", timeout=10) == ("got", "still here")
        after.stop()
    finally:
        pool.stop()


def test_pykka_log_records_for_handler_errors(pool: ActorPool,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """The records pykka's ThreadingActor writes, on pykka's logger, word for word."""
    caplog.set_level(logging.DEBUG, logger="pykka")
    ref = Crasher.start(pool)
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=10)
    returned = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [(r.name, r.getMessage()) for r in returned] == [
        ("pykka", f"Exception returned from {ref} to caller:")]
    assert returned[0].exc_info is not None and returned[0].exc_info[0] is ValueError
    caplog.clear()
    ref.tell("exit")
    wait_for(lambda: not ref.is_alive(), what="the actor to stop")
    wait_for(lambda: any("Stopping all actors" in r.getMessage() for r in caplog.records),
             what="the BaseException record")
    record = next(r for r in caplog.records if "Stopping all actors" in r.getMessage())
    assert (record.name, record.levelno, record.getMessage()) == (
        "pykka", logging.DEBUG,
        f"SystemExit('handler asked the process to exit') in {ref}. Stopping all actors.")


@pytest.mark.timeout(30)
def test_a_stuck_actor_does_not_keep_a_base_exceptions_stop_all_from_the_others(
        caplog: pytest.LogCaptureFixture) -> None:
    """The stops after a BaseException wait for each actor a bounded time: one whose
    handler never returns is named in the log, and the actors after it still stop."""
    for stray in pykka.ActorRegistry.get_all():  # see the test above: only this test's
        pykka.ActorRegistry.unregister(stray)
    release = threading.Event()

    class Stuck(Recorder):
        def on_receive(self, message: Any) -> Any:
            if message == "hang":
                release.wait(60)  # a handler that does not return while the test runs
            return super().on_receive(message)

    pool = ActorPool(3, name="stuck", stop_timeout=0.5)
    try:
        first = Recorder.start(pool)  # last started, first stopped: this one stops last
        stuck = Stuck.start(pool)
        crasher = Crasher.start(pool)
        stuck.tell("hang")
        assert first.ask("hi", timeout=10) == ("got", "hi")
        with caplog.at_level(logging.WARNING, logger="kinbox.pool"):
            crasher.tell("exit")
            wait_for(lambda: not first.is_alive() and not crasher.is_alive(), timeout=10,
                     what="the actors besides the stuck one to stop")
            assert stuck.is_alive()
            wait_for(lambda: any(str(stuck) in r.getMessage() for r in caplog.records),
                     what="the record naming the actor that did not stop")
        assert [r.levelno for r in caplog.records
                if str(stuck) in r.getMessage()] == [logging.WARNING]
    finally:
        release.set()
        pool.stop()
