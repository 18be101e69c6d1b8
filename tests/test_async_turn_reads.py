"""What an ``async def`` brain reads through the Turn API never holds the event loop (B1).

Every async turn of a runtime shares one loop thread: a database read made there (or a
wait for a lock a database write holds) stalls every other async turn until it ends.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from kinbox.actors import Message, Turn
from kinbox.actors.running import StopFlag


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
        assert responsive.wait(5), "the event loop waited for the second fetch's write"
    finally:
        release.set()
        thread.join(10)
        workers.shutdown()
        loop.close()
    assert sorted(len(g) for g in got) == [0, 1] and turn.steered_ids == ["m1"]

