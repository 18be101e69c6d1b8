"""A social turn's reply send stays on the direct turns' own threads with an async brain.

The send (``ChatTurns._conclude`` -> ``Channels.send``: the adapter call, its retries and
the pauses between them, up to ``send_timeout`` an attempt) is a :class:`Blocking` step of
the chat's turn. Carried out on the async host's blocking workers (the few threads every
async turn's tool calls, hooks and reads need), a platform that is down stalled every async
turn of the runtime; it now runs on the direct pool, awaited on the loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from kinbox.actors import Runtime, Turn

from .social_helpers import event

MakeRuntime = Callable[..., Runtime]


@pytest.mark.timeout(60)
def test_slow_social_reply_sends_do_not_hold_the_workers_async_inbox_turns_need(
        make_runtime: MakeRuntime) -> None:
    """A platform that is slow to answer (here: four sends that hang) holds the async
    host's four blocking workers; an inbox turn of another session, whose async brain
    makes one tool call, then waits for the platform, not for its own work."""
    release = threading.Event()
    sending = threading.Semaphore(0)
    answered = threading.Event()

    def slow_send(route: Mapping[str, Any], text: str) -> None:
        sending.release()
        release.wait(30)  # a platform that takes its time (within send_timeout)

    async def brain(turn: Turn) -> str:
        if turn.session_id.startswith("social-"):
            return "hi"
        await turn.tools.task_list()  # one tool call: a blocking worker
        answered.set()
        return "done"

    rt = make_runtime(brain=brain, max_active_sessions=4)  # 4 blocking workers
    try:
        rt.social.allow("slack", ["U1"])
        rt.social.register_channel("slack", send=slow_send)
        for thread in ["T1", "T2", "T3", "T4"]:
            rt.social.ingest(event("hello", thread=thread))
        for _ in range(4):
            assert sending.acquire(timeout=10), "the four sends began"
        project = rt.create_project("p")
        a, b = rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id
        rt.post(b, "one tool call, please", sender=a)
        assert answered.wait(30), "the inbox turn waited for the social sends' threads"
    finally:
        release.set()
