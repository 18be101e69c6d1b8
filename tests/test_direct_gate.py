"""One direct turn of a session at a time, waited for by a thread or awaited on the loop."""

from __future__ import annotations

import asyncio

from kinbox.actors.direct_gate import SessionGate


def test_the_next_in_line_gets_the_gate_once_the_holder_leaves() -> None:
    gate = SessionGate()
    first, second = gate.enter("s1"), gate.enter("s1")
    other = gate.enter("s2")
    assert first.done() and other.done() and not second.done()
    gate.leave("s1", first)
    assert second.done()
    gate.leave("s1", second)
    gate.leave("s2", other)
    assert gate.sessions() == 0  # an idle session keeps nothing


def test_a_waiter_that_gave_up_passes_the_gate_on_when_it_leaves() -> None:
    gate = SessionGate()
    first, gave_up, third = gate.enter("s"), gate.enter("s"), gate.enter("s")
    assert gave_up.cancel()
    gate.leave("s", first)
    assert not third.done()  # the cancelled one is first in line until it leaves
    gate.leave("s", gave_up)
    assert third.done() and not third.cancelled()
    gate.leave("s", third)
    assert gate.sessions() == 0


def test_a_turn_on_the_loop_awaits_its_place_and_its_cancel_leaves_the_line() -> None:
    gate = SessionGate()
    held = gate.enter("s")

    async def main() -> None:
        place = gate.enter("s")
        waiter = asyncio.ensure_future(asyncio.wrap_future(place))
        await asyncio.sleep(0)
        assert not waiter.done()
        waiter.cancel()  # its turn was cancelled while it waited
        await asyncio.gather(waiter, return_exceptions=True)
        gate.leave("s", place)
        later = gate.enter("s")
        gate.leave("s", held)
        await asyncio.wait_for(asyncio.wrap_future(later), 5)
        gate.leave("s", later)
    asyncio.run(main())
    assert gate.sessions() == 0
