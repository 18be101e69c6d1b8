"""Which reading of the server's clock a process carries forward (no server needed)."""

from __future__ import annotations

import pytest

from kinbox.persistence.db_clock import DRIFT, NO_READING, Reading, better_reading


@pytest.mark.timeout(10)
def test_a_reading_with_a_longer_round_trip_does_not_replace_a_tighter_one() -> None:
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.0004)
    late = Reading(server=1002.0, mono=12.0, round_trip=0.020)  # waited for the GIL
    assert better_reading(kept, late) is kept


@pytest.mark.timeout(10)
def test_a_kept_reading_ages_by_the_drift_allowance_until_a_new_one_wins() -> None:
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.0004)
    fair = Reading(server=1000.0 + 30, mono=40.0, round_trip=0.040)  # good to 20 ms
    # 30 s later the kept one may be off by 0.2 ms + 30 s x 500 ppm = 15.2 ms: still tighter.
    assert kept.error_at(40.0) == pytest.approx(0.0002 + 30 * DRIFT)
    assert better_reading(kept, fair) is kept
    # 60 s later (30.2 ms) a reading good to 20 ms wins.
    newer = Reading(server=1000.0 + 60, mono=70.0, round_trip=0.040)
    assert better_reading(kept, newer) is newer


@pytest.mark.timeout(10)
def test_an_equal_or_tighter_reading_replaces_the_kept_one_and_any_beats_none() -> None:
    kept = Reading(server=1000.0, mono=10.0, round_trip=0.001)
    same = Reading(server=1001.0, mono=11.0, round_trip=0.001 - 2 * DRIFT)
    assert better_reading(kept, same) is same
    assert better_reading(NO_READING, kept) is kept
