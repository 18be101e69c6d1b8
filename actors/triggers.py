"""Crontab expressions as APScheduler triggers: the one place schedules are computed.

Both the Focal wake-ups (:mod:`.focal_schedule`) and user cron jobs
(:mod:`.cron`) parse expressions and ask for the next fire time here, so a
crontab string means the same thing everywhere. Times cross this module as
epoch seconds; ``datetime`` stays inside.

APScheduler 3's ``CronTrigger.from_crontab`` is not crontab: it counts weekday
0 as Monday (crontab: Sunday, and 7 too), ANDs a restricted day of month with
a restricted weekday (crontab: either matches; :func:`.cron_rules.either_day_matches`
says when a field is restricted), and fires a fixed local time twice on the
night clocks go back, and drops the step after a month name (``jan-dec/2``
ran every month). So the fields are read here: weekdays are translated to
names, month names to numbers, the two day fields become two triggers taken
together (:class:`OrTrigger`), and the repeat of a wall-clock time is skipped unless
the hour field is ``*`` (as cron does: an hourly or finer job runs on).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import zoneinfo
from dataclasses import dataclass

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

from .cron_rules import (
    EXPRESSION_LIMIT,
    InvalidCronExpression,
    InvalidCronJob,
    either_day_matches,
    zone_problem,
)
from .validation import quoted, unstorable

WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
"""Crontab's weekday numbers (0 and 7 are Sunday) as the names APScheduler reads."""
_DAY = r"[A-Za-z]+|[0-9]{1,2}"
_WEEKDAY_ITEM = re.compile(rf"(\*|{_DAY})(?:-({_DAY}))?(?:/([0-9]{{1,2}}))?")
r"""One item of a weekday field. ASCII only: ``\d`` and ``\w`` take other scripts' digits,
which ``int`` reads (or refuses: a superscript two) where crontab knows none."""
_DAY_NAMES = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")


def utc(ts: float) -> dt.datetime:
    """Epoch seconds as an aware UTC datetime (what APScheduler takes)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def _weekday(token: str, expr: str) -> int:
    name = token.lower()
    for names in (WEEKDAYS, _DAY_NAMES):  # "mon" or "monday", not "mondo"
        if name in names:
            return names.index(name)
    if token.isascii() and token.isdigit() and int(token) <= 7:
        return int(token)
    raise InvalidCronExpression(expr, f"weekday {quoted(token)} is not 0-7 or a day name")


def crontab_weekdays(field: str, expr: str) -> str:
    """A crontab weekday field as APScheduler's list of day names (``1-5`` -> mon..fri)."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for item in field.split(","):
        m = _WEEKDAY_ITEM.fullmatch(item)
        if m is None:
            raise InvalidCronExpression(expr, f"weekday field item {quoted(item)} is malformed")
        first, last, step = m.group(1), m.group(2), int(m.group(3) or 1)
        if step < 1:
            raise InvalidCronExpression(expr, "a weekday step must be at least 1")
        low = 0 if first == "*" else _weekday(first, expr)
        high = 7 if first == "*" else _weekday(last, expr) if last else low
        if first == "*" and last:
            raise InvalidCronExpression(expr, f"weekday field item {quoted(item)} is malformed")
        if m.group(3) and not last and first != "*":
            high = 7  # "1/2": from Monday on, every other day
        if high < low:
            raise InvalidCronExpression(expr, f"weekday range {quoted(item)} runs backwards")
        days.update(d % 7 for d in range(low, high + 1, step))
    return ",".join(WEEKDAYS[d] for d in sorted(days))


MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
"""Crontab's month names, January first (month 1)."""
_NAME = re.compile(r"[A-Za-z]+")


def crontab_months(field: str) -> str:
    """A crontab month field with its names as numbers (``jan-dec/2`` -> ``1-12/2``); any
    other word is left for APScheduler to refuse. APScheduler reads a range of month names
    apart from numbers and drops a step after it: ``jan-dec/2`` ran every month,
    ``mar/3`` in March alone, ``jan-dec/0`` was taken."""
    def number(name: re.Match[str]) -> str:
        word = name.group(0).lower()
        return str(MONTHS.index(word) + 1) if word in MONTHS else name.group(0)
    return _NAME.sub(number, field)


def cron_trigger(expr: str, timezone: str = "UTC", *, until: float | None = None) -> BaseTrigger:
    """A crontab expression (minute hour day month weekday) in ``timezone`` as a trigger
    that fires up to ``until`` (epoch seconds; None: for ever).

    :class:`InvalidCronExpression` when the expression is malformed,
    :class:`InvalidCronJob` (field ``timezone``) when the time zone is.
    """
    if not isinstance(expr, str):
        raise InvalidCronExpression(repr(expr), "give the expression as a string")
    if not expr.strip():
        raise InvalidCronExpression(expr, "the expression is empty")
    if len(expr) > EXPRESSION_LIMIT:  # each next-run computation walks every list item
        raise InvalidCronExpression(f"{expr[:40]}...", f"it has {len(expr):,} characters; "
                                    f"the limit is {EXPRESSION_LIMIT}")
    problem = unstorable(expr)
    if problem is not None:  # APScheduler's error would quote the character raw
        raise InvalidCronExpression(expr, f"it {problem}")
    if not expr.isascii():  # APScheduler's \d and int() read other scripts' digits
        raise InvalidCronExpression(expr, "crontab fields are ASCII: digits 0-9, names, "
                                          "and * , - /")
    try:
        zone = zoneinfo.ZoneInfo(timezone)
    # OSError: a name that is a folder of the zone database ("Europe") or too long a path.
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError, OSError) as exc:
        raise InvalidCronJob("timezone", f"unknown time zone {quoted(timezone)}; give an IANA "
                                         "name such as 'Europe/Paris'") from exc
    problem = zone_problem(timezone)
    if problem is not None:
        raise InvalidCronJob("timezone", f"the time zone {quoted(timezone)} {problem}; give an "
                                         "IANA name such as 'Europe/Paris'")
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidCronExpression(expr, f"it has {len(fields)} fields, not 5")
    return _trigger(expr, zone, until)


def _trigger(expr: str, zone: dt.tzinfo, until: float | None = None) -> BaseTrigger:
    """The trigger of a checked expression (five fields) on ``zone``'s clock."""
    minute, hour, day, month, weekday = expr.split()
    days = crontab_weekdays(weekday, expr)
    month = crontab_months(month)
    # APScheduler checks the end inside its walk: without one, a date that never comes
    # (30 February) is searched for year by year up to 9999, seconds of CPU.
    end = None if until is None else utc(until)
    try:
        if either_day_matches(day, weekday):
            return OrTrigger([
                CronTrigger(minute=minute, hour=hour, day=day, month=month, timezone=zone,
                            end_date=end),
                CronTrigger(minute=minute, hour=hour, month=month, day_of_week=days,
                            timezone=zone, end_date=end)])
        return CronTrigger(minute=minute, hour=hour, day=day, month=month, day_of_week=days,
                           timezone=zone, end_date=end)
    except ValueError as exc:
        raise InvalidCronExpression(expr, str(exc)) from exc


def _every_hour(field: str) -> bool:
    """Does the (valid) hour field name all 24 hours (``*``, ``*/1``, ``0-23``, a list)?
    Such a job runs on through the hour clocks go back, as one whose field is ``*``."""
    hours: set[int] = set()
    for item in field.split(","):
        span, _, step = item.partition("/")
        if span == "*":
            first, last = 0, 23
        else:
            low, _, high = span.partition("-")
            first = int(low)
            last = int(high) if high else (23 if step else first)
        hours.update(range(first, last + 1, int(step) if step else 1))
    return len(hours) == 24


def _repeated(at: dt.datetime, zone: zoneinfo.ZoneInfo) -> bool:
    """Is ``at`` the second occurrence of its wall-clock time (the hour clocks go back)?"""
    local = at.astimezone(zone)
    first = local.replace(tzinfo=None).replace(tzinfo=zone, fold=0)
    return first.utcoffset() != local.utcoffset()


def next_fire(expr: str, after: float, timezone: str = "UTC", *,
              inclusive: bool = False) -> float | None:
    """The first fire time after ``after`` (epoch seconds; at it too if ``inclusive``);
    None if the expression names no date that exists."""
    # APScheduler returns a time that is itself a fire time as is: the epsilon makes
    # "after" strict. Fire times are whole seconds, so a millisecond cannot skip one.
    start = after if inclusive else after + 0.001
    trigger = cron_trigger(expr, timezone, until=start + NEVER_AFTER)
    fixed_hour = not _every_hour(expr.split()[1])
    zone = zoneinfo.ZoneInfo(timezone)
    at = start
    while True:
        nxt = trigger.get_next_fire_time(None, utc(at))
        if nxt is None:
            return None
        if not (fixed_hour and _repeated(nxt, zone)):
            break
        at = nxt.timestamp() + 0.001  # that wall time fired already, an hour ago
    found = nxt.timestamp()
    # A time the clocks skipped may come first (APScheduler missed it: _skipped_fire).
    for gap in _gaps(zone, start - MAX_GAP, found):
        skipped = _skipped_fire(expr, gap)
        if skipped is not None and start <= skipped < found:
            found = skipped
    return found


NEVER_AFTER = 9 * 366 * 86_400.0
"""A schedule that has not fired in this many seconds never will. The longest wait of
one that exists is 29 February's: eight years across a century that is not a leap year
(2096 to 2104); a restricted weekday fires every week."""

MAX_GAP = 86_400.0
"""The longest stretch of wall-clock time a zone's clocks ever skipped (Samoa's 30
December 2011), in seconds."""


@dataclass(frozen=True)
class _Gap:
    """Clocks springing forward: the wall times from the instant ``at`` on the ``before``
    offset up to it on the ``after`` offset do not exist."""

    at: int
    before: dt.timedelta
    after: dt.timedelta


def _offset(zone: zoneinfo.ZoneInfo, ts: int) -> dt.timedelta:
    offset = dt.datetime.fromtimestamp(ts, zone).utcoffset()
    return offset if offset is not None else dt.timedelta(0)


def _gaps(zone: zoneinfo.ZoneInfo, start: float, end: float) -> list[_Gap]:
    """The instants from ``start`` to ``end`` at which ``zone``'s clocks spring forward:
    a day at a time (no zone changes its offset twice within a day), then bisected to the
    second."""
    gaps: list[_Gap] = []
    low, stop = math.floor(start), math.ceil(end)  # whole seconds, as the transitions are
    while low < stop:
        high = min(low + 86_400, stop)
        before, after = _offset(zone, low), _offset(zone, high)
        if after > before:
            first, last = low, high  # offsets: before at first, after at last
            while last - first > 1:
                middle = (first + last) // 2
                if _offset(zone, middle) == before:
                    first = middle
                else:
                    last = middle
            gaps.append(_Gap(last, before, after))
        low = high
    return gaps


def _skipped_fire(expr: str, gap: _Gap) -> float | None:
    """When the first time of ``expr`` that ``gap`` skipped runs (None: it skipped none):
    at that wall time on the clock before the jump, one run for the whole gap.

    APScheduler finds most of them (02:30 becomes 03:30), but not a time the jump skips
    at midnight (Santiago, Cairo): it moves to the next day at 00:00, which reads 01:00,
    finds no hour 0 there, and skipped the whole day."""
    fixed = _trigger(expr, dt.timezone(gap.before))
    first = fixed.get_next_fire_time(None, utc(gap.at))
    if first is None:
        return None
    at = first.timestamp()
    return at if at < gap.at + (gap.after - gap.before).total_seconds() else None


def next_fire_or_never(expr: str, after: float, timezone: str = "UTC", *,
                       inclusive: bool = False) -> float:
    """:func:`next_fire`; :class:`InvalidCronExpression` also when the expression names no
    date that exists (``0 9 30 2 *``: a schedule that would never run)."""
    upcoming = next_fire(expr, after, timezone, inclusive=inclusive)
    if upcoming is None:
        raise InvalidCronExpression(expr, "no date matches it, so it would never fire")
    return upcoming


def local_time(ts: float, timezone: str = "UTC") -> str:
    """``ts`` as a readable local time in ``timezone`` (for the system reminder)."""
    try:
        zone: dt.tzinfo = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        zone = dt.UTC
    return dt.datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d %H:%M %Z")
