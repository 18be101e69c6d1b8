"""Cron jobs through a real runtime on the injected clock (C1-C3)."""

from __future__ import annotations

import datetime as dt
import threading
import time
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from apscheduler.triggers.cron import CronTrigger

from kinbox.actors import ManualClock, Runtime, Turn
from kinbox.actors import cron_rules as rules
from kinbox.actors.announcements import Announcements
from kinbox.actors.triggers import next_fire
from kinbox.persistence import DatabaseFailed, Occurrence

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]
MINUTE = 60.0
START = 1_700_000_040.0
"""2023-11-14 22:14:00 UTC: a whole minute, so an every-minute job is due 60 s later."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


class CronBrain:
    """Replies with the run id; fails while ``failing`` is set; blocks while ``hold`` is set."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.failing: str | None = None
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, turn: Turn) -> str:
        with self.lock:
            self.turns.append(turn)
        if self.hold.is_set():
            self.hold.clear()
            self.holding.set()
            self.release.wait(10)
        if self.failing:
            raise RuntimeError(self.failing)
        return f"done {turn.messages[0].payload.get('run_id')}"


def every_minute(rt: Runtime, **options: object) -> str:
    return str(rt.cron.add("tick", "* * * * *", "Say what time it is.", **options)["job_id"])


def waits_for_its_session(rt: Runtime) -> threading.Event:
    """Set once a turn of ``rt`` starts to wait for its session's running turn to end."""
    turns = rt.context.turns
    waiting = threading.Event()
    real_begin = turns.begin

    def begin(*args: Any, **kwargs: Any) -> Any:
        waiting.set()
        return real_begin(*args, **kwargs)
    turns.begin = begin  # type: ignore[method-assign]
    return waiting


# -- the pure rules ----------------------------------------------------------------------------

def test_a_failed_run_is_retried_after_1_2_4_8_16_minutes_then_the_job_stops() -> None:
    count, now, delays = 0, 1000.0, []
    while True:
        plan = rules.after_failure(count, "boom", now)
        if not plan.active:
            break
        delays.append(plan.next_run_at - now)
        count, now = plan.retry_count, plan.next_run_at
    assert delays == [60, 120, 240, 480, 960]
    assert plan.last_error == "Max retries exceeded: boom" and plan.next_run_at is None


def test_a_due_occurrence_runs_is_refused_or_is_skipped_beyond_the_grace_time() -> None:
    run = rules.on_due(100, 130, next_regular=160, previous_active=False, grace=60)
    busy = rules.on_due(100, 130, next_regular=160, previous_active=True, grace=60)
    late = rules.on_due(100, 400, next_regular=420, previous_active=False, grace=60)
    assert (run.due, run.next_run_at) == (rules.Due.RUN, 160)
    assert (busy.due, busy.error) == (rules.Due.PREVIOUS_ACTIVE,
                                      "Previous cron run is still active")
    assert (late.due, late.next_run_at) == (rules.Due.MISSED, 420)


def test_coalesced_occurrences_run_when_the_latest_is_within_the_grace_time() -> None:
    """The first missed occurrence is past the grace time, a later one is not: the
    coalesced run stands for the later one and goes ahead."""
    ran = rules.on_due(100, 400, next_regular=420, previous_active=False, grace=60,
                       recent_regular=360)
    none_recent = rules.on_due(100, 400, next_regular=420, previous_active=False, grace=60,
                               recent_regular=420)
    assert (ran.due, ran.next_run_at) == (rules.Due.RUN, 420)
    assert none_recent.due is rules.Due.MISSED


def test_next_fire_is_strictly_after_unless_inclusive() -> None:
    assert next_fire("* * * * *", START) == START + MINUTE
    assert next_fire("* * * * *", START, inclusive=True) == START
    assert next_fire("0 9 * * *", START, "Europe/Paris") == 1_700_035_200.0  # 09:00 CET


def test_29_february_is_found_across_a_century_that_is_not_a_leap_year() -> None:
    after_2096 = dt.datetime(2097, 3, 1, tzinfo=dt.UTC).timestamp()
    nxt = next_fire("0 0 29 2 *", after_2096)
    assert nxt == dt.datetime(2104, 2, 29, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize("expr", ["0 9 30 2 *", "0 9 31 4,6,9,11 *", "*/5 * 31 2 *"])
def test_a_date_that_never_comes_is_known_after_a_bounded_search(
        monkeypatch: pytest.MonkeyPatch, expr: str) -> None:
    # APScheduler, left unbounded, walks every year up to 9999 (seconds of CPU on the
    # thread that adds the job): count its steps instead of timing them.
    steps = 0
    walk = CronTrigger._increment_field_value

    def counted(self: CronTrigger, dateval: dt.datetime, fieldnum: int) -> Any:
        nonlocal steps
        steps += 1
        return walk(self, dateval, fieldnum)

    monkeypatch.setattr(CronTrigger, "_increment_field_value", counted)
    assert next_fire(expr, START) is None
    assert 0 < steps < 1_000


def _fires(expr: str, start: str, timezone: str = "UTC", n: int = 3) -> list[str]:
    """The next ``n`` fire times after ``start`` as local 'Day MM-DD HH:MM ZONE'."""
    zone = zoneinfo.ZoneInfo(timezone)
    at, out = dt.datetime.fromisoformat(start).timestamp(), []
    for _ in range(n):
        nxt = next_fire(expr, at, timezone)
        assert nxt is not None
        out.append(dt.datetime.fromtimestamp(nxt, zone).strftime("%a %m-%d %H:%M %Z"))
        at = nxt
    return out


FRIDAY = "2026-01-02T10:00:00+00:00"


@pytest.mark.parametrize(("expr", "fires"), [
    ("0 9 * * 1-5", ["Mon 01-05 09:00 UTC", "Tue 01-06 09:00 UTC", "Wed 01-07 09:00 UTC"]),
    ("0 9 * * 0", ["Sun 01-04 09:00 UTC", "Sun 01-11 09:00 UTC", "Sun 01-18 09:00 UTC"]),
    ("0 9 * * 7", ["Sun 01-04 09:00 UTC", "Sun 01-11 09:00 UTC", "Sun 01-18 09:00 UTC"]),
    ("0 9 * * 5-7", ["Sat 01-03 09:00 UTC", "Sun 01-04 09:00 UTC", "Fri 01-09 09:00 UTC"]),
    ("0 9 * * */3", ["Sat 01-03 09:00 UTC", "Sun 01-04 09:00 UTC", "Wed 01-07 09:00 UTC"]),
    ("0 9 * * mon,Fri", ["Mon 01-05 09:00 UTC", "Fri 01-09 09:00 UTC", "Mon 01-12 09:00 UTC"]),
    # A restricted day of month and weekday: either one matching is enough (crontab).
    ("0 9 3 * 1", ["Sat 01-03 09:00 UTC", "Mon 01-05 09:00 UTC", "Mon 01-12 09:00 UTC"]),
])
def test_weekdays_and_day_fields_mean_what_they_mean_in_crontab(expr: str,
                                                                fires: list[str]) -> None:
    assert _fires(expr, FRIDAY) == fires


@pytest.mark.parametrize(("expr", "fires"), [
    # every other month: the step after a range of month names was ignored (every month)
    ("0 9 1 jan-dec/2 *", ["Sun 03-01 09:00 UTC", "Fri 05-01 09:00 UTC", "Wed 07-01 09:00 UTC"]),
    ("0 9 1 Feb-Jun/2 *", ["Sun 02-01 09:00 UTC", "Wed 04-01 09:00 UTC", "Mon 06-01 09:00 UTC"]),
    # from March on, every third month: a step after one name was ignored (March alone)
    ("0 9 1 mar/3 *", ["Sun 03-01 09:00 UTC", "Mon 06-01 09:00 UTC", "Tue 09-01 09:00 UTC"]),
    ("0 9 1 jan,jul *", ["Wed 07-01 09:00 UTC", "Fri 01-01 09:00 UTC", "Thu 07-01 09:00 UTC"]),
])
def test_month_names_with_a_step_mean_what_they_mean_in_crontab(expr: str,
                                                                fires: list[str]) -> None:
    """APScheduler reads a month name range (``jan-dec``) and drops the step after it: a job
    written for every other month ran every month."""
    assert _fires(expr, "2026-01-02T10:00:00+00:00") == fires


@pytest.mark.parametrize("expr", ["0 9 * jan-dec/0 *", "0 9 * foo-dec/2 *", "0 9 * dec-jan *"])
def test_a_month_field_crontab_refuses_is_refused(expr: str) -> None:
    with pytest.raises(rules.InvalidCronExpression):
        next_fire(expr, START)


@pytest.mark.parametrize(("day", "weekday", "either"), [
    ("*", "*", False), ("*", "1", False), ("1", "*", False),
    ("*/2", "1", False), ("1", "*/2", False), ("*/2", "*/3", False),
    ("1-5", "1", True), ("1,15", "mon,fri", True), ("13", "5", True), ("2-30/2", "1-5", True),
])
def test_either_day_field_matching_is_enough_only_when_neither_begins_with_a_star(
        day: str, weekday: str, either: bool) -> None:
    """Crontab (Vixie cron, cronie: ``DOM_STAR``/``DOW_STAR`` are set when the field *begins*
    with ``*``) counts ``*/2`` as unrestricted, so then both fields must match. (``?`` is
    Quartz's, not crontab's: refused, see below.)"""
    assert rules.either_day_matches(day, weekday) is either


JUNE = "2026-05-31T12:00:00+00:00"
"""The day before Monday 1 June 2026."""


@pytest.mark.parametrize(("expr", "fires"), [
    # odd days of the month that are Mondays (they were ORed: every odd day and every Monday)
    ("0 9 */2 * 1", ["Mon 06-01 09:00 UTC", "Mon 06-15 09:00 UTC", "Mon 06-29 09:00 UTC"]),
    # the 1st of the month when it is a Sunday, Tuesday, Thursday or Saturday
    ("0 9 1 * */2", ["Sat 08-01 09:00 UTC", "Tue 09-01 09:00 UTC", "Thu 10-01 09:00 UTC"]),
    # both restricted: the 13th, or any Friday
    ("0 9 13 * 5", ["Fri 06-05 09:00 UTC", "Fri 06-12 09:00 UTC", "Sat 06-13 09:00 UTC"]),
])
def test_a_day_field_beginning_with_a_star_is_unrestricted_so_both_must_match(
        expr: str, fires: list[str]) -> None:
    assert _fires(expr, JUNE) == fires


@pytest.mark.parametrize("expr", ["0 9 ? * 1", "0 9 1 * ?"])
def test_a_question_mark_day_field_is_refused(expr: str) -> None:
    with pytest.raises(rules.InvalidCronExpression):
        next_fire(expr, START)


def test_a_fixed_time_runs_once_when_clocks_go_back_and_a_frequent_job_runs_on() -> None:
    autumn = "2026-10-24T12:00:00+00:00"
    assert _fires("30 2 * * *", autumn, "Europe/Paris") == [
        "Sun 10-25 02:30 CEST", "Mon 10-26 02:30 CET", "Tue 10-27 02:30 CET"]
    assert _fires("*/30 * * * *", "2026-10-25T00:10:00+00:00", "Europe/Paris", 4) == [
        "Sun 10-25 02:30 CEST", "Sun 10-25 02:00 CET", "Sun 10-25 02:30 CET",
        "Sun 10-25 03:00 CET"]
    # An hour field naming every hour another way runs on through the repeated hour too.
    for every_hour in ("*/1", "0-23", "0-11,12-23"):
        assert _fires(f"*/30 {every_hour} * * *", "2026-10-25T00:10:00+00:00",
                      "Europe/Paris", 4)[1] == "Sun 10-25 02:00 CET", every_hour
    assert _fires("30 */2 * * *", "2026-10-25T00:10:00+00:00", "Europe/Paris", 2) == [
        "Sun 10-25 02:30 CEST", "Sun 10-25 04:30 CET"]  # not every hour: once
    # Spring: 02:30 does not exist that night; the job runs as the clock jumps past it.
    assert _fires("30 2 * * *", "2026-03-28T12:00:00+00:00", "Europe/Paris", 2) == [
        "Sun 03-29 03:30 CEST", "Mon 03-30 02:30 CEST"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("expr", "start", "timezone", "fires"), [
    # Chile springs forward at midnight: 00:00 of 6 September 2026 does not exist.
    ("0 0 * * *", "2026-09-05T12:00:00+00:00", "America/Santiago",
     ["Sun 09-06 01:00 -03", "Mon 09-07 00:00 -03"]),
    # Egypt too, on the last Friday of April.
    ("0 0 * * *", "2026-04-22T12:00:00+00:00", "Africa/Cairo",
     ["Thu 04-23 00:00 EET", "Fri 04-24 01:00 EEST", "Sat 04-25 00:00 EEST"]),
    # Every time of the missing hour: one run as the clock jumps past it, as in Paris.
    ("*/15 0 * * *", "2026-09-05T12:00:00+00:00", "America/Santiago",
     ["Sun 09-06 01:00 -03", "Mon 09-07 00:00 -03"]),
    ("30 0 * * 0", "2026-09-01T12:00:00+00:00", "America/Santiago",
     ["Sun 09-06 01:30 -03", "Sun 09-13 00:30 -03"]),
])
def test_a_time_missing_at_midnight_runs_once_as_the_clock_jumps_past_it(
        expr: str, start: str, timezone: str, fires: list[str]) -> None:
    # APScheduler moves to the next day at 00:00, finds 01:00 there and no hour 0: the
    # day was skipped, a daily job not run at all on the night clocks spring forward.
    assert _fires(expr, start, timezone, len(fires)) == fires


@pytest.mark.parametrize(("expr", "fragment"), [
    ("0 9 * * 8", "weekday '8'"), ("0 9 * * 5-2", "runs backwards"),
    ("0 9 * * mon-", "malformed"), ("0 9 * *", "4 fields"), ("0 9 * * * *", "6 fields"),
])
def test_a_malformed_weekday_or_field_count_is_named(expr: str, fragment: str) -> None:
    with pytest.raises(rules.InvalidCronExpression, match=fragment):
        next_fire(expr, START)


@pytest.mark.parametrize("expr", ["\u0661 * * * *", "0 \u0669 * * *", "0 9 \uff11 * *",
                                  "0 9 * \u0967 *", "*/\u0665 * * * *"])
def test_a_digit_of_another_script_is_refused_in_every_field(expr: str) -> None:
    """Crontab's digits are ASCII: APScheduler's ``\\d`` read an Arabic-Indic one as 1,
    so the job ran at minute 1 where crontab refuses the line (as the weekday field
    already did)."""
    with pytest.raises(rules.InvalidCronExpression, match="ASCII"):
        next_fire(expr, START)


def test_a_cron_expression_is_bounded_and_every_full_list_fits() -> None:
    """A 240 KB expression was stored, and each next-run computation walked it (a
    second of CPU each). Every value of every field listed one by one still fits."""
    every = " ".join(",".join(str(v) for v in values) for values in (
        range(60), range(24), range(1, 32), range(1, 13), range(7)))
    assert next_fire(every, START) == START + 60
    long = "0 9 * * " + ",".join(["1"] * 300)
    with pytest.raises(rules.InvalidCronExpression, match="the limit is 512") as caught:
        next_fire(long, START)
    assert len(str(caught.value)) < 300  # the expression is not quoted whole


EVERY_VALUE = " ".join(",".join(str(v) for v in values) for values in (
    range(60), range(24), range(1, 32), range(1, 13), range(7)))
"""Every value of every field listed one by one: 359 characters, an expression the rules
take."""


@pytest.mark.timeout(60)
def test_every_expression_the_rules_take_is_stored_on_every_backend(
        any_db_url: str, clock: ManualClock, tmp_path: Path) -> None:
    """The cron columns were 128 characters wide: on PostgreSQL an expression the rules take
    (up to 512) failed to insert, a job with a DataError, and a Focal wake-up inside its
    turn's commit, which failed the whole turn."""
    from kinbox.actors.access import FOCAL_ID
    from kinbox.persistence import CRON_EXPRESSION_CHARS

    assert rules.EXPRESSION_LIMIT == CRON_EXPRESSION_CHARS  # the rules' limit is stored
    with Runtime(db=any_db_url, brain=CronBrain(), clock=clock,
                 data_dir=tmp_path / "data") as rt:
        job = rt.cron.add("all of them", EVERY_VALUE, "Say so.")
        assert rt.cron.job(job["job_id"])["cron"] == EVERY_VALUE
        rt.get_or_create_focal_chat()
        wake = rt.tools_for(FOCAL_ID).schedule_wakeup("check", cron=EVERY_VALUE)
        assert [w["cron"] for w in rt.focal.panel()["wakeups"]] == [EVERY_VALUE]
        clock.advance(MINUTE)
        rt.run_until_idle()
        assert [r["status"] for r in rt.cron.runs(job["job_id"])] == ["success"]
        assert wake["job_id"]


def test_the_announcement_queue_is_bounded_and_drained() -> None:
    queue = Announcements(bound=3)
    for i in range(5):
        queue.add({"n": i})
    drained = queue.drain()
    assert [a["n"] for a in drained] == [2, 3, 4]
    assert drained.dropped == 2  # type: ignore[attr-defined]
    again = queue.drain()
    assert again == [] and again.dropped == 0  # type: ignore[attr-defined]


def test_a_drain_reports_the_announcements_dropped_since_the_last_one(
        make_runtime: MakeRuntime) -> None:
    """The queue counted what it dropped 'so the UI can say that it missed some', and
    no drain ever said it (nor started counting again)."""
    rt = make_runtime(brain=CronBrain())
    queue = rt.cron.announcements
    for i in range(queue.bound + 2):
        queue.add({"n": i})
    drained = rt.cron.drain_announcements()
    assert [a["n"] for a in drained] == list(range(2, queue.bound + 2))
    assert getattr(drained, "dropped", None) == 2
    queue.add({"n": "next"})
    again = rt.cron.drain_announcements()
    assert again == [{"n": "next"}] and getattr(again, "dropped", None) == 0


# -- definitions -------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_an_add_whose_session_write_fails_leaves_no_job_behind(
        make_runtime: MakeRuntime, any_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job and its session were two transactions: the session's failing (a database
    error) answered the add as failed (503 "try again" over HTTP) with the job committed,
    and the caller's retry added a second job, each run of the schedule twice. Both commit
    together now, or neither does."""
    from kinbox.persistence import PersistenceError
    from kinbox.persistence.driver_errors import OperationalError

    rt = make_runtime(brain=CronBrain(), db=any_db_url)
    sessions = rt.context.store
    real = sessions.create_session_now
    failures: list[str] = []

    def refused(session_id: str, *args: Any, **kwargs: Any) -> Any:
        if session_id.startswith("cron-") and not failures:
            failures.append(session_id)
            raise OperationalError("could not extend file: No space left on device")
        return real(session_id, *args, **kwargs)

    monkeypatch.setattr(sessions, "create_session_now", refused)
    with pytest.raises(PersistenceError):
        rt.cron.add("digest", "0 9 * * *", "Summarize")
    assert failures and rt.cron.jobs() == []
    job = rt.cron.add("digest", "0 9 * * *", "Summarize")  # the caller's retry
    assert [j["job_id"] for j in rt.cron.jobs()] == [job["job_id"]]
    assert rt.session(f"cron-{job['job_id']}") is not None


def test_an_invalid_job_is_refused_and_nothing_is_written(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=CronBrain())
    for args, error, fragment in (
            (("j", "every day", "p"), rules.InvalidCronExpression, "crontab"),
            (("j", "61 * * * *", "p"), rules.InvalidCronExpression, "crontab"),
            (("", "* * * * *", "p"), rules.InvalidCronJob, "name"),
            (("j", "* * * * *", "  "), rules.InvalidCronJob, "prompt")):
        with pytest.raises(error, match=fragment):
            rt.cron.add(*args)
    with pytest.raises(rules.InvalidCronJob, match="delivery"):
        rt.cron.add("j", "* * * * *", "p", delivery="email")
    with pytest.raises(rules.InvalidCronJob, match="time zone") as info:
        rt.cron.add("j", "* * * * *", "p", timezone="Mars/Olympus")
    assert info.value.field == "timezone"
    # Zones the zone database answers that mean another time on another machine (or none).
    for zone in ("localtime", "posixrules", "Factory", "right/Europe/Paris"):
        with pytest.raises(rules.InvalidCronJob, match="time zone") as info:
            rt.cron.add("j", "* * * * *", "p", timezone=zone)
        assert info.value.field == "timezone", zone
    assert rt.cron.jobs() == [] and [s for s in rt.sessions() if s.kind == "cron"] == []


def test_a_zone_of_the_machines_posix_folder_is_refused_naming_its_iana_name(
        make_runtime: MakeRuntime) -> None:
    """``posix/Europe/Paris`` is a file of this machine's zone folder, not a zone name: a
    machine on the database whose zones come from the ``tzdata`` package (a slim container)
    has no such zone, and there the job was deactivated when it came due. It is refused
    as the job's time zone, naming the IANA name to give instead."""
    rt = make_runtime(brain=CronBrain())
    with pytest.raises(rules.InvalidCronJob, match="'Asia/Tokyo'") as info:
        rt.cron.add("j", "* * * * *", "p", timezone="posix/Asia/Tokyo")
    assert info.value.field == "timezone"
    assert rt.cron.jobs() == []


def test_a_due_job_runs_a_turn_in_its_cron_session_with_the_reminder(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    brain = CronBrain()
    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    session = rt.session(f"cron-{job_id}")
    assert session is not None and (session.kind, session.project_id) == ("cron", "default")
    clock.advance(MINUTE)
    rt.run_until_idle()
    [run] = rt.cron.runs(job_id)
    assert run["status"] == "success" and run["result"] == f"done {run['run_id']}"
    first = rt.transcript(f"cron-{job_id}")[0].text
    assert first.startswith('<system-reminder>Scheduled cron job "tick" is running. '
                            'Local time: 2023-11-14 22:15 UTC. Last run: never.')
    assert first.endswith("Say what time it is.")
    clock.advance(MINUTE)
    rt.run_until_idle()
    assert "Last run: 2023-11-14 22:15 UTC" in rt.transcript(f"cron-{job_id}")[2].text
    job = rt.cron.job(job_id)
    assert job["next_run_at"] == clock.now() + MINUTE and job["last_error"] is None
    assert [a["status"] for a in rt.cron.drain_announcements()] == ["success", "success"]
    assert rt.cron.drain_announcements() == []
    assert all(m.kind == "cron" for t in brain.turns for m in t.messages)
    assert rt.inbox() == []  # cron runs never touch the inbox


def test_a_job_with_delivery_none_is_not_announced(make_runtime: MakeRuntime,
                                                   clock: ManualClock) -> None:
    rt = make_runtime(brain=CronBrain())
    every_minute(rt, delivery="none")
    clock.advance(MINUTE)
    rt.run_until_idle()
    assert rt.cron.drain_announcements() == []


def test_failures_back_off_1_2_4_8_16_minutes_then_deactivate(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    brain = CronBrain()
    brain.failing = "model unavailable"
    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    for delay in (1, 2, 4, 8, 16):
        job = rt.cron.job(job_id)
        assert job["active"] and job["next_run_at"] == clock.now() + delay * MINUTE
        clock.advance(delay * MINUTE - 1)
        rt.run_until_idle()
        assert len(rt.cron.runs(job_id)) == 1 + [1, 2, 4, 8, 16].index(delay)  # not yet
        clock.advance(1)
        rt.run_until_idle()
    job = rt.cron.job(job_id)
    assert not job["active"] and job["next_run_at"] is None
    assert job["last_error"] == "Max retries exceeded: RuntimeError: model unavailable"
    runs = rt.cron.runs(job_id)
    assert len(runs) == 6 and {r["status"] for r in runs} == {"error"}
    assert [r["attempts"] for r in reversed(runs)] == [1, 2, 3, 4, 5, 6]
    assert rt.transcript(f"cron-{job_id}") == []  # a failed turn commits nothing
    clock.advance(3600)
    rt.run_until_idle()
    assert len(rt.cron.runs(job_id)) == 6
    brain.failing = None
    rt.cron.resume(job_id)
    assert rt.cron.job(job_id)["retry_count"] == 0


def test_a_retry_missed_while_down_ends_its_retries(db_url: str, clock: ManualClock) -> None:
    """A failed run's retry missed while the runtime was down (past the grace time) moves
    the job on to its next regular time, and that occurrence is a new one: it kept the
    retries its predecessor had used, so its own failures deactivated the job sooner (four
    retries used: at its first failure)."""
    brain = CronBrain()
    brain.failing = "model unavailable"
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        job_id = str(rt.cron.add("daily", "0 9 * * *", "Sum up.")["job_id"])
        rt.cron.trigger(job_id)
        rt.run_until_idle()
        for delay in (1, 2, 4):
            clock.advance(delay * MINUTE)
            rt.run_until_idle()
        assert rt.cron.job(job_id)["retry_count"] == 4
    clock.advance(3 * 3600)  # the fourth retry, 8 minutes on, is past the grace time
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        rt.run_until_idle()
        job = rt.cron.job(job_id)
        assert len(rt.cron.runs(job_id)) == 4
        assert job["next_run_at"] == next_fire("0 9 * * *", clock.now())
        assert job["retry_count"] == 0
        clock.advance(job["next_run_at"] - clock.now())
        rt.run_until_idle()  # the next occurrence fails: retried, not deactivated
        job = rt.cron.job(job_id)
        assert job["active"] and job["next_run_at"] == clock.now() + MINUTE


def test_a_success_resets_the_retry_count(make_runtime: MakeRuntime, clock: ManualClock) -> None:
    brain = CronBrain()
    brain.failing = "flaky"
    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "p")["job_id"])
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    assert rt.cron.job(job_id)["retry_count"] == 1
    brain.failing = None
    clock.advance(MINUTE)
    rt.run_until_idle()
    job = rt.cron.job(job_id)
    assert job["retry_count"] == 0 and job["last_error"] is None
    assert job["next_run_at"] == next_fire("0 0 1 1 *", clock.now())


def test_a_run_still_active_when_the_next_is_due_is_recorded_as_an_error(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    brain = CronBrain()
    brain.hold.set()
    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    clock.advance(MINUTE)
    assert brain.holding.wait(20)
    clock.advance(MINUTE)  # the first run still holds the brain
    refused = [r for r in rt.cron.runs(job_id) if r["status"] == "error"]
    assert [r["error"] for r in refused] == ["Previous cron run is still active"]
    brain.release.set()
    rt.run_until_idle()
    statuses = sorted(r["status"] for r in rt.cron.runs(job_id))
    assert statuses == ["error", "success"]
    assert rt.cron.job(job_id)["retry_count"] == 0  # a refusal is not a failure


def test_pause_resume_trigger_and_remove(make_runtime: MakeRuntime, clock: ManualClock) -> None:
    rt = make_runtime(brain=CronBrain())
    job_id = every_minute(rt)
    assert rt.cron.pause(job_id)["active"] is False
    clock.advance(5 * MINUTE)
    rt.run_until_idle()
    assert rt.cron.runs(job_id) == []
    with pytest.raises(rules.CronJobPaused):
        rt.cron.trigger(job_id)
    assert rt.cron.resume(job_id)["next_run_at"] == clock.now() + MINUTE
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
    assert rt.cron.remove(job_id) == {"job_id": job_id, "removed": True}
    for action in (rt.cron.job, rt.cron.pause, rt.cron.resume, rt.cron.trigger, rt.cron.remove,
                   rt.cron.runs):
        with pytest.raises(rules.CronJobNotFound):
            action(job_id)


def test_a_runtime_without_a_brain_keeps_definitions_but_runs_nothing(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    rt = make_runtime()
    job_id = every_minute(rt)
    clock.advance(10 * MINUTE)
    assert rt.cron.tick() == []
    assert rt.cron.runs(job_id) == [] and rt.cron.job(job_id)["active"]


# -- restarts ----------------------------------------------------------------------------------

def test_a_job_due_during_downtime_runs_once_within_its_grace_time(
        db_url: str, clock: ManualClock) -> None:
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        job_id = every_minute(rt)
        nightly = str(rt.cron.add("nightly", "30 22 * * *", "Sum up.")["job_id"])
    at_2230 = START + 16 * MINUTE
    clock.advance(10 * MINUTE)  # ten occurrences missed while down
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        rt.run_until_idle()
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
        assert rt.cron.job(job_id)["next_run_at"] == clock.now() + MINUTE
        assert rt.cron.runs(nightly) == []  # not due yet
    clock.advance(2 * 3600)  # 22:30 is beyond the grace time (an hour): skipped, moves on
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        rt.run_until_idle()
        assert rt.cron.runs(nightly) == []
        assert rt.cron.job(nightly)["next_run_at"] == at_2230 + 24 * 3600
        # The every-minute job's latest occurrence is under a minute old: it runs.
        assert len(rt.cron.runs(job_id)) == 2
        assert rt.cron.job(job_id)["next_run_at"] == clock.now() + MINUTE


def test_an_occurrence_within_the_grace_time_runs_though_an_earlier_missed_one_is_not(
        db_url: str, clock: ManualClock) -> None:
    """An hourly job down from before 23:00 to 00:05: 23:00 is past the grace time (an
    hour), 00:00 is five minutes late, and runs; it was skipped with the 23:00 one."""
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        job_id = str(rt.cron.add("hourly", "0 * * * *", "Report.")["job_id"])
        first = rt.cron.job(job_id)["next_run_at"]
    clock.advance(first + 3600 + 5 * MINUTE - clock.now())
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        rt.run_until_idle()
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
        assert rt.cron.job(job_id)["next_run_at"] == first + 2 * 3600


def test_a_schedule_written_by_a_clock_ahead_runs_on_once_the_clock_is_set_back(
        db_url: str) -> None:
    """A machine whose clock ran three days ahead, then corrected: each job's next run
    was computed from the clock that was ahead, and none ran for three days."""
    ahead = ManualClock(START + 3 * 86400)
    with Runtime(db=db_url, brain=CronBrain(), clock=ahead) as rt:
        job_id = every_minute(rt)
        nightly = str(rt.cron.add("nightly", "30 22 * * *", "Sum up.")["job_id"])
        ahead.advance(MINUTE)
        rt.run_until_idle()
    clock = ManualClock(START + 30)  # 22:14:30, three days earlier
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        clock.advance(30)
        rt.run_until_idle()
        assert len(rt.cron.runs(job_id)) == 2  # the one ahead, and this minute's
        assert rt.cron.job(job_id)["next_run_at"] == clock.now() + MINUTE
        assert rt.cron.job(nightly)["next_run_at"] == START + 16 * MINUTE  # tonight
        clock.advance(15 * MINUTE)
        rt.run_until_idle()
        assert [r["status"] for r in rt.cron.runs(nightly)] == ["success"]


@pytest.mark.timeout(60)
def test_a_trigger_stored_by_a_clock_ahead_runs_at_once_after_the_clock_is_set_back(
        db_url: str) -> None:
    """An operator triggers a nightly job while no runtime with a brain is up, on a
    machine whose clock reads three hours ahead; the clock is corrected, a worker starts.
    The trigger's due time was the clock-ahead "now": it waited three hours (or moved to
    the job's next regular time, were that sooner), though a trigger means "run it now"."""
    ahead = ManualClock(START + 3 * 3600)
    with Runtime(db=db_url, clock=ahead) as rt:  # send-only: stores the trigger
        job_id = str(rt.cron.add("nightly", "0 12 * * *", "Sum up.")["job_id"])
        rt.cron.trigger(job_id)
    clock = ManualClock(START)
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        rt.run_until_idle()
        assert rt.cron.wait_idle(10)
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
        job = rt.cron.job(job_id)
        assert (job["triggered_at"], job["next_run_at"]) == (None, next_fire(
            "0 12 * * *", clock.now()))


@pytest.mark.timeout(60)
def test_an_occurrence_runs_once_when_a_clock_a_few_seconds_behind_wrote_its_job(
        db_url: str) -> None:
    """Runtimes on one database whose clocks differ by seconds (within the tolerance):
    one fires the 08:00 run; an operator's pause and resume on the other, whose clock
    still reads 07:59:57, puts the job at 08:00 again. The run's id (job and due time)
    makes that occurrence one run: counted as another (a run that began after the job's
    last write, taken for one a clock ahead had run), it ran twice."""
    eight = next_fire("0 8 * * *", START)
    assert eight is not None
    brain = CronBrain()
    clock = ManualClock(eight - 30)
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        job_id = str(rt.cron.add("daily", "0 8 * * *", "Good morning.")["job_id"])
        clock.advance(30)
        rt.run_until_idle()
        assert rt.cron.wait_idle(10)
    behind = ManualClock(eight - 3)
    with Runtime(db=db_url, clock=behind) as rt:  # send-only: the operator's commands
        rt.cron.pause(job_id)
        assert rt.cron.resume(job_id)["next_run_at"] == eight
    clock.advance(1)
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        rt.run_until_idle()
        assert rt.cron.wait_idle(10)
        assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
    assert len(brain.turns) == 1


def test_a_clock_a_little_behind_the_last_write_moves_no_schedule() -> None:
    """Another runtime's clock may read ahead of this one (by up to the tolerance, an
    hour): its writes in this clock's future are no step back, and a retry's later time
    stays."""
    now = 1000.0
    assert rules.after_clock_step_back(now + 5, now + 240, now, now + 60) is None
    assert rules.after_clock_step_back(now + 3 * 86400, now + 3 * 86400 + 60, now,
                                       now + 60) == now + 60
    # Set back, but due no later than the schedule puts it from now: kept.
    assert rules.after_clock_step_back(now + 7200, now + 30, now, now + 60) is None
    assert rules.after_clock_step_back(now + 7200, now + 9000, now, None) is None
    assert rules.after_clock_step_back(now + 600, now + 660, now, now + 60) is None


def test_no_run_is_lost_or_doubled_across_a_crash_mid_turn(db_url: str,
                                                         clock: ManualClock) -> None:
    brain = CronBrain()
    brain.hold.set()
    rt = Runtime(db=db_url, brain=brain, clock=clock).start()
    job_id = every_minute(rt)
    clock.advance(MINUTE)
    assert brain.holding.wait(20)
    rt.crash()  # the run is "running", owned by a dead runtime
    brain.release.set()
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt2:
        rt2.run_until_idle()
        [run] = rt2.cron.runs(job_id)
        assert run["status"] == "success" and run["attempts"] == 2
        entries = [e for e in rt2.transcript(f"cron-{job_id}") if e.role == "user"]
        assert [e.message_id for e in entries] == [run["run_id"]]  # committed once
        clock.advance(MINUTE)
        rt2.run_until_idle()
        assert sorted(r["status"] for r in rt2.cron.runs(job_id)) == ["success", "success"]


@pytest.mark.timeout(60)
def test_a_run_left_running_by_a_removed_job_is_dropped_not_taken_over_for_ever(
        db_url: str, clock: ManualClock) -> None:
    """A removal that raced a fire in an earlier version (PostgreSQL) left the fire's run
    ``running`` with no job. Each takeover ran it, its turn found no job and returned
    without finishing it, and at its lease's end it was taken over again, for ever."""
    with Runtime(db=db_url, clock=clock) as rt:  # send-only: fires nothing itself
        job_id = every_minute(rt)
        store = rt.cron.store
        assert store.fire_due(clock.now() + MINUTE, "a-runtime-now-gone", 30.0,
                               lambda job, running: Occurrence(
                                   {"next_run_at": clock.now() + 2 * MINUTE}, "running"))
        store.writer.call(lambda: store.t.cron_job.delete().where(
            store.t.cron_job.id == job_id).execute())
    brain = CronBrain()
    with Runtime(db=db_url, brain=brain, clock=clock) as rt:
        for _ in range(3):  # past a lease each time
            clock.advance(MINUTE)
            rt.run_until_idle()
            assert rt.cron.wait_idle(10)
        assert rt.cron.runs() == []  # removed with its job, as a removal does
        assert rt.cron.store.running_owners() == set()
        assert brain.turns == []


def test_jobs_survive_a_restart_with_their_next_run(db_url: str, clock: ManualClock,
                                                   tmp_path: Path) -> None:
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        job_id = every_minute(rt)
        paused = str(rt.cron.add("off", "0 * * * *", "p")["job_id"])
        rt.cron.pause(paused)
        before = rt.cron.jobs()
    with Runtime(db=db_url, brain=CronBrain(), clock=clock) as rt:
        assert rt.cron.jobs() == before
        clock.advance(MINUTE)
        rt.run_until_idle()
        assert len(rt.cron.runs(job_id)) == 1 and rt.cron.runs(paused) == []


def test_an_inbox_message_to_a_cron_session_waits_for_the_running_cron_turn(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    brain = CronBrain()
    brain.hold.set()
    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    clock.advance(MINUTE)
    assert brain.holding.wait(20)
    rt.post(f"cron-{job_id}", "a note while the run is busy")
    wait_for(lambda: rt.statistics()["busy"] == 1, 20, "the inbox turn to be claimed")
    assert len(brain.turns) == 1  # the inbox turn waits for the cron turn to end
    brain.release.set()
    rt.run_until_idle()
    roles = [(e.role, e.message_id) for e in rt.transcript(f"cron-{job_id}")]
    [run] = rt.cron.runs(job_id)
    assert roles[0] == ("user", run["run_id"]) and roles[1][0] == "assistant"
    assert roles[2][0] == "user" and roles[2][1].startswith("msg-")  # one turn after the other
    assert [t.messages[0].kind for t in brain.turns] == ["cron", "agent_message"]


@pytest.mark.timeout(30)
def test_an_inbox_turn_waiting_for_a_cron_turn_at_a_stop_hands_its_row_back_unrun(
        make_runtime: MakeRuntime, clock: ManualClock, db_url: str) -> None:
    """The stop asks the running turns to stop; an inbox turn that gets the board only once
    the cron turn ends was never asked, and ran its whole brain inside the stop."""
    cron_running = threading.Event()
    inbox_turns: list[bool] = []

    def brain(turn: Turn) -> str:
        if turn.messages[0].kind == "cron":
            cron_running.set()
            turn.wait_stop_requested(10)
            return "stopped"
        inbox_turns.append(turn.wait_stop_requested(3))
        return "ran"

    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    clock.advance(MINUTE)
    assert cron_running.wait(20)
    note = rt.post(f"cron-{job_id}", "a note while the run is busy")
    # Leased with its send, the row waits for the cron turn to end, holding no slot.
    wait_for(lambda: f"cron-{job_id}" in rt.context.slots.waiting,  # type: ignore[union-attr]
             20, "the note to wait in the slot table")
    rt.stop()
    assert inbox_turns == []  # never started, so never asked to stop
    after = make_runtime()  # send-only: reads the journal
    [row] = [r for r in after.inbox() if r["message_id"] == note.message_id]
    assert (row["status"], row["attempts"]) == ("pending", 0)


@pytest.mark.timeout(30)
def test_a_cron_turn_waiting_for_an_inbox_turn_at_a_stop_does_not_run(
        make_runtime: MakeRuntime, clock: ManualClock, db_url: str) -> None:
    """The stop asks the running turns to stop; a cron turn that gets its session's board
    only once the inbox turn there ends was never asked, and ran its whole brain inside
    the stop. It does not start: its run is taken over at the next start, as after a
    kill."""
    inbox_running = threading.Event()
    cron_turns: list[bool] = []

    def brain(turn: Turn) -> str:
        if turn.messages[0].kind != "cron":
            inbox_running.set()
            turn.wait_stop_requested(10)
            return "stopped"
        cron_turns.append(turn.wait_stop_requested(3))
        return "ran"

    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    sid = f"cron-{job_id}"
    rt.post(sid, "a note before the run")
    assert inbox_running.wait(20)
    waiting = waits_for_its_session(rt)
    rt.cron.trigger(job_id)
    assert waiting.wait(20)  # the cron turn waits for the inbox turn to end
    rt.stop()
    assert cron_turns == []  # never started, so never asked to stop
    after = make_runtime()  # send-only: reads the database
    assert [r["status"] for r in after.cron.runs(job_id)] == ["running"]
    assert [e.text for e in after.transcript(sid)] == ["a note before the run", "stopped"]


@pytest.mark.timeout(30)
def test_a_cron_turn_waiting_for_an_inbox_turn_that_never_ends_lets_go_at_the_stop(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """A cron turn waits for its session's inbox turn to end. That brain ignores the stop
    and never returns: the cron turn's thread waited for it for good after the stop (a
    thread the interpreter joins at exit, so the process never ended). The stop lets it go:
    the turn does not start, and its run is taken over at the next start."""
    inbox_running, release = threading.Event(), threading.Event()
    cron_turns: list[str] = []

    def brain(turn: Turn) -> str:
        if turn.messages[0].kind != "cron":
            inbox_running.set()
            release.wait(20)  # deaf to the stop
            return "late"
        cron_turns.append(turn.session_id)
        return "ran"

    rt = make_runtime(brain=brain)
    try:
        job_id = every_minute(rt)
        rt.post(f"cron-{job_id}", "a note before the run")
        assert inbox_running.wait(20)
        waiting = waits_for_its_session(rt)
        rt.cron.trigger(job_id)
        assert waiting.wait(20)  # the cron turn waits for the inbox turn to end
        rt.stop(timeout=0.5)
        wait_for(lambda: not any(t.name.startswith("kinbox-direct")
                                 for t in threading.enumerate()), 10,
                 "the cron turn's thread to be let go")
        assert cron_turns == []
    finally:
        release.set()


@pytest.mark.timeout(30)
def test_an_inbox_turn_waiting_for_a_cron_turn_that_never_ends_hands_its_row_back(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    """The other way round: an inbox row of the cron session waits for the cron turn, whose
    brain ignores the stop. The stop lets the wait go and the row goes back at once, for the
    next start; it was left ``processing``, its session actor waiting, until its lease ran
    out."""
    cron_running, release = threading.Event(), threading.Event()

    def brain(turn: Turn) -> str:
        if turn.messages[0].kind == "cron":
            cron_running.set()
            release.wait(20)  # deaf to the stop
            return "late"
        return "ran"

    rt = make_runtime(brain=brain)
    try:
        job_id = every_minute(rt)
        rt.cron.trigger(job_id)
        assert cron_running.wait(20)
        rt.post(f"cron-{job_id}", "a note during the run")
        # Leased with its send, the row waits for the cron turn to end, holding no slot.
        wait_for(lambda: f"cron-{job_id}" in rt.context.slots.waiting,  # type: ignore[union-attr]
                 20, "the note to wait in the slot table")
        rt.stop(timeout=0.5)
        after = make_runtime()  # send-only: reads the database
        assert [r["status"] for r in after.inbox(target=f"cron-{job_id}")] == ["pending"]
    finally:
        release.set()


def test_the_apscheduler_driver_fires_at_the_time_it_was_told_and_on_its_poll() -> None:
    from kinbox.actors.schedule_driver import ScheduleDriver

    fired: list[float] = []
    woken = threading.Event()

    def fire() -> None:
        fired.append(time.time())
        woken.set()

    at = ScheduleDriver(fire, enabled=True, now=time.time)
    at.start()
    try:
        due = time.time() + 0.2
        at.wake_at(due, "job")
        assert woken.wait(20) and fired[0] >= due - 0.05
    finally:
        at.stop()
    woken.clear()
    polling = ScheduleDriver(fire, enabled=True, now=time.time, poll_seconds=0.1)
    polling.start()
    try:
        assert woken.wait(20)
    finally:
        polling.stop()
    # An injected clock: the runtime ticks instead.
    off = ScheduleDriver(fire, enabled=False, now=time.time)
    off.start()
    off.wake_at(time.time(), "job")
    assert not off.enabled
    off.stop()


@pytest.mark.timeout(30)
def test_a_poll_a_wall_clock_set_back_stalled_is_fired_and_rearmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """APScheduler computes its times on the wall clock: set back an hour, its poll (and
    every wake-up) waited for the clock to catch up, and no schedule fired for an hour.
    The runtime's tick (on the monotonic clock) fires a poll overdue by two periods and
    re-arms it from the clock as it reads now."""
    import apscheduler.executors.base
    import apscheduler.schedulers.base
    import apscheduler.triggers.date
    import apscheduler.triggers.interval

    from kinbox.actors.schedule_driver import ScheduleDriver

    real = dt.datetime
    behind = [0.0]

    class WallClock(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Any:  # type: ignore[override]
            return real.now(tz) - dt.timedelta(seconds=behind[0])

    for module in (apscheduler.executors.base, apscheduler.schedulers.base,
                   apscheduler.triggers.date, apscheduler.triggers.interval):
        monkeypatch.setattr(module, "datetime", WallClock)  # its readings of the wall clock
    woken = threading.Event()
    driver = ScheduleDriver(woken.set, enabled=True, now=time.time, poll_seconds=0.2)
    driver.start()
    try:
        assert woken.wait(20)  # the poll runs
        behind[0] = 3600.0  # the wall clock is set back an hour
        woken.clear()
        if woken.wait(1.0):  # a poll that read the clock before it went back, run late
            woken.clear()
            assert not woken.wait(1.0)  # five periods: the poll waits for the clock

        def ticked() -> bool:
            driver.keep_polling()  # as the runtime's tick calls it
            return woken.is_set()
        wait_for(ticked, timeout=10, what="the stalled poll fired by the tick")
        woken.clear()
        assert woken.wait(20)  # and the poll runs on by itself again
    finally:
        driver.stop()


@pytest.mark.timeout(30)
def test_the_tick_never_waits_for_a_fire_that_began_after_its_look(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick's look for a stalled poll and its own fire were two steps: a fire that
    APScheduler's thread began between them (a wake-up, the poll itself) was waited for
    on the tick's thread, the very wait the look was there to avoid (its cron lease
    renewals, takeovers and dispatcher ticks held up for as long as that fire ran)."""
    from types import SimpleNamespace

    from kinbox.actors import schedule_driver
    from kinbox.actors.schedule_driver import ScheduleDriver

    monotonic = [1000.0]
    monkeypatch.setattr(schedule_driver, "time", SimpleNamespace(monotonic=lambda: monotonic[0]))
    fired = threading.Event()
    driver = ScheduleDriver(fired.set, enabled=True, now=lambda: 0.0, poll_seconds=600)
    real = threading.Lock()

    class FireBeginsAfterTheLook:
        """The driver's fire lock, taken by another fire the moment the tick first looks
        at it (APScheduler's thread, in the window between look and fire)."""

        looked = False

        def _look(self) -> bool:
            was = real.locked()
            if not self.looked:
                self.looked = True
                real.acquire()  # the other fire begins now, and runs on
            return was

        def locked(self) -> bool:
            return self._look()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if not blocking:
                self._look()
            return real.acquire(blocking, timeout)

        def release(self) -> None:
            real.release()

        def __enter__(self) -> bool:
            return self.acquire()

        def __exit__(self, *exc: object) -> None:
            self.release()

    driver.start()
    try:
        monkeypatch.setattr(driver, "_firing", FireBeginsAfterTheLook())
        monotonic[0] += 3 * 600  # the poll is overdue: the tick fires it
        tick = threading.Thread(target=driver.keep_polling, daemon=True)
        tick.start()
        tick.join(5)
        assert not tick.is_alive(), "the tick waited for the fire another thread began"
        assert not fired.is_set()  # that fire is the poll; the tick fired none of its own
    finally:
        if real.locked():
            real.release()  # the other fire ends
        driver.stop()


def test_an_async_brain_runs_cron_turns_on_the_runtimes_loop(make_runtime: MakeRuntime,
                                                             clock: ManualClock) -> None:
    import asyncio

    seen: list[tuple[str, bool]] = []

    async def brain(turn: Turn) -> str:
        await asyncio.sleep(0)  # really awaited, on the runtime's event loop
        listed = await turn.tools.agent_list()
        seen.append((turn.messages[0].kind, isinstance(listed, dict)))
        return "async done"

    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    clock.advance(MINUTE)
    rt.run_until_idle()
    [run] = rt.cron.runs(job_id)
    assert (run["status"], run["result"]) == ("success", "async done")
    assert seen == [("cron", True)]


def test_an_async_brain_that_returns_without_being_async_fails_the_run(
        make_runtime: MakeRuntime, clock: ManualClock) -> None:
    async def helper(turn: Turn) -> str:
        return "never run"

    def brain(turn: Turn) -> object:
        return helper(turn)  # a sync brain handing back a coroutine: an error, not a reply

    rt = make_runtime(brain=brain)
    job_id = every_minute(rt)
    clock.advance(MINUTE)
    rt.run_until_idle()
    [run] = rt.cron.runs(job_id)
    assert run["status"] == "error" and "SyncBrainAwaitable" in run["error"]


@pytest.mark.timeout(60)
def test_a_second_trigger_of_one_occurrence_runs_no_unrecorded_turn(
        make_runtime: MakeRuntime) -> None:
    """Two triggers at one clock reading are one occurrence: one run, recorded. SQLite
    answered the second run's ignored insert with the first one's rowid, so its brain ran
    a whole turn whose commit was then refused: effects outside kinbox for a run nobody
    recorded."""
    seen: list[str] = []

    def brain(turn: Turn) -> str:
        seen.append(turn.messages[0].message_id)
        return "ok"

    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("digest", "0 9 * * *", "Summarize")["job_id"])
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    assert rt.cron.wait_idle(10)
    rt.cron.trigger(job_id)  # the clock has not moved
    rt.run_until_idle()
    assert rt.cron.wait_idle(10)
    assert len(rt.cron.runs(job_id)) == 1
    assert len(seen) == 1, seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_run_whose_commit_always_fails_backs_off_then_deactivates_its_job(
        make_runtime: MakeRuntime, clock: ManualClock, kind: str) -> None:
    """A run whose turn the database refused to commit (a value it will not store, a hook's
    write that conflicts) was left ``running``, its lease no longer renewed: once the lease
    ran out the run was taken over and its brain, a model call, ran again, every lease, for
    ever, no failure counted. Each refusal is a failed run now: the job backs off 1, 2, 4,
    8, 16 minutes as for a brain's error, then is deactivated; no run is run twice."""
    from kinbox.actors.context import TurnEffects
    from kinbox.persistence.driver_errors import OperationalError

    brain = CronBrain()

    async def async_brain(turn: Turn) -> str:
        return brain(turn)

    rt = make_runtime(brain=brain if kind == "sync" else async_brain)

    def refusing(ctx: Any, turn: Turn, outcome: Any) -> Any:
        def op() -> None:
            raise OperationalError("value too long for type character varying(64)")
        return TurnEffects(ops=[op]) if outcome.ok else None

    rt.context.outbox_hooks.append(refusing)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    assert rt.cron.wait_idle(10)
    for n, delay in enumerate((1, 2, 4, 8, 16), start=1):
        wait_for(lambda n=n: [r["status"] for r in rt.cron.runs(job_id)] == ["error"] * n, 10,
                 f"failed run {n} recorded ({len(brain.turns)} turns ran)")
        assert "value too long" in str(rt.cron.runs(job_id)[0]["error"])
        job = rt.cron.job(job_id)
        assert job["active"] and job["retry_count"] == n
        assert job["next_run_at"] == clock.now() + delay * MINUTE
        clock.advance(rt.context.lease_seconds + 1)  # past the lease: nothing takes it over
        rt.run_until_idle()
        assert rt.cron.wait_idle(10)
        assert len(brain.turns) == n and len(rt.cron.runs(job_id)) == n
        clock.advance(delay * MINUTE - rt.context.lease_seconds - 1)
        rt.run_until_idle()
        assert rt.cron.wait_idle(10)
    wait_for(lambda: not rt.cron.job(job_id)["active"], 10, "the job deactivated")
    job = rt.cron.job(job_id)
    assert job["next_run_at"] is None and str(job["last_error"]).startswith(
        "Max retries exceeded: ")
    runs = rt.cron.runs(job_id)
    assert len(runs) == 6 and {r["status"] for r in runs} == {"error"}
    assert len(brain.turns) == 6 and rt.transcript(f"cron-{job_id}") == []
    clock.advance(3600)
    rt.run_until_idle()
    assert rt.cron.wait_idle(10) and len(brain.turns) == 6


@pytest.mark.timeout(60)
def test_a_job_keeps_one_wakeup_and_none_once_it_is_removed_or_cancelled(
        tmp_path: Path) -> None:
    """APScheduler holds a wake-up per job for its next time. Kept per job and time, every
    job removed, and every Focal wake-up cancelled, left its wake-up in memory until that
    time came (a year ahead for a yearly job): a product that made and dropped jobs grew
    without bound."""
    from kinbox.actors.focal import FOCAL_ID

    def armed(driver: Any, job_ids: list[str]) -> dict[str, int]:
        """How many wake-ups APScheduler holds for each job."""
        held = [j.id for j in driver._scheduler.get_jobs()]
        return {job_id: sum(job_id in wake for wake in held) for job_id in job_ids}

    with Runtime(db=f"sqlite:///{tmp_path / 'k.db'}", brain=lambda turn: "ok",
                 data_dir=tmp_path / "data", peers=False) as rt:  # the system clock: APScheduler
        driver = rt.cron._driver
        jobs = [str(rt.cron.add(f"j{i}", f"0 0 {i + 1} 1 *", "p")["job_id"]) for i in range(5)]
        assert armed(driver, jobs) == dict.fromkeys(jobs, 1)
        rt.cron.pause(jobs[0])
        rt.cron.resume(jobs[0])
        rt.cron.pause(jobs[1])
        for job_id in jobs[2:]:
            rt.cron.remove(job_id)
        assert armed(driver, jobs) == {jobs[0]: 1, **dict.fromkeys(jobs[1:], 0)}
        rt.get_or_create_focal_chat()
        schedule = rt.focal.schedule
        tools = rt.tools_for(FOCAL_ID)
        at = time.time() + 86400
        made = [str(tools.schedule_wakeup("reminder", at=at + i)["job_id"]) for i in range(5)]
        assert armed(schedule._driver, made) == dict.fromkeys(made, 1)
        for job_id in made:
            assert schedule.cancel(job_id) is True
        assert armed(schedule._driver, made) == dict.fromkeys(made, 0)


@pytest.mark.timeout(30)
def test_a_trigger_that_meets_a_pause_committed_meanwhile_is_refused(
        make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger looked at the job, then wrote its due time: a pause committed in between
    (another operator's, another process's) was answered "triggered", and the paused job
    held a due time."""
    rt = make_runtime()
    job_id = every_minute(rt)
    definitions = rt.cron.definitions
    real_get = definitions.get

    def get_then_paused(key: object) -> Any:
        job = real_get(key)
        monkeypatch.setattr(definitions, "get", real_get)
        definitions.pause(job_id)  # committed right after the trigger's look
        return job
    monkeypatch.setattr(definitions, "get", get_then_paused)
    with pytest.raises(rules.CronJobPaused):
        rt.cron.trigger(job_id)
    job = rt.cron.job(job_id)
    assert (job["active"], job["next_run_at"], job["triggered_at"]) == (False, None, None)


@pytest.mark.timeout(60)
def test_a_wakeup_rearmed_due_now_from_inside_its_own_fire_fires_again() -> None:
    """APScheduler runs at most one instance of a job id at once and drops (with a warning,
    for good) a date job that comes due while one is running. A wake-up is kept per key
    under one id, and a key re-armed from inside its own fire (the cron tick re-arms
    ``cron-next``; Focal's fire re-arms every job) for a time already come (the next job
    due during a slow tick) was dropped: that job waited for the poll, not its time."""
    from kinbox.actors.schedule_driver import ScheduleDriver

    fires: list[float] = []
    second = threading.Event()
    driver: ScheduleDriver

    def fire() -> None:
        fires.append(time.time())
        if len(fires) == 1:
            driver.wake_at(time.time(), "cron-next")  # come already: due at once
            # Held until APScheduler has taken the re-armed wake-up from its store (ran it,
            # or dropped it as a second instance of a running job).
            wait_for(lambda: driver._scheduler.get_job("at:cron-next") is None,  # type: ignore[union-attr]
                     timeout=10, what="APScheduler to take the re-armed wake-up")
        else:
            second.set()

    driver = ScheduleDriver(fire, enabled=True, now=time.time)  # no poll to catch it up
    driver.start()
    try:
        driver.wake_at(time.time(), "cron-next")
        assert second.wait(10), f"fired {len(fires)} time(s): the re-armed wake-up was dropped"
    finally:
        driver.stop()


@pytest.mark.timeout(60)
def test_a_look_asked_for_while_one_runs_runs_after_it() -> None:
    """A change another process made (PostgreSQL's notification: a job added or triggered
    over HTTP on a send-only ``kinbox serve``) asks for a look "soon", under one APScheduler
    id: one asked for while such a look ran was dropped as a second instance of a running
    job (a WARNING of APScheduler's), and the change waited for the poll (15 s), not
    looked at once as the README says."""
    from kinbox.actors.schedule_driver import ScheduleDriver

    fires: list[float] = []
    first_runs, release, second = threading.Event(), threading.Event(), threading.Event()

    def fire() -> None:
        fires.append(time.time())
        if len(fires) == 1:
            first_runs.set()
            release.wait(10)
        else:
            second.set()

    driver = ScheduleDriver(fire, enabled=True, now=time.time)  # no poll to catch it up
    driver.start()
    try:
        driver.fire_soon()
        assert first_runs.wait(10), "the first look did not run"
        driver.fire_soon()  # a change that came while the first look runs
        # Held until APScheduler has taken the second look from its store (ran it, or
        # dropped it as a second instance of a running job).
        wait_for(lambda: not driver._scheduler.get_jobs(),  # type: ignore[union-attr]
                 timeout=10, what="APScheduler to take the second look")
        release.set()
        assert second.wait(10), f"looked {len(fires)} time(s): the second look was dropped"
    finally:
        release.set()
        driver.stop()


def test_a_trigger_whose_look_after_fails_still_answers_and_runs_once(
        make_runtime: MakeRuntime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger is committed before the look that runs it: a database error in that
    look answered the caller as failed (a 503 "try again" over HTTP) for a trigger that
    stood, and the caller's retry ran the job a second time. It answers "triggered", and
    the job runs once, at the schedule's next look."""
    brain = CronBrain()
    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    real = rt.cron.store.renew
    failures: list[str] = []

    def renew(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append("renew")
            raise DatabaseFailed("disk I/O error")
        return real(*args, **kwargs)

    monkeypatch.setattr(rt.cron.store, "renew", renew)
    job = rt.cron.trigger(job_id)
    assert failures == ["renew"] and job["triggered_at"] == clock.now()
    clock.advance(1)  # the runtime looks again as its clock moves
    rt.run_until_idle()
    assert [r["status"] for r in rt.cron.runs(job_id)] == ["success"]
