"""A brain says how its failure is retried, through a real runtime on a real SQLite file and
PostgreSQL: inbox turns (sync and async brains), cron runs, social events (direct turns),
and a sub-agent's parent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from kinbox.actors import ManualClock, PermanentFailure, RetryLater, Runtime, Turn
from kinbox.actors.brain_failure import RETRY_AFTER_MAX

from .social_helpers import event

pytestmark = pytest.mark.timeout(120)

MakeRuntime = Callable[..., Runtime]
START = 1_700_000_040.0


@pytest.fixture
def db_url(any_db_url: str) -> str:
    """Every runtime here runs on each backend."""
    return any_db_url


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def brain_of(flavour: str, fail: Callable[[Turn], None]) -> Callable[[Turn], Any]:
    """A brain that, on "work", replies and sends its sender a message, then calls
    ``fail`` (which raises, or returns to end the turn well), sync or async; it does
    nothing on other messages."""
    if flavour == "async":

        async def async_brain(turn: Turn) -> None:
            if turn.messages[0].content != "work":
                return
            turn.reply("half an answer")
            await turn.tools.agent_send(turn.messages[0].sender_id, "sent before failing")
            fail(turn)

        return async_brain

    def sync_brain(turn: Turn) -> None:
        if turn.messages[0].content != "work":
            return
        turn.reply("half an answer")
        turn.tools.agent_send(turn.messages[0].sender_id, "sent before failing")
        fail(turn)

    return sync_brain


def team(rt: Runtime) -> tuple[str, str]:
    project = rt.create_project("team")
    return rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id


def test_a_permanent_failure_ends_the_row_failed_after_one_attempt_with_no_effects(
    make_runtime: MakeRuntime, clock: ManualClock, flavour: str
) -> None:
    calls: list[str] = []

    def fail(turn: Turn) -> None:
        calls.append(turn.messages[0].message_id)
        try:
            raise ValueError("HTTP 401: invalid api key")
        except ValueError as exc:
            raise PermanentFailure("the model API refused the key") from exc

    rt = make_runtime(brain=brain_of(flavour, fail))
    a, b = team(rt)
    mid = rt.post(b, "work", sender=a).message_id
    rt.run_until_idle()
    row = rt.inbox(target=b)[0]
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert row["last_error"].rstrip().endswith("PermanentFailure: the model API refused the key")
    assert "ValueError: HTTP 401: invalid api key" in row["last_error"]
    clock.advance(3600)
    rt.run_until_idle()
    assert calls == [mid]
    assert rt.transcript(b) == []  # neither the message nor its reply
    assert rt.inbox(target=a) == []  # the attempt's send was dropped with it


def test_a_retry_later_waits_at_least_its_time_and_counts_as_an_attempt(
    make_runtime: MakeRuntime, clock: ManualClock, flavour: str
) -> None:
    calls: list[float] = []

    def fail(turn: Turn) -> None:
        calls.append(clock.now())
        if len(calls) == 1:
            raise RetryLater(90, "rate limited")
        if len(calls) == 2:
            raise RetryLater(10**9)  # asks for years: capped

    rt = make_runtime(brain=brain_of(flavour, fail))
    a, b = team(rt)
    rt.post(b, "work", sender=a)
    rt.run_until_idle()
    row = rt.inbox(target=b)[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert row["available_at"] == START + 90  # not the 2 s backoff
    assert row["last_error"].rstrip().endswith("RetryLater: rate limited")
    clock.advance(89)
    rt.run_until_idle()
    assert len(calls) == 1
    clock.advance(1)
    rt.run_until_idle()
    assert len(calls) == 2
    row = rt.inbox(target=b)[0]
    assert (row["status"], row["attempts"]) == ("pending", 2)
    assert row["available_at"] == START + 90 + RETRY_AFTER_MAX
    clock.advance(RETRY_AFTER_MAX)
    rt.run_until_idle()
    assert [c - START for c in calls] == [0, 90, 90 + RETRY_AFTER_MAX]
    assert rt.inbox(target=b)[0]["status"] == "delivered"
    assert [r["content"] for r in rt.inbox(target=a)] == ["sent before failing"]  # once


def test_a_task_group_holding_a_permanent_failure_fails_the_row_at_once(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    async def brain(turn: Turn) -> None:
        async def refused() -> None:
            raise PermanentFailure("prompt refused")

        async def slow() -> None:
            raise TimeoutError("the other call timed out")

        async with asyncio.TaskGroup() as group:
            group.create_task(refused())
            group.create_task(slow())

    rt = make_runtime(brain=brain)
    a, b = team(rt)
    rt.post(b, "work", sender=a)
    rt.run_until_idle()
    row = rt.inbox(target=b)[0]
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "PermanentFailure: prompt refused" in row["last_error"]


def test_a_sub_agents_permanent_failure_wakes_its_parent_as_any_failed_row(
    make_runtime: MakeRuntime,
) -> None:
    async def brain(turn: Turn) -> None:
        message = turn.messages[0]
        if turn.session_id.startswith("subagent-"):
            raise PermanentFailure("the model refused the task")
        if message.kind == "subagent_result":
            turn.reply(f"parent heard: {message.content}")
        else:
            await turn.tools.agent(description="clean up")

    rt = make_runtime(brain=brain, max_active_sessions=2)
    a, _ = team(rt)
    rt.post(a, "delegate")
    rt.run_until_idle()
    child_rows = [r for r in rt.inbox() if r["target_chat_id"].startswith("subagent-")]
    assert [(r["status"], r["attempts"]) for r in child_rows] == [("failed", 1)]
    heard = rt.transcript(a)[-1].text
    assert heard.startswith("parent heard: Sub-agent ") and "failed" in heard
    assert "PermanentFailure: the model refused the task" in heard


class CronBrain:
    """Raises what ``raising`` holds (a factory), else replies."""

    def __init__(self) -> None:
        self.raising: Callable[[], BaseException] | None = None
        self.calls = 0

    def __call__(self, turn: Turn) -> str:
        self.calls += 1
        if self.raising is not None:
            raise self.raising()
        return "done"


def test_a_permanent_failure_of_a_cron_run_deactivates_its_job_at_once(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    brain = CronBrain()
    brain.raising = lambda: PermanentFailure("bad key")
    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    job = rt.cron.job(job_id)
    assert not job["active"] and job["next_run_at"] is None
    assert job["last_error"] == "Permanent failure: PermanentFailure: bad key"
    assert [r["status"] for r in rt.cron.runs(job_id)] == ["error"]
    clock.advance(3600)
    rt.run_until_idle()
    assert brain.calls == 1
    brain.raising = None
    rt.cron.resume(job_id)
    assert rt.cron.job(job_id)["active"]


def test_a_cron_run_asking_to_retry_later_is_retried_after_its_wait(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    brain = CronBrain()
    brain.raising = lambda: RetryLater(600, "rate limited")
    rt = make_runtime(brain=brain)
    job_id = str(rt.cron.add("yearly", "0 0 1 1 *", "Happy new year")["job_id"])
    rt.cron.trigger(job_id)
    rt.run_until_idle()
    job = rt.cron.job(job_id)
    assert job["active"] and job["retry_count"] == 1
    assert job["next_run_at"] == START + 600  # not the first retry's 1 minute
    brain.raising = None
    clock.advance(599)
    rt.run_until_idle()
    assert brain.calls == 1
    clock.advance(1)
    rt.run_until_idle()
    assert brain.calls == 2 and rt.cron.job(job_id)["retry_count"] == 0


@pytest.mark.parametrize(
    "raised",
    [PermanentFailure("bad key"), RetryLater(60, "slow down")],
    ids=["permanent", "retry-later"],
)
def test_a_social_events_turn_fails_once_whatever_its_brain_asks(
    make_runtime: MakeRuntime, clock: ManualClock, raised: BaseException
) -> None:
    calls: list[str] = []

    def brain(turn: Turn) -> None:
        calls.append(turn.session_id)
        raise raised

    rt = make_runtime(brain=brain)
    sent: list[tuple[Any, str]] = []
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=lambda route, text: sent.append((route, text)))
    rt.social.ingest(event("are you there?"))
    assert rt.social.wait_idle(30)
    clock.advance(3600)
    rt.run_until_idle()
    assert rt.social.wait_idle(30)
    assert len(calls) == 1 and sent == []
    outcome = rt.social.outcomes[-1]
    assert outcome["status"] == "turn_failed" and type(raised).__name__ in outcome["error"]
    assert rt.social.statistics()["failed_turns"] == 1
