"""What an ``async def`` brain reads through the Turn API never holds the event loop (B1).

Every async turn of a runtime shares one loop thread: a database read made there (or a
wait for a lock a database write holds) stalls every other async turn until it ends. The
Turn's lazily read attributes (``turn.context``, ``turn.request``), its steering and its
tools are asked for here while another session's async turn must make progress (or the
loop must answer); each read is held open (an injected read that waits on an event) so
a loop that waited for it would show.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kinbox.actors import Message, Runtime, RuntimeStateError, Turn
from kinbox.actors.running import StopFlag

MakeRuntime = Callable[..., Runtime]


class HeldReads:
    """A database call about one session (``store.session`` by default), held open once
    that session's brain has begun (a slow database, a lock): it signals ``reading`` and
    waits for ``release``."""

    def __init__(
        self, rt: Runtime, session_id: str, where: str = "store.session", position: int = 0
    ) -> None:
        self.in_brain = threading.Event()
        self.reading = threading.Event()
        self.release = threading.Event()
        self.on_loop: list[str] = []
        owner_name, name = where.split(".")
        owner = getattr(rt.context, owner_name)
        real = getattr(owner, name)

        def held(*args: Any, **kwargs: Any) -> Any:
            if args[position] == session_id and self.in_brain.is_set():
                if threading.current_thread().name == "kinbox-async":
                    self.on_loop.append(name)
                self.reading.set()
                self.release.wait(10)
            return real(*args, **kwargs)

        setattr(owner, name, held)


LAZY_READS = {
    "context": (lambda turn: turn.context, "store.session", 0),
    "request": (lambda turn: turn.request, "store.session", 0),
    "steering()": (lambda turn: turn.steering(), "journal.submit_claim_more", 1),
    "take()": (lambda turn: turn.take("m-not-there"), "journal.submit_claim_row", 1),
    "tools.sync.agent_list()": (lambda turn: turn.tools.sync.agent_list(), "store.session", 0),
    "tools.sync.task_create()": (lambda turn: turn.tools.sync.task_create("t"), "store.session", 0),
    "history()": (lambda turn: turn.history(5), "store.transcript", 0),
}
"""What an async brain asks of its turn, and the database call that answers it."""


def two_sessions(rt: Runtime) -> tuple[str, str]:
    project = rt.create_project("p")
    return rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attribute", list(LAZY_READS))
def test_an_async_brain_reading_a_lazy_turn_attribute_holds_no_other_turn(
    make_runtime: MakeRuntime, attribute: str
) -> None:
    """``turn.context`` and ``turn.request`` read the session the first time a turn asks
    (off Focal turns), ``turn.steering()`` and ``turn.take()`` lease rows (a write), and
    every sync tool (``turn.tools.sync``) reads the calling session first: in an async
    brain that ran on the event loop, and another session's async turn waited for it. The
    context of a turn off Focal is known without a read (None); the request is read with
    ``await turn.arequest()``, steering with ``await turn.asteering()``, a row taken with
    ``await turn.atake()`` and a tool called with ``await turn.tools.X()``, and the sync
    calls on the loop are refused (``state="event_loop"``), not run there."""
    ask, where, position = LAZY_READS[attribute]
    seen: list[Any] = []
    other_ran = threading.Event()
    holder: dict[str, HeldReads] = {}

    async def brain(turn: Turn) -> None:
        if turn.session_id != a:
            other_ran.set()
            return
        holder["reads"].in_brain.set()
        try:
            seen.append(ask(turn))
        except RuntimeStateError as exc:
            seen.append(exc.state)

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    reads = holder["reads"] = HeldReads(rt, a, where, position)
    try:
        rt.post(a, "read your " + attribute)
        assert reads.in_brain.wait(10), "A's brain began"
        rt.post(b, "anything")
        assert other_ran.wait(30), (
            f"B's async turn did not run while A's brain read turn.{attribute} "
            f"(reads of A on the event loop: {reads.on_loop})"
        )
    finally:
        reads.release.set()
    rt.run_until_idle()
    assert reads.on_loop == []
    expected = [None] if attribute == "context" else ["event_loop"]
    assert seen == expected


@pytest.mark.timeout(60)
def test_an_async_brain_awaits_its_tool_request_off_the_event_loop(
    make_runtime: MakeRuntime,
) -> None:
    """``await turn.arequest()`` reads the session on a blocking worker: another async
    turn runs meanwhile, and the request is the session's (its config's tools), read
    once, then readable as ``turn.request`` too."""
    seen: list[Any] = []
    other_ran = threading.Event()
    holder: dict[str, HeldReads] = {}

    async def brain(turn: Turn) -> None:
        if turn.session_id != a:
            other_ran.set()
            return
        holder["reads"].in_brain.set()
        seen.append(await turn.arequest())
        seen.append(await turn.arequest())  # resolved once: no second read
        seen.append(turn.request)  # and readable as an attribute from here on

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    rt.context.store.update_session(a, rt.clock.now(), config={"tools": ["web_search"]})
    reads = holder["reads"] = HeldReads(rt, a)
    try:
        rt.post(a, "which tools?")
        assert reads.reading.wait(10), "A's request is being read"
        rt.post(b, "anything")
        assert other_ran.wait(30), "B's async turn waited for A's read of its request"
    finally:
        reads.release.set()
    rt.run_until_idle()
    assert reads.on_loop == []
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2]
    assert seen[0].tools == ("web_search",)


@pytest.mark.timeout(60)
def test_an_async_brain_awaits_its_history_off_the_event_loop(make_runtime: MakeRuntime) -> None:
    """``await turn.ahistory(limit)`` reads the session's transcript on a blocking worker:
    another async turn runs meanwhile, and the history is the session's earlier turns."""
    seen: list[list[str]] = []
    other_ran = threading.Event()
    holder: dict[str, HeldReads] = {}

    async def brain(turn: Turn) -> str:
        if turn.session_id != a:
            other_ran.set()
            return "b"
        if "reads" in holder:
            holder["reads"].in_brain.set()
        seen.append([e.text for e in await turn.ahistory(5)])
        return "answered"

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    rt.post(a, "first")
    rt.run_until_idle()
    reads = holder["reads"] = HeldReads(rt, a, "store.transcript")
    try:
        rt.post(a, "second")
        assert reads.reading.wait(10), "A's history is being read"
        rt.post(b, "anything")
        assert other_ran.wait(30), "B's async turn waited for A's read of its history"
    finally:
        reads.release.set()
    rt.run_until_idle()
    assert reads.on_loop == []
    assert seen == [[], ["first", "answered"]]


@pytest.mark.timeout(30)
def test_taking_steering_never_waits_on_the_loop_for_another_fetchs_write() -> None:
    """Two ``asteering()`` calls of one async brain at once (``asyncio.gather``): each
    fetch is a database write (leasing the rows) on a blocking worker, holding the turn's
    steering lock. The first call, back on the loop, took that lock again to hand its
    messages over, so while the second fetch wrote, the loop waited for it and every
    async turn with it."""
    inside_second = threading.Event()
    release = threading.Event()
    calls: list[int] = []
    which = threading.local()

    def fetch_steering() -> list[Message]:
        calls.append(len(calls))
        which.nth = len(calls)  # the worker running it knows which fetch it was
        if len(calls) == 2:  # the second fetch: a write that takes its time
            inside_second.set()
            release.wait(10)
            return []
        return [Message(f"m{len(calls)}", "agent_message", "more", "s", {})]

    turn = Turn("s", [], lambda: None, StopFlag(), fetch_steering)
    workers = ThreadPoolExecutor(2)
    loop = asyncio.new_event_loop()
    about_to_take = threading.Event()

    def fetched(fn: Callable[[], None]) -> int:
        fn()
        return int(which.nth)

    async def run_blocking(fn: Callable[[], None]) -> None:
        if await loop.run_in_executor(workers, fetched, fn) == 1:
            # The first fetch is back: its caller takes its messages once the second
            # fetch writes (holding the steering lock), as a slower loop would.
            await loop.run_in_executor(workers, inside_second.wait, 10)
            about_to_take.set()  # this task now takes its messages, in this same step

    turn._run_blocking = run_blocking  # as the async host sets it for its turns
    got: list[list[Message]] = []

    async def brain() -> None:
        got.extend(await asyncio.gather(turn.asteering(), turn.asteering()))

    thread = threading.Thread(target=loop.run_until_complete, args=(brain(),))
    thread.start()
    try:
        assert about_to_take.wait(10), "the first fetch came back while the second wrote"
        responsive = threading.Event()
        loop.call_soon_threadsafe(responsive.set)
        assert responsive.wait(20), "the event loop waited for the second fetch's write"
    finally:
        release.set()
        thread.join(10)
        workers.shutdown()
        loop.close()
    assert sorted(len(g) for g in got) == [0, 1] and turn.steered_ids == ["m1"]


@pytest.mark.timeout(60)
def test_a_running_turns_tools_are_known_without_a_read_when_the_cache_starts_over(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which tools a session holds is remembered for ``TOOL_CLASSES_KEPT`` sessions, then
    forgotten all at once. An async turn whose session was known when it started builds
    its tools on the event loop when the brain first asks (no read: it was known); if the
    memory started over in between, that build read the session there, holding every
    async turn. The sessions whose turns run are kept when it starts over."""
    monkeypatch.setattr("kinbox.actors.tools.TOOL_CLASSES_KEPT", 2)
    go = threading.Event()
    holder: dict[str, HeldReads] = {}
    schemas: list[int] = []

    async def brain(turn: Turn) -> None:
        if turn.messages[0].content == "second":
            holder["reads"].in_brain.set()
            await asyncio.to_thread(go.wait, 10)  # the cache starts over meanwhile
        schemas.append(len(turn.tools.schemas()))

    rt = make_runtime(brain=brain)
    a, _ = two_sessions(rt)
    rt.post(a, "first")  # A's tools: read once, remembered
    rt.run_until_idle()
    reads = holder["reads"] = HeldReads(rt, a)
    reads.release.set()  # recorded, not held: the read must merely not be on the loop
    rt.post(a, "second")
    try:
        assert reads.in_brain.wait(10)
        for title in ("C", "D", "E"):  # new sessions: more than the cache keeps
            rt.tools_for(rt.create_session(None, title).id)
    finally:
        go.set()
    rt.run_until_idle()
    assert len(schemas) == 2 and schemas[0] == schemas[1]
    assert reads.on_loop == [], "A's running turn read which tools it holds on the loop"


@pytest.mark.timeout(60)
def test_an_async_brain_waiting_for_a_stop_with_the_sync_call_holds_no_other_turn(
    make_runtime: MakeRuntime,
) -> None:
    """``turn.wait_stop_requested(timeout)`` in an async brain blocked the event loop's
    thread for the whole timeout: no other async turn ran meanwhile. It is refused on the
    loop (``state="event_loop"``); ``await turn.stopped(timeout)`` is the wait that holds
    nothing."""
    from kinbox.actors.stops import request_stop

    seen: list[Any] = []
    other_ran, in_brain = threading.Event(), threading.Event()

    async def brain(turn: Turn) -> None:
        if turn.session_id != a:
            other_ran.set()
            return
        in_brain.set()
        try:
            seen.append(turn.wait_stop_requested(20))
        except RuntimeStateError as exc:
            seen.append(exc.state)
        seen.append(await turn.stopped(0))

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    try:
        rt.post(a, "wait for a stop")
        assert in_brain.wait(10), "A's brain began"
        rt.post(b, "anything")
        assert other_ran.wait(30), "B's async turn waited for A's wait_stop_requested"
    finally:
        request_stop(rt.context, a, "operator")  # ends a wait that held the loop
    rt.run_until_idle()
    assert seen == ["event_loop", False]


@pytest.mark.timeout(60)
def test_a_sync_turn_and_sync_tools_off_the_loop_are_not_refused(make_runtime: MakeRuntime) -> None:
    """The refusal is for the event loop's thread alone: a sync brain (on a pool thread)
    and an async brain's code on a worker thread (``asyncio.to_thread``) call the sync API
    as before."""
    seen: list[Any] = []

    def off_loop(turn: Turn) -> None:
        seen.append(turn.wait_stop_requested(0))
        seen.append(turn.take("m-not-there"))
        seen.append(
            turn.tools.sync.task_list() if hasattr(turn.tools, "sync") else turn.tools.task_list()
        )

    async def async_brain(turn: Turn) -> None:
        await asyncio.to_thread(off_loop, turn)

    for brain in (off_loop, async_brain):
        seen.clear()
        rt = make_runtime(brain=brain)
        project = rt.project("p") or rt.create_project("p")
        a = rt.create_session(project.id, "A").id
        rt.post(a, "hello")
        rt.run_until_idle()
        assert seen == [False, False, {"tasks": []}], brain
        rt.stop()


@pytest.mark.timeout(60)
def test_an_async_brain_takes_a_row_into_its_turn_off_the_event_loop(
    make_runtime: MakeRuntime,
) -> None:
    """``await turn.atake(message_id)`` is ``turn.take`` for an async brain: the row is
    leased on a blocking worker (another async turn runs meanwhile), becomes part of the
    turn and is committed with it, so it runs no turn of its own."""
    holder: dict[str, HeldReads] = {}
    other_ran, queued = threading.Event(), threading.Event()
    taken: list[bool] = []
    turns: list[list[str]] = []

    async def brain(turn: Turn) -> None:
        if turn.session_id != a:
            other_ran.set()
            return
        turns.append([m.message_id for m in turn.messages])
        if turn.messages[0].message_id == "first":
            await asyncio.to_thread(queued.wait, 10)  # "second" is queued behind this turn
            holder["reads"].in_brain.set()
            taken.append(await turn.atake("second"))

    rt = make_runtime(brain=brain)
    a, b = two_sessions(rt)
    reads = holder["reads"] = HeldReads(rt, a, "journal.submit_claim_row", 1)
    try:
        rt.post(a, "now", message_id="first")
        rt.post(a, "later", message_id="second")
        queued.set()
        assert reads.reading.wait(10), "A's row is being taken"
        rt.post(b, "anything")
        assert other_ran.wait(30), "B's async turn waited for A's take"
    finally:
        reads.release.set()
        queued.set()
    rt.run_until_idle()
    assert reads.on_loop == [] and taken == [True]
    assert turns == [["first"]]
    assert [e.message_id for e in rt.transcript(a) if e.role == "user"] == ["first", "second"]
