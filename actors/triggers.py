"""Crontab expressions as APScheduler triggers: the one place schedules are computed.

Both the Focal wake-ups (:mod:`.focal_schedule`) and user cron jobs
(:mod:`.cron`) parse expressions and ask for the next fire time here, so a
crontab string means the same thing everywhere. Times cross this module as
epoch seconds; ``datetime`` stays inside.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

from apscheduler.triggers.cron import CronTrigger

from .cron_rules import InvalidCronExpression


def utc(ts: float) -> dt.datetime:
    """Epoch seconds as an aware UTC datetime (what APScheduler takes)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def cron_trigger(expr: str, timezone: str = "UTC") -> CronTrigger:
    """A crontab expression (minute hour day month weekday) in ``timezone`` as a trigger.

    :class:`InvalidCronExpression` when the expression or the time zone is malformed.
    """
    if not isinstance(expr, str):
        raise InvalidCronExpression(repr(expr), "give the expression as a string")
    if not expr.strip():
        raise InvalidCronExpression(expr, "the expression is empty")
    try:
        zone = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidCronExpression(expr, f"unknown time zone {timezone!r}") from exc
    try:
        return CronTrigger.from_crontab(expr.strip(), timezone=zone)
    except ValueError as exc:
        raise InvalidCronExpression(expr, str(exc)) from exc


def next_fire(expr: str, after: float, timezone: str = "UTC", *,
              inclusive: bool = False) -> float | None:
    """The first fire time after ``after`` (epoch seconds; at it too if ``inclusive``)."""
    # APScheduler returns a time that is itself a fire time as is: the epsilon makes
    # "after" strict. Fire times are whole seconds, so a millisecond cannot skip one.
    start = after if inclusive else after + 0.001
    nxt = cron_trigger(expr, timezone).get_next_fire_time(None, utc(start))
    return nxt.timestamp() if nxt else None


def local_time(ts: float, timezone: str = "UTC") -> str:
    """``ts`` as a readable local time in ``timezone`` (for the system reminder)."""
    try:
        zone: dt.tzinfo = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        zone = dt.UTC
    return dt.datetime.fromtimestamp(ts, zone).strftime("%Y-%m-%d %H:%M %Z")
