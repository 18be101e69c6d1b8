"""An autogen-core ``ChatCompletionClient`` as a kinbox brain (``pip install 'kinbox[autogen]'``).

autogen-core has no agent loop of its own to hand a prompt to: its agents are actors on
its own runtime, and a model's tool use is a loop around ``client.create(messages,
tools=...)``. So the brain is that loop, as an autogen-core agent writes it: the session's
kinbox tools are given to the model as autogen ``ToolSchema``s (the JSON Schemas of
``turn.tools.schemas()``), each ``FunctionCall`` it returns is run through
``turn.tools.call`` (a refusal, or arguments that are not JSON, goes back as the call's
``FunctionExecutionResult`` with ``is_error``), and its first text answer is the turn's
reply. The session's earlier conversation (``history=``, the newest 20 visible entries
by default) comes between the system message and the prompt, as ``UserMessage`` and
``AssistantMessage``s. The prompt, the reply rule and a stop's cancel are every adapter's
(``framework_turns``). kinbox starts no autogen runtime and sets up no telemetry: only
the client you give it talks to anyone. A client's error answer fails the attempt as
kinbox's HTTP rule says where the error carries a status (autogen-ext's OpenAI clients
raise the openai client's: :mod:`.openai_status`): for good, or retried after the wait it
asked. autogen-core is imported here only, never on kinbox's core path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from autogen_core import CancellationToken, FunctionCall
from autogen_core.models import (
    AssistantMessage,
    ChatCompletionClient,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    SystemMessage,
    UserMessage,
)
from autogen_core.tools import ToolSchema

from .errors import KinboxError, ToolRoundsExceeded
from .framework_turns import (
    as_text,
    call_tool,
    count_from,
    history_for,
    history_size,
    prompt_for,
    reply_with,
    until_stopped,
)
from .turn import Turn
from .turn_history import DEFAULT_HISTORY

ClientFor = Callable[[Turn], ChatCompletionClient]
"""Returns the model client for a turn (one client may serve every turn)."""


def kinbox_tool_schemas(turn: Turn) -> list[ToolSchema]:
    """The session's kinbox tools as autogen-core tool schemas."""
    return [
        ToolSchema(
            name=s["function"]["name"],
            description=s["function"]["description"],
            parameters=s["function"]["parameters"],
        )
        for s in turn.tools.schemas()
    ]


async def _run(turn: Turn, call: FunctionCall) -> FunctionExecutionResult:
    result = await call_tool(turn, call.name, call.arguments)
    refused = set(result) == {"error", "message"}
    return FunctionExecutionResult(
        content=as_text(result), name=call.name, call_id=call.id, is_error=refused
    )


def autogen_brain(
    client_for: ChatCompletionClient | ClientFor,
    *,
    system_message: str | None = None,
    max_tool_rounds: int = 10,
    history: int = DEFAULT_HISTORY,
) -> Callable[[Turn], Any]:
    """An ``async def`` brain that runs the tool-use loop on ``client_for`` (a client, or a
    function of the turn returning one).

    The model gets ``system_message`` (if any), the turn's prompt and the kinbox tools; after
    ``max_tool_rounds`` rounds of tool calls it is asked once more with no tools, and a
    model that still calls tools fails the attempt (``ToolRoundsExceeded``); a
    ``max_tool_rounds`` that is no whole number from 0 is a :class:`ConfigError` here.
    ``history`` is how many of the session's earlier visible entries come before the
    prompt (0: none)."""
    size = history_size(history)
    rounds = count_from(max_tool_rounds, "max_tool_rounds", 0)

    async def loop(turn: Turn, client: ChatCompletionClient, token: CancellationToken) -> object:
        messages: list[LLMMessage] = (
            [] if system_message is None else [SystemMessage(content=system_message)]
        )
        for role, text in await history_for(turn, size):
            messages.append(
                UserMessage(content=text, source="user")
                if role == "user"
                else AssistantMessage(content=text, source="assistant")
            )
        messages.append(UserMessage(content=await prompt_for(turn), source="user"))
        tools = kinbox_tool_schemas(turn)
        for _ in range(rounds):
            result = await client.create(messages, tools=tools, cancellation_token=token)
            if isinstance(result.content, str):
                return result.content
            messages.append(
                AssistantMessage(content=result.content, thought=result.thought, source="assistant")
            )
            # One at a time: each call is committed before the next, so the journal keeps
            # the order the model gave.
            outcomes = [await _run(turn, call) for call in result.content]
            messages.append(FunctionExecutionResultMessage(content=outcomes))
        last = await client.create(messages, cancellation_token=token)
        if isinstance(last.content, str):
            return last.content
        raise ToolRoundsExceeded(rounds)

    async def brain(turn: Turn) -> None:
        client = client_for if isinstance(client_for, ChatCompletionClient) else client_for(turn)
        token = CancellationToken()
        try:
            stopped, output = await until_stopped(turn, loop(turn, client, token))
        except asyncio.CancelledError:
            token.cancel()  # a client's request running apart from this task ends too
            raise
        except Exception as exc:
            failure = _client_failure(exc, turn.now())
            if failure is None:
                raise
            raise failure from exc
        if stopped:
            token.cancel()
        else:
            reply_with(turn, output)

    return brain


def _client_failure(error: Exception, now: float) -> KinboxError | None:
    """The brain failure a model client's error is, where its client says: autogen-core's
    own errors carry no HTTP status, but autogen-ext's OpenAI and Azure OpenAI clients pass
    the openai client's on (:mod:`.openai_status`); None for any other (an ordinary failed
    attempt), and when openai is not installed (no client raises its errors then)."""
    try:
        from .openai_status import openai_failure
    except ImportError:
        return None
    return openai_failure(error, now)
