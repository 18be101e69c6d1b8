"""The passivation rule (I8) as a pure core: the ttl boundary on a given clock reading,
busy actors kept, and the live bound held under churn."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from kinbox.actors.passivation import evictions_for, excess_idle, expired_idle


def test_an_actor_expires_at_exactly_its_ttl_and_not_before() -> None:
    used = {"a": 100.0, "b": 130.0}
    assert expired_idle(used, set(), 159.999, 60) == []
    assert expired_idle(used, set(), 160.0, 60) == ["a"]
    assert expired_idle(used, set(), 190.0, 60) == ["a", "b"]  # oldest first
    assert expired_idle(used, {"a"}, 1e9, 60) == ["b"]  # a running turn's actor stays


@pytest.mark.parametrize("seed", range(5))
def test_the_live_bound_holds_under_churn(seed: int) -> None:
    """Random activations and turn ends, as the slot table makes them: with fewer busy
    than the cap (a sync brain: max_live >= max_active), live never exceeds the cap, no
    busy actor is stopped, and the least recently used idle one goes first."""
    rng = random.Random(seed)
    cap, max_active = 4, 3
    live: OrderedDict[str, None] = OrderedDict()
    busy: set[str] = set()
    for _ in range(2000):
        if busy and (len(busy) >= max_active or rng.random() < 0.5):
            busy.discard(rng.choice(sorted(busy)))
            continue
        incoming = f"s{rng.randrange(12)}"
        if incoming in busy:
            continue
        victims = evictions_for(live.keys(), busy, incoming, cap)
        assert not set(victims) & busy
        assert victims == [s for s in live if s not in busy][:len(victims)]
        for v in victims:
            del live[v]
        live[incoming] = None
        live.move_to_end(incoming)
        busy.add(incoming)
        assert len(live) <= cap
    assert excess_idle(live.keys(), busy, cap) == []

