"""How a brain's exception asks its failed attempt to be retried: the pure core
(:mod:`kinbox.actors.brain_failure`, the delivery protocol, the inbox and cron rules),
table-driven, with no threads, clock or database."""

from __future__ import annotations

import pytest

from kinbox.actors import PermanentFailure, RetryLater, ToolError, cron_rules
from kinbox.actors import delivery as dp
from kinbox.actors.brain_failure import (
    ORDINARY,
    RETRY_AFTER_MAX,
    FailureKind,
    classify,
)
from kinbox.persistence import inbox_core as core

pytestmark = pytest.mark.timeout(30)


def caused_by(outer: BaseException, cause: BaseException) -> BaseException:
    """``outer`` as ``raise outer from cause`` leaves it."""
    outer.__cause__ = cause
    return outer


def in_context_of(outer: BaseException, context: BaseException) -> BaseException:
    """``outer`` raised while handling ``context`` (no ``from``)."""
    outer.__context__ = context
    return outer


CLASSIFIED: list[tuple[str, BaseException | None, FailureKind]] = [
    ("none", None, ORDINARY),
    ("plain", RuntimeError("model timeout"), ORDINARY),
    ("permanent", PermanentFailure("bad key"), FailureKind(permanent=True)),
    ("retry later", RetryLater(60), FailureKind(retry_after=60.0)),
    ("retry later, capped", RetryLater(86_400), FailureKind(retry_after=RETRY_AFTER_MAX)),
    ("retry later, negative", RetryLater(-5), FailureKind(retry_after=0.0)),
    ("retry later, nan", RetryLater(float("nan")), ORDINARY),
    ("retry later, inf", RetryLater(float("inf")), FailureKind(retry_after=RETRY_AFTER_MAX)),
    (
        "caused by permanent",
        caused_by(ValueError("x"), PermanentFailure("k")),
        FailureKind(permanent=True),
    ),
    (
        "caused by a cause of retry",
        caused_by(ValueError("x"), caused_by(KeyError("y"), RetryLater(7))),
        FailureKind(retry_after=7.0),
    ),
    ("only in the context", in_context_of(ValueError("x"), PermanentFailure("k")), ORDINARY),
    # A family send's rate limit the brain let escape: its attempt waits as long as the
    # refusal said (the retry repeats the send, which the limit would refuse sooner).
    (
        "rate-limited tool call",
        ToolError("execution_failed", "Rate limit: retry in 12.0s.", retry_after=12.0),
        FailureKind(retry_after=12.0),
    ),
    ("other tool refusal", ToolError("invalid_argument", "bad id"), ORDINARY),
    (
        "the outermost wins",
        caused_by(RetryLater(5), PermanentFailure("k")),
        FailureKind(retry_after=5.0),
    ),
    (
        "group with a permanent",
        ExceptionGroup("tg", [RuntimeError("a"), PermanentFailure("b")]),
        FailureKind(permanent=True),
    ),
    (
        "group of waits: the longest",
        ExceptionGroup("tg", [RetryLater(3), RetryLater(9), RuntimeError("c")]),
        FailureKind(retry_after=9.0),
    ),
    (
        "group, permanent beats a wait",
        ExceptionGroup("tg", [RetryLater(3), PermanentFailure("p")]),
        FailureKind(permanent=True),
    ),
    (
        "nested group",
        ExceptionGroup(
            "o", [ExceptionGroup("i", [caused_by(RuntimeError("w"), PermanentFailure("p"))])]
        ),
        FailureKind(permanent=True),
    ),
    ("group of plain", ExceptionGroup("tg", [RuntimeError("a"), OSError("b")]), ORDINARY),
    (
        "group caused by one",
        caused_by(ExceptionGroup("tg", [RuntimeError("a")]), RetryLater(4)),
        FailureKind(retry_after=4.0),
    ),
    (
        "base exception group",
        BaseExceptionGroup("tg", [KeyboardInterrupt(), PermanentFailure("p")]),
        FailureKind(permanent=True),
    ),
]


@pytest.mark.parametrize(
    "error, expected", [(e, k) for _, e, k in CLASSIFIED], ids=[name for name, _, _ in CLASSIFIED]
)
def test_a_brain_exception_is_classified_by_its_type_and_its_cause(
    error: BaseException | None, expected: FailureKind
) -> None:
    assert classify(error) == expected


def test_a_cause_chain_with_a_cycle_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify(a) == ORDINARY


def test_the_message_text_decides_nothing() -> None:
    assert classify(RuntimeError("PermanentFailure: retry_after=60")) == ORDINARY
    assert classify(PermanentFailure("")) == FailureKind(permanent=True)
    assert RetryLater(12.5).retry_after == 12.5


# -- the inbox: after_failure takes the classification as data ---------------------------------

NOW = 1000.0
AFTER_FAILURE: list[tuple[str, int, bool, float | None, core.FailureOutcome]] = [
    # name, attempts before, permanent, retry_after, outcome (max_attempts 5, cap 60)
    ("first failure: 2 s", 0, False, None, core.FailureOutcome(core.State.PENDING, 1, NOW + 2)),
    ("permanent at the first", 0, True, None, core.FailureOutcome(core.State.FAILED, 1, NOW)),
    ("permanent wins over a wait", 2, True, 30.0, core.FailureOutcome(core.State.FAILED, 3, NOW)),
    (
        "a wait longer than the backoff",
        0,
        False,
        60.0,
        core.FailureOutcome(core.State.PENDING, 1, NOW + 60),
    ),
    (
        "a wait shorter than the backoff",
        2,
        False,
        1.0,
        core.FailureOutcome(core.State.PENDING, 3, NOW + 8),
    ),
    (
        "a wait past the cap is kept (its caller capped it)",
        0,
        False,
        3600.0,
        core.FailureOutcome(core.State.PENDING, 1, NOW + 3600),
    ),
    (
        "a wait still counts: the last attempt fails",
        4,
        False,
        60.0,
        core.FailureOutcome(core.State.FAILED, 5, NOW),
    ),
]


@pytest.mark.parametrize(
    "before, permanent, retry_after, expected",
    [row[1:] for row in AFTER_FAILURE],
    ids=[row[0] for row in AFTER_FAILURE],
)
def test_after_failure_takes_permanent_and_retry_after(
    before: int, permanent: bool, retry_after: float | None, expected: core.FailureOutcome
) -> None:
    assert (
        core.after_failure(before, 5, 60.0, NOW, permanent=permanent, retry_after=retry_after)
        == expected
    )


# -- the delivery protocol carries it from the brain's exception to the record ----------------


class FakeRow:
    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.taken_over = False


@pytest.mark.parametrize(
    "kind", [ORDINARY, FailureKind(permanent=True), FailureKind(retry_after=42.0)]
)
def test_the_protocol_records_the_failure_with_its_kind(kind: FailureKind) -> None:
    run = dp.Delivery()
    run.claimed(FakeRow("m1"))
    run.started()
    run.steered_in(["m2"])
    assert run.brain_raised("boom", kind) == [dp.RecordFailure("m1", ("m2",), "boom", kind)]
    assert run.failure_recorded() == [dp.Done(True)]


def test_a_refused_commit_is_an_ordinary_failed_attempt() -> None:
    run = dp.Delivery()
    run.claimed(FakeRow("m1"))
    run.started()
    run.brain_returned()
    assert run.commit_refused("db down") == [dp.RecordFailure("m1", (), "db down", ORDINARY)]


# -- cron runs ---------------------------------------------------------------------------------

CRON: list[tuple[str, int, bool, float | None, cron_rules.AfterFailure]] = [
    ("ordinary: 1 minute", 0, False, None, cron_rules.AfterFailure(1, True, NOW + 60, "e")),
    (
        "permanent: deactivated at once",
        0,
        True,
        None,
        cron_rules.AfterFailure(0, False, None, "Permanent failure: e"),
    ),
    (
        "permanent on a retry",
        3,
        True,
        10.0,
        cron_rules.AfterFailure(3, False, None, "Permanent failure: e"),
    ),
    (
        "a wait longer than the delay",
        0,
        False,
        600.0,
        cron_rules.AfterFailure(1, True, NOW + 600, "e"),
    ),
    (
        "a wait shorter than the delay",
        2,
        False,
        30.0,
        cron_rules.AfterFailure(3, True, NOW + 240, "e"),
    ),
    (
        "a wait counts as a retry: the last deactivates",
        5,
        False,
        600.0,
        cron_rules.AfterFailure(5, False, None, "Max retries exceeded: e"),
    ),
]


@pytest.mark.parametrize(
    "count, permanent, retry_after, expected",
    [row[1:] for row in CRON],
    ids=[row[0] for row in CRON],
)
def test_a_cron_run_failure_takes_permanent_and_retry_after(
    count: int, permanent: bool, retry_after: float | None, expected: cron_rules.AfterFailure
) -> None:
    assert (
        cron_rules.after_failure(count, "e", NOW, permanent=permanent, retry_after=retry_after)
        == expected
    )
