"""Framework brains never hold the event loop their turns share (B1).

Every async turn of a runtime shares one loop thread, so a database statement run there
(a read, a commit waited for) stalls every other turn until it ends. Here thirty turns of
each framework brain (pydantic-ai, the OpenAI Agents SDK, autogen-core, each on its own
scripted model) run at once on four blocking workers, and each model calls kinbox's
tools of every kind in one response: a send, a task written and listed, reads, and a
foreground sub-agent awaited. Every statement the runtime runs on the loop's thread is
recorded: there must be none, and every call must have reached its tool (a sync call
made on the loop would come back refused).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
pytest.importorskip("agents", reason="the openai-agents extra is not installed")
pytest.importorskip("autogen_ext", reason="the autogen extra is not installed")

from agents import Agent as SdkAgent
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, FunctionExecutionResultMessage, RequestUsage
from autogen_ext.models.replay import ReplayChatCompletionClient
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kinbox.actors import Runtime, Turn
from kinbox.actors.autogen_brain import autogen_brain
from kinbox.actors.openai_agents_brain import openai_agents_brain
from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

from .test_openai_agents import ScriptModel, call, say, tool_outputs
from .test_pydantic_ai import tool_returns

pytestmark = pytest.mark.timeout(120)

MakeRuntime = Callable[..., Runtime]
Calls = Callable[[], list[tuple[str, dict[str, Any]]]]
"""A session's tool calls of one model response, (name, arguments) each."""
Seen = Callable[[object], None]
"""Keeps a tool result a model read."""

TURNS = 30


def pydantic(calls: Calls, seen: Seen) -> Callable[[Turn], Any]:
    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if returns := tool_returns(messages):
            for part in returns:
                seen(part.content)
            return ModelResponse(parts=[TextPart("all done")])
        return ModelResponse(
            parts=[ToolCallPart(n, a, f"call-{i}") for i, (n, a) in enumerate(calls())]
        )

    return pydantic_ai_brain(Agent(FunctionModel(model)))


def openai_agents(calls: Calls, seen: Seen) -> Callable[[Turn], Any]:
    async def model(items: Any, tools: list[str]) -> list[Any]:
        if outputs := tool_outputs(items):
            for output in outputs:
                seen(output)
            return [say("all done")]
        return [call(n, a, f"call-{i}") for i, (n, a) in enumerate(calls())]

    return openai_agents_brain(SdkAgent(name="Worker", model=ScriptModel(model)))


class ScriptedClient(ReplayChatCompletionClient):
    """autogen's replayed client: the calls, then the answer; it keeps what the tools gave."""

    def __init__(self, calls: Calls, seen: Seen) -> None:
        made = [
            FunctionCall(id=f"call-{i}", name=n, arguments=json.dumps(a))
            for i, (n, a) in enumerate(calls())
        ]
        super().__init__(
            [
                CreateResult(
                    finish_reason="function_calls",
                    content=made,
                    cached=False,
                    usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                ),
                "all done",
            ]
        )
        self.seen = seen

    async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
        for m in messages:
            if isinstance(m, FunctionExecutionResultMessage):
                for result in m.content:
                    self.seen(json.loads(result.content))
        return await super().create(messages, **kwargs)


def autogen(calls: Calls, seen: Seen) -> Callable[[Turn], Any]:
    return autogen_brain(lambda turn: ScriptedClient(calls, seen))


def statements_on_the_loop(rt: Runtime) -> list[str]:
    """The SQL of each statement run on the event loop's thread from now on."""
    db = rt.context.journal.t.db
    real, on_loop = db.execute_sql, []

    def execute_sql(sql: str, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "kinbox-async":
            on_loop.append(sql)
        return real(sql, *args, **kwargs)

    db.execute_sql = execute_sql
    return on_loop


@pytest.mark.parametrize(
    "framework", [pydantic, openai_agents, autogen], ids=["pydantic_ai", "openai_agents", "autogen"]
)
def test_framework_turns_with_every_kind_of_tool_call_run_nothing_on_the_loop(
    make_runtime: MakeRuntime, framework: Callable[[Calls, Seen], Callable[[Turn], Any]]
) -> None:
    ids: dict[str, str] = {}
    workers: set[str] = set()
    results: list[object] = []

    def calls() -> list[tuple[str, dict[str, Any]]]:
        return [
            ("agent_send", {"agent_id": ids["bob"], "message": "a note"}),
            ("task_create", {"title": "look into it"}),
            ("task_list", {}),
            ("agent_list", {}),
            ("agent_read", {"agent_id": ids["bob"]}),
            ("list_agents", {}),
            ("agent", {"description": "check the numbers", "run_in_background": False}),
        ]

    framework_brain = framework(calls, results.append)

    async def brain(turn: Turn) -> str | None:
        if turn.session_id in workers:
            await framework_brain(turn)
            return None
        return "checked" if turn.session_id.startswith("subagent") else None

    rt = make_runtime(brain=brain, max_active_sessions=4)  # 4 blocking workers
    project = rt.create_project("busy")
    ids["bob"] = rt.create_session(project.id, "Bob").id
    workers.update(rt.create_session(project.id, f"worker {i}").id for i in range(TURNS))
    on_loop = statements_on_the_loop(rt)
    for sid in workers:
        rt.post(sid, "get to work")
    rt.run_until_idle(timeout=90)
    assert {rt.transcript(sid)[-1].text for sid in workers} == {"all done"}
    assert len(results) == TURNS * len(calls())
    assert [r for r in results if isinstance(r, dict) and "error" in r] == []
    assert on_loop == []
