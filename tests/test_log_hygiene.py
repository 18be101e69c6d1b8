"""What the log says above DEBUG of a failed turn: its ids and its exception's type, never
the exception's text, which a brain builds from anything (the message body, a model's
answer quoting it). The text goes to the row's ``last_error`` and to the DEBUG log."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable

import pytest

from kinbox.actors import PermanentFailure, Runtime, Turn

from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]
MARK = "BODY-MARK-7f3a"


def _bodies(turn: Turn) -> str:
    return " | ".join(m.content for m in turn.all_messages)


def _two_sessions(rt: Runtime) -> tuple[str, str]:
    """Sessions A and B of a new project."""
    project = rt.create_project("p")
    return rt.create_session(project.id, "A").id, rt.create_session(project.id, "B").id


def _above_debug(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines above DEBUG as a handler writes them: a traceback logged with one too."""
    formatter = logging.Formatter()
    return [formatter.format(r) for r in caplog.records if r.levelno > logging.DEBUG]


def _debug(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]


@pytest.mark.timeout(60)
def test_a_failed_inbox_turn_logs_its_type_and_ids_and_its_text_only_at_debug(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    def brain(turn: Turn) -> None:
        text = _bodies(turn)
        if "final" in text:
            raise PermanentFailure(f"the model refused: {text}")
        raise ValueError(f"the model echoed {text}")

    rt = make_runtime(brain=brain)
    a, b = _two_sessions(rt)
    with caplog.at_level(logging.DEBUG, logger="kinbox"):
        retried = rt.post(b, f"retried {MARK}", sender=a).message_id
        final = rt.post(a, f"final {MARK}", sender=b).message_id
        rt.run_until_idle()
    above = _above_debug(caplog)
    assert not [m for m in above if MARK in m]
    assert any(retried in m and b in m and "ValueError" in m for m in above)
    assert any(final in m and a in m and "PermanentFailure" in m for m in above)
    assert any(retried in m and MARK in m for m in _debug(caplog))
    assert any(final in m and MARK in m for m in _debug(caplog))
    assert MARK in (rt.inbox(state="failed")[0]["last_error"] or "")  # the operator's


@pytest.mark.timeout(60)
def test_a_turn_a_caller_stopped_logs_what_it_raised_without_its_text(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    started = threading.Event()

    def brain(turn: Turn) -> None:
        started.set()
        turn.wait_stop_requested(20)
        raise ValueError(f"aborted while reading {_bodies(turn)}")

    rt = make_runtime(brain=brain)
    a, b = _two_sessions(rt)
    with caplog.at_level(logging.DEBUG, logger="kinbox"):
        rt.post(b, f"stop me {MARK}", sender=a)
        assert started.wait(20)
        assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
        wait_for(lambda: any("stopped by" in r.getMessage() for r in caplog.records), 20,
                 "the stop's log")
        rt.run_until_idle()
    above = _above_debug(caplog)
    assert not [m for m in above if MARK in m]
    assert any(b in m and "stopped by" in m and "ValueError" in m for m in above)


@pytest.mark.timeout(60)
def test_a_failed_social_turn_logs_no_event_text(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    def brain(turn: Turn) -> None:
        raise RuntimeError(f"could not answer {_bodies(turn)}")

    rt = make_runtime(brain=brain)
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=lambda route, text: None)
    with caplog.at_level(logging.DEBUG, logger="kinbox"):
        rt.social.ingest({"platform": "slack", "sender_id": "U1", "sender_name": "n",
                          "thread_id": "T1", "text": f"hello {MARK}",
                          "reply_route": {"channel": "C1"}})
        assert rt.social.wait_idle(20)
    above = _above_debug(caplog)
    assert not [m for m in above if MARK in m]
    assert any("social-slack-T1" in m and "RuntimeError" in m for m in above)
    assert any(MARK in m for m in _debug(caplog))


@pytest.mark.timeout(60)
def test_a_failed_cron_run_and_its_deactivated_job_log_no_prompt(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    def brain(turn: Turn) -> None:
        raise PermanentFailure(f"the model refused {_bodies(turn)}")

    rt = make_runtime(brain=brain)
    job_id = rt.cron.add("digest", "0 9 * * 1-5", f"Summarize {MARK}")["job_id"]
    with caplog.at_level(logging.DEBUG, logger="kinbox"):
        rt.cron.trigger(job_id)
        wait_for(lambda: not rt.cron.job(job_id)["active"], 20, "the job deactivated")
        assert rt.cron.wait_idle(20)
    above = _above_debug(caplog)
    assert not [m for m in above if MARK in m]
    assert any(job_id in m and "deactivated" in m for m in above)
    assert MARK in (rt.cron.job(job_id)["last_error"] or "")


@pytest.mark.timeout(60)
def test_an_observer_that_raises_is_logged_by_type_its_traceback_at_debug(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """The observer's traceback went to ERROR, and an observer's exception quotes what it
    was given: a turn_committed event carries the replies."""
    def observer(event: str, data: dict[str, object]) -> None:
        if event == "turn_committed":
            raise KeyError(f"no handler for {data['replies']}")

    rt = make_runtime(brain=lambda turn: f"echo {_bodies(turn)}")
    rt.subscribe(observer)
    a, b = _two_sessions(rt)
    with caplog.at_level(logging.DEBUG, logger="kinbox"):
        rt.post(b, f"hello {MARK}", sender=a)
        rt.run_until_idle()
    formatter = logging.Formatter()
    above = _above_debug(caplog)
    assert not [m for m in above if MARK in m]
    assert any("turn_committed" in m and "KeyError" in m for m in above)
    assert any(MARK in formatter.format(r) for r in caplog.records
               if r.levelno == logging.DEBUG and r.exc_info)


@pytest.mark.timeout(60)
def test_an_exception_nothing_handled_on_the_brains_loop_is_logged_by_type(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """asyncio's own handler logged a stray callback's exception (and the callback's
    arguments) at ERROR: a brain's background work quoting the message's body."""
    def echo(text: str) -> None:
        raise ValueError(f"could not index {text}")

    async def brain(turn: Turn) -> str:
        asyncio.get_running_loop().call_soon(echo, _bodies(turn))  # never awaited
        return "ok"

    rt = make_runtime(brain=brain)
    a, b = _two_sessions(rt)
    with caplog.at_level(logging.DEBUG):
        rt.post(b, f"hello {MARK}", sender=a)
        rt.run_until_idle()
        wait_for(lambda: any("nothing handled" in r.getMessage() for r in caplog.records),
                 20, "the loop's line")
    formatter = logging.Formatter()
    above = _above_debug(caplog)
    assert not [m for m in above if MARK in m]
    assert any("async brains'" in m and "ValueError" in m for m in above)
    assert any(MARK in formatter.format(r) for r in caplog.records
               if r.levelno == logging.DEBUG)


@pytest.mark.timeout(60)
def test_an_observer_that_raises_system_exit_ends_no_turn_and_holds_no_row(
        make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture) -> None:
    """``SystemExit`` (a ``sys.exit()`` in an observer) left the observer call: it ended the
    committing turn's thread, and the session's next rows stayed ``processing`` and
    ``pending`` until the lease ran out."""
    exited: list[str] = []

    def observer(event: str, data: dict[str, object]) -> None:
        if event == "turn_committed" and not exited:
            exited.append(event)
            sys.exit(3)

    rt = make_runtime(brain=lambda turn: "ok")
    rt.subscribe(observer)
    a, b = _two_sessions(rt)
    with caplog.at_level(logging.ERROR, logger="kinbox"):
        for n in range(3):
            rt.post(b, f"m{n}", sender=a)
        rt.run_until_idle(20)
    assert exited == ["turn_committed"]
    assert [r["status"] for r in rt.inbox()] == ["delivered"] * 3
    assert any("observer failed on turn_committed: SystemExit" in r.getMessage()
               for r in caplog.records)
