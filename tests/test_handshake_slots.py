"""The pure rule of the peer handshakes' limits (:mod:`kinbox.transport.handshake_slots`)."""

from __future__ import annotations

import pytest

from kinbox.transport.handshake_slots import HandshakeLimits, HandshakeSlots, Slot, remaining


def test_past_the_cap_the_wait_is_until_the_earliest_deadline() -> None:
    slots = HandshakeSlots(HandshakeLimits(timeout=10.0, max_pending=2))
    first, second = slots.take(100.0), slots.take(104.0)
    assert isinstance(first, Slot) and isinstance(second, Slot)
    assert (first.deadline, second.deadline, len(slots)) == (110.0, 114.0, 2)
    assert slots.take(106.0) == 4.0  # the first one ends by 110 at the latest
    assert remaining(first, 106.0) == 4.0 and remaining(first, 120.0) == 0.0
    slots.release(first)
    slots.release(first)  # twice is harmless
    third = slots.take(106.0)
    assert isinstance(third, Slot) and third.deadline == 116.0 and len(slots) == 2


@pytest.mark.parametrize("limits", [{"timeout": 0.0}, {"max_pending": 0}])
def test_limits_must_be_positive(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        HandshakeLimits(**limits)  # type: ignore[arg-type]
