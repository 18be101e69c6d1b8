"""A pydantic-ai ``Agent`` as a kinbox brain (``pip install 'kinbox[pydantic-ai]'``).

The session's kinbox tools become the agent's tools, built from the same
JSON Schemas a model sees (``turn.tools.schemas()``) and run through
``turn.tools.call``: so a model-issued ``agent_send`` is committed to the
journal like any other, its arguments checked by the same rules, and a
refusal comes back to the model as ``{"error", "message"}`` it can act on.
The turn's messages (each labelled with who sent it) are the prompt, headed by the
turn's context where it has one (a Focal turn's global context); the agent's output is
the turn's reply. pydantic-ai is imported here only,
never on kinbox's core path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pydantic_ai import Tool
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.toolsets import FunctionToolset

from .turn import Turn

AgentFor = Callable[[Turn], AbstractAgent[Any, Any]]
"""Builds (or returns) the pydantic-ai agent for a turn: your model, instructions, settings."""


def kinbox_toolset(turn: Turn) -> FunctionToolset[Any]:
    """The session's kinbox tools as a pydantic-ai toolset (an async turn's tools)."""
    tools = []
    for schema in turn.tools.schemas():
        fn = schema["function"]
        tools.append(Tool.from_schema(_caller(turn, fn["name"]), name=fn["name"],
                                      description=fn["description"],
                                      json_schema=fn["parameters"]))
    return FunctionToolset(tools)


def _caller(turn: Turn, name: str) -> Callable[..., Any]:
    async def call(**arguments: Any) -> Any:
        return await turn.tools.call(name, arguments)
    call.__name__ = name
    return call


def prompt_of(turn: Turn) -> str:
    """The turn's messages as one prompt, each line naming its speaker."""
    return "\n\n".join(m.as_prompt() for m in turn.messages)


def pydantic_ai_brain(agent_for: AbstractAgent[Any, Any] | AgentFor) -> Callable[[Turn], Any]:
    """An ``async def`` brain that runs ``agent_for`` (an agent, or a function of the turn).

    Any pydantic-ai agent: an ``Agent``, or a wrapper of one (``WrapperAgent``, the
    durable-execution agents), which is no ``Agent`` subclass."""
    async def brain(turn: Turn) -> None:
        agent = agent_for if isinstance(agent_for, AbstractAgent) else agent_for(turn)
        # The turn's extra context (Focal's global context, FO3) heads the prompt. Read off
        # the loop: on a turn that has not looked yet, it reads the session.
        context = await asyncio.to_thread(lambda: turn.context)
        prompt = prompt_of(turn) if not context else f"{context}\n\n{prompt_of(turn)}"
        result = await agent.run(prompt, toolsets=[kinbox_toolset(turn)])
        output = result.output
        # Only an empty answer is no reply: 0, False or [] are the agent's answer too.
        if output is not None and output != "":
            turn.reply(output if isinstance(output, str) else str(output))
    return brain
