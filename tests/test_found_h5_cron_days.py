"""Found by helper 5 (bug hunt): crontab's rule for the two day fields, with a ``*/n`` one.

``kinbox.actors.triggers`` reads crontab: "a restricted day of month with a restricted
weekday: either matches". Crontab (Vixie cron and cronie, ``find_jobs``: the flags
``DOM_STAR``/``DOW_STAR`` are set when the field *begins* with ``*``) counts a field
that begins with ``*`` (``*/2``) as unrestricted: then both fields must match.
kinbox ORs them whenever a field is not exactly ``*``, so ``0 9 */2 * 1`` ("odd days
that are Mondays") runs on every odd day and on every Monday.
"""

from __future__ import annotations

import datetime as dt

import pytest

from kinbox.actors.triggers import next_fire

JUNE = dt.datetime(2026, 6, 1, tzinfo=dt.UTC).timestamp() - 1  # Monday 1 June 2026


def fires(expr: str, count: int) -> list[str]:
    at, out = JUNE, []
    for _ in range(count):
        nxt = next_fire(expr, at)
        assert nxt is not None
        out.append(dt.datetime.fromtimestamp(nxt, dt.UTC).strftime("%a %d %b"))
        at = nxt
    return out


@pytest.mark.parametrize("expr, expected", [
    # odd days of the month that are Mondays
    ("0 9 */2 * 1", ["Mon 01 Jun", "Mon 15 Jun", "Mon 29 Jun"]),
    # the 1st of the month, when it is a Sunday, Tuesday, Thursday or Saturday
    ("0 9 1 * */2", ["Sat 01 Aug", "Tue 01 Sep", "Thu 01 Oct"]),
])
def test_a_day_field_starting_with_a_star_is_unrestricted_so_both_must_match(
        expr: str, expected: list[str]) -> None:
    assert fires(expr, 3) == expected


def test_two_restricted_day_fields_still_fire_when_either_matches() -> None:
    # The rule kinbox has right (not the defect): 13th of the month, or any Friday.
    assert fires("0 9 13 * 5", 3) == ["Fri 05 Jun", "Fri 12 Jun", "Sat 13 Jun"]
