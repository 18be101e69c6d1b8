"""A pydantic-ai ``Agent`` as a kinbox brain (``pip install 'kinbox[pydantic-ai]'``).

The session's kinbox tools become the agent's tools, built from the same
JSON Schemas a model sees (``turn.tools.schemas()``) and run through
``turn.tools.call``: so a model-issued ``agent_send`` is committed to the
journal like any other, its arguments checked by the same rules, and a
refusal comes back to the model as ``{"error", "message"}`` it can act on. Arguments
that are no JSON object (a list, a string) are refused before the tool runs, as kinbox
refuses them, through pydantic-ai's own argument check: the model reads it as it reads
arguments that are not JSON, a retry prompt. kinbox's tools run one at a time, in the
order the model gave them (the agent's own tools still run at once around them).
The turn's messages (each labelled with who sent it) are the prompt, headed by the
turn's context where it has one (a Focal turn's global context); the agent's output is
the turn's reply. The session's earlier conversation (``history=``, the newest 20 visible
entries by default) is the run's ``message_history``: each user entry a ``ModelRequest``
and each reply a ``ModelResponse``, entries in a row of one role merged into one message
and a reply whose question fell out of the window left out, so the history starts with a
request and alternates as pydantic-ai requires, headed by the agent's system prompt (which
pydantic-ai adds only to a run with no history). A caller's stop cancels the agent's run at
once (``framework_turns``,
as for every adapter; the runtime's own stop lets it finish within ``stop_grace``).
A model API's error answer (``ModelHTTPError``) fails the attempt as kinbox's rule for
HTTP statuses says (:func:`.http_failure.model_http_failure`): 400, 401, 403, 404 and 422
for good (``PermanentFailure``), 408, 429 and 5xx with the wait the answer asked
(``RetryLater``, its ``retry_after``), any other as an ordinary failed attempt; a request
pydantic-ai reads as refused (``ModelRequestRejectedError``) for good too where its status
says nothing else (none: refused before it was sent, or in a stream; a 413). A
``UserError`` of pydantic-ai (a mistake in the agent's set-up, such as a tool of its own
named as a kinbox tool, which every attempt would repeat) fails the row for good, as does
a run that ends with tool calls deferred (``DeferredToolRequests``: kinbox cannot resume it).
pydantic-ai is imported here only, never on kinbox's core path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pydantic_ai
from pydantic_ai import RunContext, Tool
from pydantic_ai import exceptions as _pai_errors
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.exceptions import FallbackExceptionGroup, ModelHTTPError, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.toolsets import FunctionToolset, ToolsetTool
from pydantic_core import PydanticCustomError, SchemaValidator, core_schema

from .errors import PermanentFailure, RetryLater, ToolError
from .framework_turns import (
    history_for,
    history_size,
    prompt_for,
    prompt_of,
    reply_with,
    until_stopped,
)
from .http_failure import fallback_failure, model_http_failure
from .tool_schemas import object_arguments
from .turn import Turn
from .turn_history import DEFAULT_HISTORY

__all__ = [
    "AgentFor",
    "KinboxToolset",
    "kinbox_toolset",
    "message_history",
    "prompt_of",
    "pydantic_ai_brain",
    "with_system_prompt",
]

_REJECTED: tuple[type[Exception], ...] = tuple(
    c for c in (getattr(_pai_errors, "ModelRequestRejectedError", None),) if c is not None
)
"""pydantic-ai's category of a request the model API refuses (pydantic-ai 2), raised with
no HTTP status where no answer came: before the request is sent, or as an error event in
a stream. Its subclasses: a bad key, an unknown model, a context window exceeded."""
_MODEL_ERRORS: tuple[type[Exception], ...] = (ModelHTTPError, *_REJECTED)

AgentFor = Callable[[Turn], AbstractAgent[Any, Any]]
"""Builds (or returns) the pydantic-ai agent for a turn: your model, instructions, settings."""


class KinboxToolset(FunctionToolset[Any]):
    """kinbox's tools, each with the argument check of :func:`_arguments_check` (its class
    name is the one pydantic-ai's errors give, a tool name clashing with the agent's own)."""

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            name: dataclasses.replace(tool, args_validator=_arguments_check(name))
            for name, tool in (await super().get_tools(ctx)).items()
        }


@functools.cache
def _arguments_check(name: str) -> SchemaValidator:
    """What pydantic-ai checks ``name``'s arguments against: that they are a JSON object.

    ``Tool.from_schema`` lets any JSON value through and then unpacks it as keywords, so a
    list or a string crashed the run and ``null`` tripped an assertion: a failed attempt
    the model never learnt the reason of. kinbox checks the rest (names, types, limits)
    when the tool runs, and that refusal is the tool's result."""

    def check(arguments: object) -> dict[str, Any]:
        try:
            return object_arguments(name, arguments)
        except ToolError as exc:
            raise PydanticCustomError(exc.code, exc.message) from None

    return SchemaValidator(core_schema.no_info_plain_validator_function(check))


def kinbox_toolset(turn: Turn) -> KinboxToolset:
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
                # One at a time, in the model's order (pydantic-ai runs a response's calls
                # at once): each is committed before the next, so two agent_sends of one
                # response reach their target in the order the model gave.
                sequential=True,
            )
        )
    return KinboxToolset(tools)


def _caller(turn: Turn, name: str) -> Callable[..., Any]:
    async def call(**arguments: Any) -> Any:
        return await turn.tools.call(name, arguments)

    call.__name__ = name
    return call


def message_history(lines: list[tuple[str, str]]) -> list[ModelMessage]:
    """``(role, text)`` lines (:func:`.framework_turns.history_for`) as pydantic-ai messages
    that start with a request and alternate: user lines in a row are one ``ModelRequest``
    of several prompt parts, replies in a row one ``ModelResponse`` of several text parts,
    and replies before the first user line (their question older than the window) are left
    out. A history ending with a request (a turn that did not reply) is followed by the
    run's own prompt, which pydantic-ai merges into it."""
    runs: list[tuple[str, list[str]]] = []
    for role, text in lines:
        if runs and runs[-1][0] == role:
            runs[-1][1].append(text)
        elif runs or role == "user":
            runs.append((role, [text]))
    messages: list[ModelMessage] = []
    for role, texts in runs:
        if role == "user":
            asked: list[ModelRequestPart] = [UserPromptPart(t) for t in texts]
            messages.append(ModelRequest(parts=asked))
        else:
            answered: list[ModelResponsePart] = [TextPart(t) for t in texts]
            messages.append(ModelResponse(parts=answered))
    return messages


async def with_system_prompt(
    agent: AbstractAgent[Any, Any], messages: list[ModelMessage], prompt: str
) -> list[ModelMessage]:
    """``messages`` (:func:`message_history`) headed by the agent's system prompt parts.

    pydantic-ai adds an agent's ``system_prompt`` (static, or of its ``@agent.system_prompt``
    functions) only to a run with no history, taking a history for one its own earlier run
    made, which holds them; one rebuilt from the transcript holds none, and the agent lost
    its system prompt from a chat's second turn on. Its own answer for a history rebuilt so
    (``system_prompt_parts``; a pydantic-ai without it gets the history as it is)."""
    parts_of = getattr(agent, "system_prompt_parts", None)
    if not messages or parts_of is None:
        return messages
    parts = await parts_of(message_history=messages, prompt=prompt)
    first = messages[0]
    if not parts or not isinstance(first, ModelRequest):
        return messages
    return [dataclasses.replace(first, parts=[*parts, *first.parts]), *messages[1:]]


def pydantic_ai_brain(
    agent_for: AbstractAgent[Any, Any] | AgentFor, *, history: int = DEFAULT_HISTORY
) -> Callable[[Turn], Any]:
    """An ``async def`` brain that runs ``agent_for`` (an agent, or a function of the turn).

    Any pydantic-ai agent: an ``Agent``, or a wrapper of one (``WrapperAgent``, the
    durable-execution agents), which is no ``Agent`` subclass. ``history`` is how many of
    the session's earlier visible entries the run gets as its ``message_history`` (0:
    none, the turn's messages alone)."""
    size = history_size(history)

    async def run(turn: Turn, agent: AbstractAgent[Any, Any]) -> Any:
        prompt = await prompt_for(turn)
        earlier = await with_system_prompt(
            agent, message_history(await history_for(turn, size)), prompt
        )
        return await agent.run(
            prompt, message_history=earlier or None, toolsets=[kinbox_toolset(turn)]
        )

    async def brain(turn: Turn) -> None:
        agent = agent_for if isinstance(agent_for, AbstractAgent) else agent_for(turn)
        try:
            stopped, result = await until_stopped(turn, run(turn, agent))
        except UserError as exc:  # the application's mistake: every attempt would repeat it
            raise PermanentFailure(f"pydantic-ai refused the agent: {exc}") from exc
        except _MODEL_ERRORS as exc:
            failure = _http_failure(exc)
            if failure is None:
                raise
            raise failure from exc
        except FallbackExceptionGroup as group:  # a FallbackModel's: every model failed
            failure = fallback_failure(
                [_http_failure(e) for e in group.exceptions], "the FallbackModel"
            )
            if failure is None:
                raise
            raise failure from group
        if not stopped and result is not None:
            _refuse_deferred(result.output)
            reply_with(turn, result.output)

    return brain


def _refuse_deferred(output: object) -> None:
    """PermanentFailure if the run ended with tool calls deferred (``DeferredToolRequests``
    among the agent's output types: calls awaiting approval, ``requires_approval``, or an
    outside result), to be resumed once they have one. kinbox cannot resume it; replied,
    the request was the answer, and the message acknowledged."""
    deferred = getattr(pydantic_ai, "DeferredToolRequests", None)
    if deferred is None or not isinstance(output, deferred):
        return
    calls = [*output.calls, *output.approvals]
    names = sorted({str(call.tool_name) for call in calls}) or ["?"]
    raise PermanentFailure(
        f"the run ended waiting on {', '.join(repr(n) for n in names)} (DeferredToolRequests), "
        "which kinbox cannot resume: leave DeferredToolRequests out of the agent's output types"
    )


def _http_failure(error: BaseException) -> PermanentFailure | RetryLater | None:
    """The brain failure a model's error answer is (:func:`.http_failure.model_http_failure`;
    pydantic-ai read its wait off the answer, ``Retry-After`` or ``retry-after-ms``); a
    request pydantic-ai reads as refused (:data:`_REJECTED`) for good where the status says
    nothing else (no status, or one such as 413 the rule has no word for), as a 400 is;
    None for any other error."""
    if isinstance(error, ModelHTTPError):
        failure = model_http_failure(error.status_code, error.retry_after, "the model API")
        if failure is not None or not isinstance(error, _REJECTED):
            return failure
    if isinstance(error, _REJECTED):
        return PermanentFailure(
            f"the model API refused the request ({type(error).__name__}): the same request "
            "cannot succeed later"
        )
    return None
