"""``stop()`` called by a turn of the runtime it stops, and by two callers at once.

A brain (or a tool it calls: an agent's "shut down" command) that called ``rt.stop()``
waited on itself: the stop waited its whole timeout for that very turn, then closed the
writer under it, and the turn's commit was refused. Its row stayed ``processing`` and ran
again at the next start (its reply said twice). A stop called from inside a turn now
begins the stop and returns; the stop waits for the turn as for any other.

A second ``stop()`` while one is under way (a shutdown hook beside a ``with`` block)
returned at once, before the first had freed the database: a runtime started on the
same file right after it was refused with ``DatabaseInUse``. It now returns once the
runtime has stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import quiet_brain, wait_for

pytestmark = pytest.mark.timeout(90)

STOP_TIMEOUT = 30.0
"""The stop's own timeout: far longer than the test waits for the brain's call to return."""


def stopping_brain(box: dict[str, Any], returned: threading.Event,
                   kind: str) -> Callable[[Turn], Any]:
    """A brain that replies, then stops its own runtime, and says when the call returned."""
    def brain(turn: Turn) -> None:
        turn.reply("shutting down")
        box["rt"].stop(timeout=STOP_TIMEOUT)
        returned.set()

    async def async_brain(turn: Turn) -> None:
        brain(turn)
    return brain if kind == "sync" else async_brain


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("via", ["inbox", "cron"])
def test_a_turn_that_stops_its_runtime_commits_and_the_stop_ends(
        tmp_path: Path, kind: str, via: str) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    box: dict[str, Any] = {}
    returned = threading.Event()
    rt = box["rt"] = Runtime(db=url, brain=stopping_brain(box, returned, kind),
                             data_dir=tmp_path / "data")
    rt.start()
    try:
        if via == "inbox":
            session = rt.create_session(rt.create_project("p").id, "A").id
            rt.post(session, "please shut down")
        else:
            job = rt.cron.add("bye", "0 0 1 1 *", "please shut down")["job_id"]
            session = f"cron-{job}"
            rt.cron.trigger(job)
        assert returned.wait(STOP_TIMEOUT / 3), "the turn's stop() waited for the turn itself"
    finally:
        rt.stop()  # waits for the stop the turn began
    assert rt.state == "stopped"
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        # The turn committed: nothing runs again, the reply is there once.
        assert [e.text for e in again.transcript(session) if e.role == "assistant"] == [
            "shutting down"]
        if via == "inbox":
            assert [r["status"] for r in again.inbox()] == ["delivered"]
        else:
            assert [r["status"] for r in again.cron.runs(job)] == ["success"]


def test_a_second_stop_returns_once_the_runtime_has_stopped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    started, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        turn.wait_stop_requested(60)
        release.wait(60)  # winding down: the first stop waits for it
        turn.reply("done")

    rt = Runtime(db=url, brain=brain, data_dir=tmp_path / "data").start()
    try:
        rt.post(rt.create_session(rt.create_project("p").id, "A").id, "work")
        assert started.wait(30)
        first = threading.Thread(target=rt.stop, kwargs={"timeout": 60})
        first.start()
        wait_for(lambda: rt.state == "stopped", timeout=30, what="the first stop to begin")
        second_done = threading.Event()

        def second() -> None:
            rt.stop(timeout=60)
            second_done.set()
        threading.Thread(target=second).start()
        # The second stop must not return while the first still waits for the turn.
        assert not second_done.wait(0.5), "a second stop returned before the runtime stopped"
    finally:
        release.set()
    assert second_done.wait(60)
    # The database is free the moment the second stop returns.
    began = time.monotonic()
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        assert again.state == "running"
    assert time.monotonic() - began < 30
    first.join(30)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_turn_that_crashes_its_runtime_leaves_the_database_free(
        tmp_path: Path, kind: str) -> None:
    """``rt.crash()`` from inside an async brain (a scenario's turn that kills its process)
    tried to join the event loop's thread from that thread: it raised ``RuntimeError`` half
    way, and the SQLite file's lock was never let go (``DatabaseInUse`` for every runtime
    the program started on it after)."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    box: dict[str, Any] = {}
    returned = threading.Event()
    raised: list[BaseException] = []

    def brain(turn: Turn) -> None:
        try:
            box["rt"].crash()
        except BaseException as exc:
            raised.append(exc)
        returned.set()

    async def async_brain(turn: Turn) -> None:
        brain(turn)

    rt = box["rt"] = Runtime(db=url, brain=brain if kind == "sync" else async_brain,
                             data_dir=tmp_path / "data").start()
    rt.post(rt.create_session(rt.create_project("p").id, "A").id, "crash now")
    assert returned.wait(30)
    assert raised == [] and rt.state == "crashed"
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        again.run_until_idle(30)  # the message runs again, as after a kill
        assert [r["status"] for r in again.inbox()] == ["delivered"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_observer_that_stops_the_runtime_as_a_turn_starts_does_not_hold_it(
        tmp_path: Path, kind: str) -> None:
    """Observers run on the turn's thread (the event loop, for an async brain): one that
    called ``rt.stop()`` (stop after the first turn, say) held the stop its whole timeout
    (for good, on the event loop) and the turn's commit was refused."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    returned = threading.Event()

    def brain(turn: Turn) -> None:
        turn.reply("done")

    async def async_brain(turn: Turn) -> None:
        brain(turn)

    rt = Runtime(db=url, brain=brain if kind == "sync" else async_brain,
                 data_dir=tmp_path / "data")

    def observer(event: str, data: dict[str, Any]) -> None:
        if event == "turn_started" and not returned.is_set():
            rt.stop(timeout=STOP_TIMEOUT)
            returned.set()

    rt.subscribe(observer)
    rt.start()
    try:
        session = rt.create_session(rt.create_project("p").id, "A").id
        rt.post(session, "one turn only")
        assert returned.wait(STOP_TIMEOUT / 3), "the observer's stop() waited for the turn"
    finally:
        rt.stop()
    with Runtime(db=url, brain=quiet_brain, data_dir=tmp_path / "data") as again:
        assert [r["status"] for r in again.inbox()] == ["delivered"]


def _channel_send_calling(tmp_path: Path, kind: str, act: Callable[[Runtime], object],
                          text: str) -> tuple[Runtime, threading.Event, list[BaseException]]:
    """A runtime on ``tmp_path`` whose channel adapter's ``send`` (``kind``: sync, or async
    on the channel loop) calls ``act(rt)``, and an event whose reply it sends: the runtime,
    set once ``act`` returned, and what it raised."""
    box: dict[str, Runtime] = {}
    returned = threading.Event()
    raised: list[BaseException] = []

    def send(route: dict[str, Any], text: str) -> None:
        try:
            act(box["rt"])
        except BaseException as exc:
            raised.append(exc)
        returned.set()

    async def async_send(route: dict[str, Any], text: str) -> None:
        send(route, text)

    rt = box["rt"] = Runtime(db=f"sqlite:///{tmp_path / 'k.db'}",
                             brain=lambda turn: turn.reply("bye"),
                             data_dir=tmp_path / "data").start()
    try:
        rt.social.register_channel("chat", send=send if kind == "sync" else async_send)
        rt.social.allow("chat", ["U1"])
        rt.social.ingest({"platform": "chat", "sender_id": "U1", "sender_name": "Ann",
                          "thread_id": "T1", "text": text, "reply_route": {}})
    except BaseException:
        rt.stop()
        raise
    return rt, returned, raised


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_channel_send_that_stops_the_runtime_does_not_hold_it(
        tmp_path: Path, kind: str) -> None:
    """A channel adapter's ``send`` runs on the direct-turn pool (an async one on the
    channel loop): one that called ``rt.stop()`` held the stop its whole timeout, and an
    async one then joined the channel loop's thread from itself: ``RuntimeError`` half way
    through the stop, which never let go of the SQLite file's lock."""
    rt, returned, raised = _channel_send_calling(
        tmp_path, kind, lambda rt: rt.stop(timeout=STOP_TIMEOUT), "/shutdown")
    try:
        assert returned.wait(STOP_TIMEOUT / 3), "the send's stop() waited for the send"
    finally:
        rt.stop()
    assert raised == []
    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=quiet_brain,
                 data_dir=tmp_path / "data") as again:
        assert again.state == "running"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_channel_send_that_crashes_the_runtime_leaves_the_database_free(
        tmp_path: Path, kind: str) -> None:
    """``rt.crash()`` from an async channel adapter's ``send`` (on the channel loop's thread)
    waited on the loop it held for its sends' cancel, then joined that thread from itself:
    ``RuntimeError`` half way through the crash, and the SQLite file's lock was never let go
    (``DatabaseInUse`` for every later runtime of the program on it)."""
    rt, returned, raised = _channel_send_calling(tmp_path, kind, Runtime.crash, "/crash")
    assert returned.wait(30)
    assert raised == [] and rt.state == "crashed"
    wait_for(lambda: not rt.social.channels.loop.running(), timeout=30,
             what="the channel loop to end")
    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=quiet_brain,
                 data_dir=tmp_path / "data") as again:
        assert again.state == "running"
