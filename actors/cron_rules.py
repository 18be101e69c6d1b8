"""The rules of user cron jobs (C1): what a due job does, and what a run's end does.

Pure: times come in as arguments (the next regular fire time is computed by
:mod:`.triggers` and passed in), nothing here reads a clock or a database.

- A due job runs once, however many occurrences were missed while no runtime
  was up (coalesced), if one of them is within the grace time (the run stands
  for the latest); when all are older, they are skipped and the schedule
  moves on. A trigger is not an occurrence: it runs however late a runtime with a
  brain comes to it.
- A run still active when the next is due is recorded as an error,
  ``Previous cron run is still active``, and the schedule moves on (the
  running one is not disturbed, and this is not counted as a failure). A run
  whose runtime died is taken over and run again, and its job waits for it: the
  occurrence due meanwhile runs once it ended, late (coalesced with any other
  due meanwhile), so a job never has two runs running at once and loses no
  occurrence to a crash.
- A failed run is retried after 1, 2, 4, 8 and 16 minutes; when the fifth
  retry fails too, the job is deactivated with ``Max retries exceeded:
  <error>``. A success resets the count. A run whose brain asked for a
  longer wait (``RetryLater``) is retried after that wait instead when it is
  longer, and counts as a retry; a run whose brain raised ``PermanentFailure``
  is a final failure: the job is deactivated at once with ``Permanent
  failure: <error>`` (its prompt and brain are the same at every run, so
  every run would fail the same way; ``resume`` once it is fixed).
- A run taken over for the fifth time (its runtime died inside it five times: a
  prompt whose turn kills its process) is not run again: it ends as a failed run,
  ``Taken over 5 times: its runtime died each time``, counted as above
  (:func:`after_takeover`), as an inbox message ends ``failed`` after five
  interrupted turns. A run whose failure the database refused to record is handed
  back, not taken over: it runs again after a retry delay (:func:`after_unrecorded_failure`),
  no death of its runtime counted, and its error is the brain's once recorded.
- A schedule last written by a clock that read well ahead of this one (set
  back since) is due where its schedule puts it from now, not where the clock
  that was ahead put it (this holds for the Focal schedules too).
- The two day fields (day of month, weekday) are read as crontab reads them
  (:func:`either_day_matches`).

Errors::

    KinboxError
    └── CronError
        ├── InvalidCronExpression   .expression, .reason (also a ConfigError, field "cron")
        ├── InvalidCronJob          .field, .reason (also a ConfigError: a bad name,
        │                           prompt, delivery mode or time zone)
        ├── CronJobNotFound         .job_id
        ├── CronJobPaused           .job_id (a paused job cannot be triggered)
        ├── CronRunInProgress       .job_id, .run_id, .action (nor one whose run is in
        │                           progress triggered or removed)
        └── CronJobConflict         .job_id, .idempotency_key, .fields (an add whose key
                                    another job was added with, that job different)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import ConfigError, KinboxError
from .validation import quoted, unstorable

RETRY_DELAYS: tuple[float, ...] = (60.0, 120.0, 240.0, 480.0, 960.0)
"""Seconds after a failed run before the next attempt; one entry per retry."""
DEFAULT_GRACE_SECONDS = 3600.0
"""How late an occurrence may still run (after downtime); later ones are skipped."""
DELIVERY_MODES = ("announce", "none")
"""``announce``: a finished run is announced to the UI queue; ``none``: only recorded."""
PREVIOUS_ACTIVE = "Previous cron run is still active"
MAX_PROMPT = 20_000
MAX_NAME = 256
EXPRESSION_LIMIT = 512
"""Longest cron expression taken, in characters (the tables' columns are as wide:
``kinbox.persistence.CRON_EXPRESSION_CHARS``, which a test holds equal): every
value of every field listed one by one is under 400; a longer one only costs CPU at each
next-run computation (a 240 KB one took a second). Here, with the rules, so the tool
schemas can state it."""


IDEMPOTENCY_KEY_LIMIT = 128
"""Longest idempotency key an add takes, in characters (the column is as wide:
``kinbox.persistence.IDEMPOTENCY_KEY_CHARS``, which a test holds equal)."""
DEFINITION_FIELDS = ("name", "cron", "timezone", "prompt", "delivery")
"""What a job's add asks for: a repeat of the add (its idempotency key) asks the same."""


MACHINE_ZONES = {
    "localtime": "names the zone this machine is set to, which is another on the next "
    "machine sharing the database",
    "posixrules": "names the zone this machine's POSIX rules default to, which is another "
    "on the next machine",
    "Factory": "is a placeholder with no local time (its abbreviation is '-00')",
}
"""Zone names the zone database answers but a durable schedule must not take: a job is
stored once and fired by whichever process of a database comes first, so its time zone has
to mean the same on every machine."""


def zone_problem(name: str) -> str | None:
    """Why ``name``, a zone the zone database knows, is refused as a job's time zone, or None.

    Besides :data:`MACHINE_ZONES`, the ``right/`` zones count leap seconds: their clock is
    27 s off every other zone's, so a job at 09:00 there fires at 08:59:33. A ``posix/``
    zone is a copy of another in the system's zone folder, unknown where the zones come
    from the tzdata package alone (there, the job was deactivated when it came due)."""
    if name in MACHINE_ZONES:
        return MACHINE_ZONES[name]
    if name.startswith("right/"):
        return "counts leap seconds, so its clock is 27 s off UTC's and every other zone's"
    if name.startswith("posix/"):
        return (f"is this machine's copy of {quoted(name.removeprefix('posix/'))} in its zone "
                "folder, which a machine whose zones come from the tzdata package has not "
                "(give that name)")
    return None


def either_day_matches(day: str, weekday: str) -> bool:
    """Does a date match when *either* day field does (else both must)? Crontab's rule
    (Vixie cron, cronie): only when both are restricted, and a field that *begins* with
    ``*`` (``*``, ``*/2``) is unrestricted there, however few days its step names. So
    ``0 9 1 * 1`` runs on the 1st and on every Monday, ``0 9 */2 * 1`` only on the odd
    days that are Mondays."""
    return not day.startswith("*") and not weekday.startswith("*")


class CronError(KinboxError):
    """Base class of the cron errors."""


class InvalidCronExpression(CronError, ConfigError):
    """A cron expression (or its time zone) cannot be parsed."""

    def __init__(self, expression: str, reason: str) -> None:
        super().__init__(
            f"cron {quoted(expression)} is not a crontab expression (minute hour day "
            f"month weekday): {reason}",
            "cron",
        )
        self.expression = expression
        self.reason = reason


class InvalidCronJob(CronError, ConfigError):
    """A field of a new cron job is invalid."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid cron job {field}: {reason}", field)
        self.reason = reason


class CronJobNotFound(CronError):
    """No cron job has this id."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no cron job with id {quoted(job_id)}")
        self.job_id = job_id


class CronJobPaused(CronError):
    """The job is paused; resume it before triggering it."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"cron job {quoted(job_id)} is paused; resume it first")
        self.job_id = job_id


class CronRunInProgress(CronError):
    """The job has a run in progress (running, or handed back to run again): a trigger now
    would be the "still active" error run, not a run, so it is refused and nothing is
    written; trigger it again once that run ended. A removal is refused too while the run
    is in progress on a live runtime: removed with its job, the run's turn could commit
    nothing, and its result was lost."""

    def __init__(self, job_id: str, run_id: str | None, *, action: str = "trigger") -> None:
        which = "" if run_id is None else f" ({quoted(run_id)})"
        super().__init__(f"cron job {quoted(job_id)} has a run in progress{which}; "
                         f"{action} it again once that run ended")
        self.job_id = job_id
        self.run_id = run_id
        """The run; None when runs kept starting and ending while the trigger was tried."""
        self.action = action
        """What was refused: ``trigger``, or ``remove`` (removed with its job, the run's
        result was lost)."""


class CronJobConflict(CronError):
    """An add's idempotency key is another add's, whose job differs from this one: not a
    retry of that add (a retry answers its job), so nothing is added."""

    def __init__(self, job_id: str, idempotency_key: str, fields: tuple[str, ...]) -> None:
        super().__init__(f"idempotency key {quoted(idempotency_key)} added cron job "
                         f"{quoted(job_id)}, whose {', '.join(fields)} differ from this "
                         "request's: use a new key for another job")
        self.job_id = job_id
        self.idempotency_key = idempotency_key
        self.fields = fields
        """The fields (of :data:`DEFINITION_FIELDS`) in which the two differ."""


def check_idempotency_key(key: object) -> str | None:
    """``key`` as an add's idempotency key (None: none given); :class:`InvalidCronJob`
    unless it is 1 to :data:`IDEMPOTENCY_KEY_LIMIT` printable ASCII characters (an HTTP
    header's value, kept as given)."""
    if key is None:
        return None
    if not (isinstance(key, str) and 0 < len(key) <= IDEMPOTENCY_KEY_LIMIT
            and key.isascii() and key.isprintable()):
        raise InvalidCronJob("idempotency_key", f"give 1 to {IDEMPOTENCY_KEY_LIMIT} "
                                                "printable ASCII characters")
    return key


def differing_fields(stored: dict[str, object], asked: dict[str, object]) -> tuple[str, ...]:
    """The :data:`DEFINITION_FIELDS` in which a stored job and an add's request differ."""
    return tuple(f for f in DEFINITION_FIELDS if stored.get(f) != asked.get(f))


def session_id_for(job_id: str) -> str:
    """The session a job's runs happen in."""
    return f"cron-{job_id}"


def check_fields(name: object, prompt: object, delivery: object) -> tuple[str, str, str]:
    """The stripped name and prompt and the delivery mode; :class:`InvalidCronJob` if bad."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidCronJob("name", "give a non-empty name")
    if len(name.strip()) > MAX_NAME:
        raise InvalidCronJob("name", f"at most {MAX_NAME} characters")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidCronJob("prompt", "give a non-empty prompt")
    if len(prompt.strip()) > MAX_PROMPT:
        raise InvalidCronJob("prompt", f"at most {MAX_PROMPT} characters")
    if delivery not in DELIVERY_MODES:
        raise InvalidCronJob("delivery", f"one of {', '.join(DELIVERY_MODES)}")
    for field, text in (("name", name), ("prompt", prompt)):
        if (problem := unstorable(text)) is not None:
            raise InvalidCronJob(field, problem)
    return name.strip(), prompt.strip(), str(delivery)


class Due(enum.Enum):
    """What a due occurrence does."""

    RUN = "run"
    PREVIOUS_ACTIVE = "previous_active"
    MISSED = "missed"


@dataclass(frozen=True)
class DueDecision:
    """The decision for one due occurrence."""

    due: Due
    next_run_at: float | None
    """When the job is due next (None: the expression has no future time)."""
    error: str | None = None
    """The run's error when it is recorded failed at once."""


def on_due(
    scheduled_for: float,
    now: float,
    *,
    next_regular: float | None,
    previous_active: bool,
    grace: float = DEFAULT_GRACE_SECONDS,
    recent_regular: float | None = None,
    asked: bool = False,
) -> DueDecision:
    """Decide a due occurrence; ``next_regular`` is the first fire time after ``now``,
    ``recent_regular`` the first one at or after ``now - grace`` (None: none).

    Whatever the decision, the job moves on to ``next_regular``: missed
    occurrences coalesce into (at most) this one run. It is skipped only when
    every one of them is past the grace time: the first (``scheduled_for``) and
    any regular one since (``recent_regular`` not yet come). Judged by the first
    alone, an hourly job down from 22:59 to 00:05 lost its 00:00 run.

    ``previous_active``: the job has a run still ``running``, never taken over. A
    job whose run was taken over (its runtime died) is not due until that run ended
    (the store holds it back; the look takes runs over before it fires), and then
    its occurrence runs, late: counted as not active, the occurrence fired beside the
    takeover, two runs of one job at once; counted as active, it was the error run,
    lost to the crash.

    ``asked``: the due time is an operator's trigger, not a time of the schedule. It
    runs however late: its run waits for a runtime with a brain (a send-only server
    stores the trigger), and skipped as missed it was gone without a trace, the job
    moved on to its next regular time.
    """
    recent = recent_regular is not None and recent_regular <= now
    if now - scheduled_for > grace and not recent and not asked:
        return DueDecision(Due.MISSED, next_regular)
    if previous_active:
        return DueDecision(Due.PREVIOUS_ACTIVE, next_regular, PREVIOUS_ACTIVE)
    return DueDecision(Due.RUN, next_regular)


CLOCK_STEP_TOLERANCE = 3600.0
"""Seconds a schedule's last write may lie ahead of this clock and be no step back: the
clocks of several runtimes on one database read apart. Within it the runtime whose clock
is ahead fires each occurrence first; a runtime that moved its times back would fire them
again at its own."""


def after_clock_step_back(
    written_at: float,
    next_run_at: float | None,
    now: float,
    upcoming: float | None,
    tolerance: float = CLOCK_STEP_TOLERANCE,
) -> float | None:
    """The next run of a schedule written at ``written_at`` and due at ``next_run_at``,
    when the clock was set back since; None to keep it as it is. ``upcoming``: when its
    schedule is due from ``now`` on (None: it has no such time, a one-shot wake-up).

    Written more than ``tolerance`` after ``now``, the schedule's times came from a clock
    that read later than this one: a due time beyond ``upcoming`` moves to it. Kept, a job
    written by a clock three days ahead ran no more until three days had passed.
    """
    if next_run_at is None or upcoming is None or written_at <= now + tolerance:
        return None
    return upcoming if upcoming < next_run_at else None


@dataclass(frozen=True)
class AfterFailure:
    """The job's state after a failed run."""

    retry_count: int
    active: bool
    next_run_at: float | None
    """The retry time; None when the job is deactivated."""
    last_error: str


def after_failure(
    retry_count: int,
    error: str,
    now: float,
    delays: tuple[float, ...] = RETRY_DELAYS,
    *,
    permanent: bool = False,
    retry_after: float | None = None,
) -> AfterFailure:
    """Retry after the next delay (or the longer ``retry_after`` the failure asked for),
    or deactivate once every retry was used, or at once for a ``permanent`` failure."""
    if permanent:
        return AfterFailure(retry_count, False, None, permanent_error(error))
    if retry_count < len(delays):
        delay = delays[retry_count]
        if retry_after is not None and retry_after > delay:
            delay = retry_after
        return AfterFailure(retry_count + 1, True, now + delay, error)
    return AfterFailure(retry_count, False, None, max_retries_error(error))


def after_unrecorded_failure(
    attempts: int, now: float, delays: tuple[float, ...] = RETRY_DELAYS
) -> float:
    """When a run whose failure could not be recorded (the database refused the record)
    is due again, handed back unrun and uncounted: after the retry delay of its attempt
    (``attempts``: the run's, 1 for a first run; the last delay past the table). Left
    to its lease instead, it waited a whole lease and was taken over as if its runtime
    had died."""
    return now + delays[min(max(attempts, 1), len(delays)) - 1]


MAX_TAKEOVERS = 5
"""The takeover of a run that ends it failed instead of running it again (each takeover is
a runtime that died, or stalled past its lease, inside the run)."""


def after_takeover(takeovers: int, limit: int = MAX_TAKEOVERS) -> str | None:
    """A run just taken over, ``takeovers`` times with this one (the run counts them
    itself: read off its ``attempts`` against its job's ``retry_count``, a ``resume``
    that reset the count meanwhile made each read one too many per earlier retry): None
    to run it again, else the error it ends with, a failure of its job
    (:func:`after_failure`)."""
    return taken_over_error(takeovers) if takeovers >= limit else None


def taken_over_error(times: int) -> str:
    """The error of a run ended at a takeover: its runtime died inside it each time."""
    return f"Taken over {times} times: its runtime died each time"


def max_retries_error(error: str) -> str:
    """The last error of a job deactivated after its retries."""
    return f"Max retries exceeded: {error}"


def permanent_error(error: str) -> str:
    """The last error of a job deactivated by a run that failed for good."""
    return f"Permanent failure: {error}"


def invalid_expression_error(reason: str) -> str:
    """The last error of a job deactivated because its stored expression is invalid."""
    return f"Invalid cron expression: {reason}"


def reminder(name: str, local_time: str, last_run: str | None) -> str:
    """The system reminder line that opens every cron turn."""
    return (
        f'<system-reminder>Scheduled cron job "{name}" is running. Local time: '
        f"{local_time}. Last run: {last_run or 'never'}.</system-reminder>"
    )
