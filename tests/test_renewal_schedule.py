"""The renewal rule both lease holders use (inbox rows, cron runs): due once a third of a
lease has passed since the last renewal began; a refused one is due again at once."""

from __future__ import annotations

import pytest

from kinbox.actors.renewal_schedule import RenewalSchedule

LEASE = 30.0


@pytest.mark.timeout(10)
def test_a_renewal_is_due_a_third_of_a_lease_after_the_last_one_began() -> None:
    s = RenewalSchedule()
    assert s.due(100.0, LEASE)
    s.begin(100.0)
    assert not s.due(109.9, LEASE) and s.due(110.0, LEASE)


@pytest.mark.timeout(10)
def test_a_refused_renewal_is_due_again_at_once() -> None:
    s = RenewalSchedule()
    s.begin(100.0)
    before = s.begin(110.0)
    s.refused(110.0, before)
    assert s.due(110.5, LEASE)  # noted as done, the next try came at 120


@pytest.mark.timeout(10)
def test_a_refusal_after_a_later_renewal_began_leaves_the_later_one() -> None:
    s = RenewalSchedule()
    first = s.begin(100.0)
    s.begin(110.0)  # another caller's renewal, begun after the first
    s.refused(100.0, first)
    assert not s.due(115.0, LEASE)
