"""A stop leaves no task of the async brains' loop pending, even one it gave up waiting for.

A task garbage-collected while still pending ("Task was destroyed but it is pending!",
logged by asyncio) is a turn's driver or brain that nothing ever ended: its clean-up
(``finally`` blocks, a model client's close) never ran.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import wait_for

HELD_THREAD = "hold"


def social_event(thread_id: str) -> dict[str, object]:
    return {
        "platform": "slack",
        "sender_id": "U1",
        "sender_name": "Ann",
        "thread_id": thread_id,
        "text": "hi",
        "reply_route": {"channel": "C9", "ts": thread_id},
    }


@pytest.mark.timeout(90)
def test_a_stop_that_gave_up_on_a_held_loop_leaves_no_task_pending_once_the_loop_ends(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Many async turns (inbox turns and social events' direct turns) await their model
    when the runtime stops, and one brain holds the loop with a blocking call: the stop
    can neither drain nor cancel anything, gives up, and asks the loop to end. The loop
    ended once let go with every task on it still pending (the turns' drivers, the direct
    turns' ``_drive_direct``, the brains), and each was destroyed pending when collected.
    The loop's end now cancels what is left on it and waits for it to end."""
    # What earlier tests of this process left for the collector (another runtime's loop,
    # its tasks) is collected before this one listens: its report is not this test's.
    gc.collect()
    caplog.set_level(logging.ERROR, logger="asyncio")
    release, holding = threading.Event(), threading.Event()
    awaiting: set[str] = set()
    lock = threading.Lock()

    async def brain(turn: Turn) -> None:
        turn.reply("halfway")
        if turn.session_id.endswith(HELD_THREAD):
            holding.set()
            release.wait(60)  # a blocking call: holds the loop, no cancel reaches it
        with lock:
            awaiting.add(turn.session_id)
        await asyncio.Event().wait()  # a model call that ignores the stop (not its cancel)

    rt = Runtime(db=db_url, brain=brain, stop_grace=0.2).start()
    host = rt.context.async_host
    assert host is not None
    try:
        rt.social.allow("slack", ["U1"])
        rt.social.register_channel("slack", send=lambda route, text: None)
        project = rt.create_project("p").id
        for i in range(8):
            rt.post(rt.create_session(project, f"S{i}").id, f"m{i}")
        for i in range(3):
            rt.social.ingest(social_event(f"T{i}"))
        wait_for(lambda: len(awaiting) == 11, 30, "the turns to await their model")
        rt.social.ingest(social_event(HELD_THREAD))
        assert holding.wait(20), "the brain holding the loop never ran"
        rt.stop(timeout=0.2)  # gives up on the held loop
    finally:
        release.set()
    loop, thread = host.loop, host._thread
    wait_for(lambda: not thread.is_alive(), 30, "the loop to end once let go")
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    assert left == [], "tasks left pending on the ended loop"
    del rt, host, left, loop
    gc.collect()
    destroyed = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert destroyed == [], destroyed
