"""A pydantic-ai ``Agent`` as a kinbox brain (``pip install 'kinbox[pydantic-ai]'``).

The session's kinbox tools become the agent's tools, built from the same
JSON Schemas a model sees (``turn.tools.schemas()``) and run through
``turn.tools.call``: so a model-issued ``agent_send`` is committed to the
journal like any other, its arguments checked by the same rules, and a
refusal comes back to the model as ``{"error", "message"}`` it can act on.
The turn's messages (each labelled with who sent it) are the prompt, headed by the
turn's context where it has one (a Focal turn's global context); the agent's output is
the turn's reply, and a caller's stop cancels the agent's run at once (``framework_turns``,
as for every adapter; the runtime's own stop lets it finish within ``stop_grace``).
pydantic-ai is imported here only, never on kinbox's core path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai import Tool
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.toolsets import FunctionToolset

from .framework_turns import prompt_for, prompt_of, reply_with, until_stopped
from .turn import Turn

__all__ = ["AgentFor", "kinbox_toolset", "prompt_of", "pydantic_ai_brain"]

AgentFor = Callable[[Turn], AbstractAgent[Any, Any]]
"""Builds (or returns) the pydantic-ai agent for a turn: your model, instructions, settings."""


def kinbox_toolset(turn: Turn) -> FunctionToolset[Any]:
    """The session's kinbox tools as a pydantic-ai toolset (an async turn's tools)."""
    tools = []
    for schema in turn.tools.schemas():
        fn = schema["function"]
        tools.append(
            Tool.from_schema(
                _caller(turn, fn["name"]),
                name=fn["name"],
                description=fn["description"],
                json_schema=fn["parameters"],
            )
        )
    return FunctionToolset(tools)


def _caller(turn: Turn, name: str) -> Callable[..., Any]:
    async def call(**arguments: Any) -> Any:
        return await turn.tools.call(name, arguments)

    call.__name__ = name
    return call


def pydantic_ai_brain(agent_for: AbstractAgent[Any, Any] | AgentFor) -> Callable[[Turn], Any]:
    """An ``async def`` brain that runs ``agent_for`` (an agent, or a function of the turn).

    Any pydantic-ai agent: an ``Agent``, or a wrapper of one (``WrapperAgent``, the
    durable-execution agents), which is no ``Agent`` subclass."""

    async def brain(turn: Turn) -> None:
        agent = agent_for if isinstance(agent_for, AbstractAgent) else agent_for(turn)
        stopped, result = await until_stopped(
            turn, agent.run(await prompt_for(turn), toolsets=[kinbox_toolset(turn)])
        )
        if not stopped and result is not None:
            reply_with(turn, result.output)

    return brain
