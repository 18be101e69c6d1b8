"""A graceful stop of the runtime during a framework brain's model call.

A graceful stop (``rt.stop()``, SIGTERM: a deploy) asks every running turn to stop and
gives it ``stop_grace`` to finish: "running turns are asked to stop and finish or hand
their rows back" (README). The framework adapters cancel their run at once on a caller's
stop (``agent_stop``); they took the runtime's stop for one, so the model call was
cancelled, the turn committed as stopped with nothing said: the message was acknowledged
unanswered and never ran again. Now a framework brain behaves as a plain ``async def``
brain: its answer within the grace commits; a model call outlasting the grace is
cancelled and its row handed back unacknowledged, to run at the next start.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
pytest.importorskip("agents", reason="the openai-agents extra is not installed")
pytest.importorskip("autogen_ext", reason="the autogen extra is not installed")

from agents import Agent as SdkAgent
from autogen_core.models import CreateResult, LLMMessage, RequestUsage
from autogen_ext.models.replay import ReplayChatCompletionClient
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kinbox.actors import Runtime, Turn
from kinbox.actors.autogen_brain import autogen_brain
from kinbox.actors.openai_agents_brain import openai_agents_brain
from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain
from kinbox.actors.running import RUNTIME_STOP

from .helpers import wait_for
from .social_helpers import event
from .test_async_brains import after_stop
from .test_openai_agents import ScriptModel, say

MakeRuntime = Callable[..., Runtime]


class Gate:
    """A model call that waits, on the brains' loop, until the test lets it answer."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open: asyncio.Event | None = None

    async def answer(self) -> str:
        self._loop, self._open = asyncio.get_running_loop(), asyncio.Event()
        self.started.set()
        try:
            await self._open.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return "the answer"

    def open(self) -> None:
        assert self._loop is not None and self._open is not None
        self._loop.call_soon_threadsafe(self._open.set)


def plain(gate: Gate) -> Callable[[Turn], Any]:
    async def brain(turn: Turn) -> None:
        turn.reply(await gate.answer())
    return brain


def pydantic(gate: Gate) -> Callable[[Turn], Any]:
    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(await gate.answer())])
    return pydantic_ai_brain(Agent(FunctionModel(model)))


def openai_agents(gate: Gate) -> Callable[[Turn], Any]:
    async def model(items: Any, tools: list[str]) -> list[Any]:
        return [say(await gate.answer())]
    return openai_agents_brain(SdkAgent(name="B", model=ScriptModel(model)))


class GatedClient(ReplayChatCompletionClient):
    """autogen's scripted client, its completion waiting for the gate."""

    def __init__(self, gate: Gate) -> None:
        super().__init__([])
        self.gate = gate

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        return CreateResult(finish_reason="stop", content=await self.gate.answer(),
                            usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                            cached=False)


def autogen(gate: Gate) -> Callable[[Turn], Any]:
    return autogen_brain(GatedClient(gate))


BRAINS = pytest.mark.parametrize("make_brain", [plain, pydantic, openai_agents, autogen],
                                 ids=["plain_async", "pydantic_ai", "openai_agents", "autogen"])


def start_turn(rt: Runtime, gate: Gate) -> tuple[str, str]:
    project = rt.create_project("team")
    a = rt.create_session(project.id, "A").id
    b = rt.create_session(project.id, "B").id
    mid = rt.post(b, "summarize the thread", sender=a).message_id
    assert gate.started.wait(10)
    return b, mid


@pytest.mark.timeout(60)
@BRAINS
def test_an_answer_within_the_stops_grace_is_committed(
        make_runtime: MakeRuntime, db_url: str, make_brain: Callable[[Gate], Any]) -> None:
    gate = Gate()
    rt = make_runtime(brain=make_brain(gate), stop_grace=20.0)
    b, mid = start_turn(rt, gate)
    stopping = threading.Thread(target=rt.stop, kwargs={"timeout": 20.0})
    stopping.start()
    try:
        wait_for(lambda: rt.context.turns.stopped_by(b) == RUNTIME_STOP,
                 what="the runtime's stop request")
        # The turn has seen the stop (an adapter cancelled its run here); the model answers.
        assert rt.context.turns.stop_asked(b)
        gate.open()
    finally:
        stopping.join(30)
    assert not gate.cancelled.is_set()
    assert after_stop(db_url, b, mid) == (("delivered", 0),
                                          ["summarize the thread", "the answer"], 1)


@pytest.mark.timeout(60)
@BRAINS
def test_a_model_call_outlasting_the_grace_hands_its_row_back_for_the_next_start(
        make_runtime: MakeRuntime, db_url: str, make_brain: Callable[[Gate], Any]) -> None:
    gate = Gate()
    rt = make_runtime(brain=make_brain(gate), stop_grace=0.3)
    b, mid = start_turn(rt, gate)
    rt.stop(timeout=10)
    assert gate.cancelled.is_set()  # cancelled past the grace, not left running
    assert after_stop(db_url, b, mid) == (("pending", 0), [], 0)

    again = Gate()
    rt = make_runtime(brain=make_brain(again))
    assert again.started.wait(10)  # the next start runs it
    again.open()
    rt.run_until_idle(timeout=20)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("delivered", 0)
    assert [e.text for e in rt.transcript(b)] == ["summarize the thread", "the answer"]


@pytest.mark.timeout(60)
@BRAINS
def test_a_cron_runs_answer_within_the_stops_grace_is_committed(
        make_runtime: MakeRuntime, make_brain: Callable[[Gate], Any]) -> None:
    gate = Gate()
    rt = make_runtime(brain=make_brain(gate), stop_grace=20.0)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert gate.started.wait(10)
    stopping = threading.Thread(target=rt.stop, kwargs={"timeout": 20.0})
    stopping.start()
    try:
        wait_for(lambda: rt.context.turns.stopped_by(f"cron-{job}") == RUNTIME_STOP,
                 what="the runtime's stop request")
        gate.open()
    finally:
        stopping.join(30)
    after = make_runtime()  # send-only: reads the database
    [run] = after.cron.runs(job)
    assert (run["status"], run["result"]) == ("success", "the answer")


@pytest.mark.timeout(60)
def test_a_cron_run_cut_short_by_the_stop_before_it_answered_commits_nothing(
        make_runtime: MakeRuntime) -> None:
    """Committed, it was a ``success`` with no answer; left ``running``, the next start
    takes it over and runs it again, as after a kill."""
    gate = Gate()
    rt = make_runtime(brain=pydantic(gate), stop_grace=0.3)
    job = rt.cron.add("tick", "* * * * *", "cron prompt")["job_id"]
    rt.cron.trigger(job)
    assert gate.started.wait(10)
    rt.stop(timeout=10)
    assert gate.cancelled.is_set()
    after = make_runtime()
    assert [r["status"] for r in after.cron.runs(job)] == ["running"]
    assert after.transcript(f"cron-{job}") == []


@pytest.mark.timeout(90)
def test_a_social_turn_cut_short_by_the_stop_runs_at_the_next_start(
        make_runtime: MakeRuntime) -> None:
    """Committed as stopped, the event was recorded as run with no answer (the platform
    had its 202): now its turn commits nothing and the stop hands the event to the inbox."""
    gate = Gate()
    rt = make_runtime(brain=pydantic(gate), stop_grace=0.3)
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=lambda route, text: None)
    rt.social.ingest(event("summarize", event_id="Ev1"))
    assert gate.started.wait(10)
    rt.stop(timeout=10)
    assert gate.cancelled.is_set()

    again = Gate()
    rt = make_runtime(brain=pydantic(again))
    rt.social.allow("slack", ["U1"])
    rt.social.register_channel("slack", send=lambda route, text: None)
    assert again.started.wait(10)
    again.open()
    rt.run_until_idle(timeout=20)
    texts = [e.text for e in rt.transcript("social-slack-T1")]
    assert texts.count("the answer") == 1 and len(texts) == 3, texts  # + the delivery note


async def own_cancel() -> str:
    """A model call that ends with a CancelledError of its own (an inner task it awaits
    was cancelled: a client's connection pool closing, an anyio scope), nobody having
    asked the turn to stop."""
    inner = asyncio.ensure_future(asyncio.sleep(3600))
    await asyncio.sleep(0)
    inner.cancel()
    await inner
    return "never"


class OwnCancelClient(ReplayChatCompletionClient):
    def __init__(self) -> None:
        super().__init__([])

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        return CreateResult(finish_reason="stop", content=await own_cancel(),
                            usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                            cached=False)


def own_cancel_brain(kind: str) -> Callable[[Turn], Any]:
    if kind == "plain_async":
        async def brain(turn: Turn) -> None:
            turn.reply(await own_cancel())
        return brain
    if kind == "pydantic_ai":
        async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            return ModelResponse(parts=[TextPart(await own_cancel())])
        return pydantic_ai_brain(Agent(FunctionModel(model)))
    if kind == "openai_agents":
        async def script(items: Any, tools: list[str]) -> list[Any]:
            return [say(await own_cancel())]
        return openai_agents_brain(SdkAgent(name="B", model=ScriptModel(script)))
    return autogen_brain(OwnCancelClient())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["plain_async", "pydantic_ai", "openai_agents", "autogen"])
def test_a_run_cancelled_by_itself_with_no_stop_is_a_failed_attempt(
    make_runtime: MakeRuntime, kind: str
) -> None:
    """A framework run that ended cancelled though nobody asked the turn to stop was taken
    for the stop the adapter cancels it on: the turn committed as stopped, the message
    acknowledged unanswered and never run again. As for a plain ``async def`` brain, the
    run's own CancelledError is the attempt's failure, and the row is retried."""
    rt = make_runtime(brain=own_cancel_brain(kind))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "hello")
    rt.run_until_idle(timeout=30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "CancelledError" in row["last_error"]
    assert rt.transcript(session) == []
