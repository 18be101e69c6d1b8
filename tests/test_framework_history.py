"""A chat's second turn sees its first, on each framework brain, with the framework's own
test model: pydantic-ai's ``FunctionModel`` gets the earlier entries as its
``message_history``, the OpenAI Agents SDK's model as input items before the prompt,
autogen's ``ReplayChatCompletionClient`` as ``UserMessage``/``AssistantMessage``s. Each
adapter used to hand its model the current turn's messages alone."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
pytest.importorskip("agents", reason="the openai-agents extra is not installed")
pytest.importorskip("autogen_ext.models.replay", reason="the autogen extra is not installed")

from agents import Agent as SdkAgent
from agents.items import TResponseInputItem, TResponseOutputItem
from autogen_core.models import AssistantMessage, UserMessage
from autogen_ext.models.replay import ReplayChatCompletionClient
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kinbox.actors import ConfigError, ManualClock, Runtime
from kinbox.actors.autogen_brain import autogen_brain
from kinbox.actors.openai_agents_brain import openai_agents_brain
from kinbox.actors.pydantic_ai_brain import message_history, pydantic_ai_brain
from kinbox.persistence import TurnEntry

from .test_openai_agents import ScriptModel, call, say

pytestmark = pytest.mark.timeout(60)

MakeRuntime = Callable[..., Runtime]


def chat(rt: Runtime) -> str:
    return rt.create_session(rt.create_project("chat").id, "Chat").id


def ask(rt: Runtime, session: str, *questions: str) -> None:
    """Each question a turn of its own, in order."""
    for question in questions:
        rt.post(session, question)
        rt.run_until_idle(timeout=30)


def said(messages: list[ModelMessage]) -> list[tuple[str, str]]:
    """What a pydantic-ai model was given, as (who, text) in order."""
    out: list[tuple[str, str]] = []
    for m in messages:
        for p in m.parts:
            if isinstance(p, UserPromptPart):
                out.append(("user", str(p.content)))
            elif isinstance(p, TextPart):
                out.append(("assistant", p.content))
    return out


def pydantic_chat(
    make_runtime: MakeRuntime, answers: list[str], **options: Any
) -> tuple[Runtime, list[list[ModelMessage]]]:
    seen: list[list[ModelMessage]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return ModelResponse(parts=[TextPart(answers[len(seen) - 1])])

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model)), **options))
    return rt, seen


def test_a_pydantic_ai_model_sees_the_chats_earlier_turns_as_its_message_history(
    make_runtime: MakeRuntime,
) -> None:
    rt, seen = pydantic_chat(make_runtime, ["4", "12"])
    session = chat(rt)
    ask(rt, session, "what is 2+2?", "and times 3?")
    assert said(seen[0]) == [("user", "user: what is 2+2?")]  # a fresh session: none
    assert said(seen[1]) == [
        ("user", "user: what is 2+2?"),
        ("assistant", "4"),
        ("user", "user: and times 3?"),
    ]
    assert [type(m) for m in seen[1]] == [ModelRequest, ModelResponse, ModelRequest]


def test_a_pydantic_ai_agents_system_prompt_is_kept_on_every_turn(
    make_runtime: MakeRuntime,
) -> None:
    """pydantic-ai adds an agent's ``system_prompt`` (static, or of ``@agent.system_prompt``
    functions) only to a run with no ``message_history``: it takes a history for one its
    earlier runs made, which holds them. kinbox's history is rebuilt from the transcript
    and holds none, so from a chat's second turn on the agent lost its system prompt, the
    rules it was given. The history now starts with the agent's system prompt parts."""
    from pydantic_ai.messages import SystemPromptPart

    seen: list[list[ModelMessage]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return ModelResponse(parts=[TextPart("oui")])

    agent = Agent(FunctionModel(model), system_prompt="Answer in French.")

    @agent.system_prompt
    def house_rules() -> str:
        return "Never delete a repository."

    rt = make_runtime(brain=pydantic_ai_brain(agent))
    ask(rt, chat(rt), "hello?", "and now?", "still there?")

    def system(messages: list[ModelMessage]) -> list[str]:
        return [p.content for m in messages for p in m.parts if isinstance(p, SystemPromptPart)]

    assert [system(m) for m in seen] == [["Answer in French.", "Never delete a repository."]] * 3
    assert [said(m) for m in seen][2] == [
        ("user", "user: hello?"), ("assistant", "oui"),
        ("user", "user: and now?"), ("assistant", "oui"),
        ("user", "user: still there?"),
    ]


def test_history_zero_keeps_the_turns_messages_alone(make_runtime: MakeRuntime) -> None:
    rt, seen = pydantic_chat(make_runtime, ["4", "12"], history=0)
    ask(rt, chat(rt), "what is 2+2?", "and times 3?")
    assert said(seen[1]) == [("user", "user: and times 3?")]


def test_the_limit_is_honoured_and_a_history_starting_with_a_reply_starts_with_a_request(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    """With ``history=2`` the third turn's window is [reply 1, a line the user typed into
    the session]: a history that starts with a response is no valid pydantic-ai history,
    so the reply is left out, and the typed line and the new question are two user
    entries in a row."""
    rt, seen = pydantic_chat(make_runtime, ["first answer", "third answer"], history=2)
    session = chat(rt)
    ask(rt, session, "q1")
    rt.context.store.append(session, [TurnEntry("user", "typed", True)], clock.now())
    ask(rt, session, "q3")
    assert said(seen[1]) == [("user", "user: typed"), ("user", "user: q3")]
    assert isinstance(seen[1][0], ModelRequest)
    assert [e.text for e in rt.transcript(session)][-1] == "third answer"


def test_message_history_starts_with_a_request_and_alternates() -> None:
    lines = [
        ("assistant", "a0"),
        ("user", "u1"),
        ("user", "u2"),
        ("assistant", "a1"),
        ("assistant", "a2"),
        ("user", "u3"),
    ]
    history = message_history(lines)
    assert [type(m) for m in history] == [ModelRequest, ModelResponse, ModelRequest]
    assert said(history) == [
        ("user", "u1"),
        ("user", "u2"),
        ("assistant", "a1"),
        ("assistant", "a2"),
        ("user", "u3"),
    ]
    assert message_history([("assistant", "a0")]) == []


def test_a_focal_turn_is_still_headed_by_its_context_after_its_history(
    make_runtime: MakeRuntime,
) -> None:
    """The history is the transcript as stored (no context in it); the context heads the
    current turn's prompt, where it is computed for this turn."""
    rt, seen = pydantic_chat(make_runtime, ["nothing yet", "still nothing"])
    rt.create_project("website")
    focal = rt.get_or_create_focal_chat().id
    ask(rt, focal, "what is going on?", "and now?")
    lines = said(seen[1])
    assert lines[:2] == [("user", "user: what is going on?"), ("assistant", "nothing yet")]
    assert len(lines) == 3 and lines[2][0] == "user"
    assert "website" in lines[2][1] and lines[2][1].endswith("user: and now?")
    assert not lines[2][1].startswith("user:")


def test_an_openai_agents_model_gets_the_earlier_turns_as_input_items(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    """Turn 2's first attempt calls a tool and then its model fails: nothing of that
    attempt is committed, so its retry's input is the same history (no tool call in it)."""
    inputs: list[list[TResponseInputItem]] = []

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        inputs.append(list(items))
        if len(inputs) == 1:
            return [say("Paris")]
        if len(inputs) == 2:
            return [call("task_create", {"title": "look up the population"})]
        if len(inputs) == 3:
            raise ConnectionError("model unreachable")
        return [say("about 2 million")]

    rt = make_runtime(brain=openai_agents_brain(SdkAgent(name="A", model=ScriptModel(model))))
    session = chat(rt)
    ask(rt, session, "capital of France?", "how many live there?")
    assert rt.inbox()[-1]["attempts"] == 1
    clock.advance(2)
    rt.run_until_idle(timeout=30)
    assert [(i.get("role"), i.get("content")) for i in inputs[0]] == [
        ("user", "user: capital of France?")
    ]
    earlier = [("user", "user: capital of France?"), ("assistant", "Paris")]
    current = ("user", "user: how many live there?")
    for items in (inputs[1], inputs[3]):  # turn 2's first attempt, and its retry
        assert [(i.get("role"), i.get("content")) for i in items] == [*earlier, current]
    assert rt.tools_for(session).task_list() == {"tasks": []}
    assert [e.text for e in rt.transcript(session)][-1] == "about 2 million"


def test_an_autogen_model_gets_the_earlier_turns_and_never_a_hidden_entry(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    client = ReplayChatCompletionClient(["hello, Ada", "you are Ada"])
    rt = make_runtime(brain=autogen_brain(client, system_message="Be brief."))
    session = chat(rt)
    ask(rt, session, "I am Ada")
    # A social delivery's note: a hidden entry of the transcript, never shown to a model.
    rt.context.store.append(
        session, [TurnEntry("delivery", "note: sent", False, None)], clock.now()
    )
    ask(rt, session, "who am I?")
    first, second = (c["messages"] for c in client.create_calls)
    assert [(type(m), m.content) for m in first[1:]] == [(UserMessage, "user: I am Ada")]
    assert [(type(m), m.content) for m in second[1:]] == [
        (UserMessage, "user: I am Ada"),
        (AssistantMessage, "hello, Ada"),
        (UserMessage, "user: who am I?"),
    ]
    assert "note: sent" not in json.dumps([str(m) for m in second])


@pytest.mark.parametrize("history", [-1, 1001, True, "20", 2.0, None])
def test_a_bad_history_is_refused_where_the_brain_is_built(history: object) -> None:
    model = FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("x")]))
    for build in (
        lambda: pydantic_ai_brain(Agent(model), history=history),  # type: ignore[arg-type]
        lambda: openai_agents_brain(SdkAgent(name="A"), history=history),  # type: ignore[arg-type]
        lambda: autogen_brain(ReplayChatCompletionClient([]), history=history),
    ):  # type: ignore[arg-type]
        with pytest.raises(ConfigError) as err:
            build()
        assert err.value.field == "history"
