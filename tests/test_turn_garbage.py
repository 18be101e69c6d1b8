"""A finished turn is freed by reference counting, not left to the cyclic collector.

Every message builds a turn with its messages, outbox, stop flag and closures. When a
closure on the turn held the turn itself (a cycle), each turn became about 30 objects of
cyclic garbage that the collector had to find: some 7% of the instructions a message
costs. These tests keep the collector off while turns run and require every turn to be
gone once its session is done with it.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator

import pytest

from kinbox.actors import Runtime, Turn

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _sync_brain(seen: list[weakref.ref[Turn]]) -> Callable[[Turn], None]:
    def brain(turn: Turn) -> None:
        seen.append(weakref.ref(turn))
        turn.reply("ok")
    return brain


def _async_brain(seen: list[weakref.ref[Turn]]) -> Callable[[Turn], object]:
    async def brain(turn: Turn) -> None:
        seen.append(weakref.ref(turn))
        turn.reply("ok")
    return brain


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make_brain", [_sync_brain, _async_brain], ids=["sync", "async"])
def test_a_committed_turn_is_freed_without_the_cyclic_collector(
        make_runtime: MakeRuntime, no_cyclic_collector: None,
        make_brain: Callable[[list[weakref.ref[Turn]]], Callable[[Turn], object]]) -> None:
    seen: list[weakref.ref[Turn]] = []
    rt = make_runtime(brain=make_brain(seen))
    project = rt.create_project("p")
    a, b = rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id
    for i in range(6):
        rt.post(a if i % 2 else b, f"message {i}")
    rt.run_until_idle()
    assert len(seen) == 6
    wait_for(lambda: all(ref() is None for ref in seen), timeout=30,
             what="every finished turn freed by reference counting")
