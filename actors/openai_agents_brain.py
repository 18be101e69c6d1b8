"""An OpenAI Agents SDK ``Agent`` as a kinbox brain (``pip install 'kinbox[openai-agents]'``).

The session's kinbox tools become the agent's ``FunctionTool``s, built from the JSON
Schemas a model sees (``turn.tools.schemas()``) and run through ``turn.tools.call``: a
model-issued ``agent_send`` is committed to the journal like any other, its arguments
checked by kinbox's rules, and a refusal (or arguments that are not JSON) comes back to
the model as ``{"error", "message"}`` it can act on. Every agent the top one can hand
off to, recursively, runs as a clone with these tools too (:class:`_Equipped`). The SDK
runs the function calls of one response at once; kinbox has them run one at a time, in
the model's order (so two ``agent_send``s reach their target in that order), unless the
caller's ``run_config`` sets its own ``tool_execution.max_function_tool_concurrency``:
the SDK has no such switch per tool, so that is every function tool's. A call of a tool
the agent lacks is answered to the model too
(``tool_not_found_behavior="return_error_to_model"``), not a failed run. An agent whose
own tool bears a kinbox tool's name fails the row for good (``PermanentFailure``) after
one attempt. The SDK's own ``UserError`` stays an ordinary failed attempt: it also
raises it for a state that passes (an MCP server not connected yet). An input
guardrail's tripwire (``InputGuardrailTripwireTriggered``) fails the row for good: every
attempt would give the guardrail the same input (an output guardrail's, whose output
a retry may change, stays an ordinary failed attempt). A run that paused for a tool's
approval (``needs_approval``) fails for good too: kinbox cannot resume it. The turn's
prompt and reply are those of every adapter (``framework_turns``); the session's earlier
conversation (``history=``, the newest 20 visible entries by default) comes before the
prompt as the run's input items (``{"role": "user" | "assistant", "content": ...}``); a
caller's stop cancels the run at once (the runtime's own stop lets it finish within
``stop_grace``).

Nothing leaves the machine unless configured: the SDK traces every run and, by default,
exports the traces to OpenAI's servers. Each run kinbox starts has tracing disabled
(``RunConfig.tracing_disabled``) unless the caller passes ``trace=True``, which leaves
tracing to the SDK's own set-up (``set_trace_processors`` and friends). The SDK's
global switches are left alone: they are the application's, not kinbox's. Only the
model the agent is given talks to anyone. A model call's error answer from the openai
client (``AuthenticationError``, ``RateLimitError``...) fails the attempt as
:mod:`.openai_status` says (for good, or retried after the wait it asked). The SDK is
imported here only, never on kinbox's core path.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

from agents import Agent, FunctionTool, RunConfig, RunContextWrapper, Runner, ToolExecutionConfig
from agents.exceptions import InputGuardrailTripwireTriggered
from agents.handoffs import Handoff
from agents.tool_context import ToolContext

from .errors import PermanentFailure
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
from .openai_status import openai_failure
from .turn import Turn
from .turn_history import DEFAULT_HISTORY

AgentFor = Callable[[Turn], Agent[Any]]
"""Builds (or returns) the agent for a turn: your model, instructions, settings."""


def kinbox_tools(turn: Turn) -> list[FunctionTool]:
    """The session's kinbox tools as Agents SDK function tools (an async turn's tools)."""
    tools = []
    for schema in turn.tools.schemas():
        fn = schema["function"]
        # Not strict: OpenAI's strict mode wants every property required, and kinbox's
        # tools have optional ones; kinbox checks each call against the schema anyway.
        tools.append(
            FunctionTool(
                name=fn["name"],
                description=fn["description"],
                params_json_schema=fn["parameters"],
                on_invoke_tool=_invoker(turn, fn["name"]),
                strict_json_schema=False,
            )
        )
    return tools


def _invoker(turn: Turn, name: str) -> Callable[[ToolContext[Any], str], Any]:
    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        return as_text(await call_tool(turn, name, arguments))

    return invoke


class _Equipped:
    """Clones of the user's agents, each with the kinbox tools added to its own: the top
    agent and every agent reachable from it by handoff, so a model handed off to can still
    ``agent_send``. Each agent is cloned once (a handoff cycle ends at the clone already
    made) and the user's agents and ``Handoff``s are never changed."""

    def __init__(self, tools: list[FunctionTool]) -> None:
        self.tools = tools
        # Keyed by id(); the original is kept alive beside its clone so an id is never reused.
        self.clones: dict[int, tuple[Agent[Any], Agent[Any]]] = {}

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        known = self.clones.get(id(agent))
        if known is not None:
            return known[1]
        _refuse_clash(agent, self.tools)
        handoffs: list[Any] = []
        clone = agent.clone(tools=[*agent.tools, *self.tools], handoffs=handoffs)
        self.clones[id(agent)] = (agent, clone)  # before the handoffs: they may lead back here
        handoffs.extend(self._handoff(h) for h in agent.handoffs)
        return clone

    def _handoff(self, entry: Any) -> Any:
        if isinstance(entry, Agent):
            return self.agent(entry)
        if not isinstance(entry, Handoff):
            return entry
        # The SDK runs the agent ``on_invoke_handoff`` returns: that of ``handoff(agent)`` is
        # the user's agent, that of a Handoff of one's own may be any agent, built at the
        # call. Either is swapped for its clone as it comes back.
        original = entry.on_invoke_handoff

        async def invoke(context: RunContextWrapper[Any], arguments: str) -> Agent[Any]:
            return self.agent(await original(context, arguments))

        wrapped: Handoff[Any, Any] = dataclasses.replace(entry, on_invoke_handoff=invoke)
        # ``replace`` leaves out the SDK's weak reference to the target (not an init field),
        # which it reads for the target's tool set-up before the handoff runs.
        # A private attribute: an SDK without it resolves the target at the call alone.
        ref = getattr(entry, "_agent_ref", None)
        target = ref() if ref is not None else None
        if isinstance(target, Agent):
            wrapped._agent_ref = weakref.ref(self.agent(target))
        return wrapped


def _refuse_clash(agent: Agent[Any], kinbox: list[FunctionTool]) -> None:
    """PermanentFailure if one of ``agent``'s own tools bears a kinbox tool's name: the SDK
    runs with both, only logging the collision, and routes a model's ``agent_send`` to one
    of them, so the user's function could run where kinbox would have journaled the send.
    Every attempt would be the same, so the row fails at once, the reason naming both."""
    ours = {tool.name for tool in kinbox}
    clash = sorted(ours.intersection(getattr(tool, "name", None) for tool in agent.tools))
    if clash:
        raise PermanentFailure(
            f"the agent {agent.name!r} has its own tool named {clash[0]!r}, as kinbox's "
            "tool is: rename the agent's tool"
        )


def with_kinbox_tools(agent: Agent[Any], turn: Turn) -> Agent[Any]:
    """A clone of ``agent`` with the turn's kinbox tools, as is every agent it can hand off
    to (``handoffs=[other]`` or ``handoff(other)``, recursively); ``agent`` is unchanged."""
    return _Equipped(kinbox_tools(turn)).agent(agent)


def _kinbox_tool_rules(config: RunConfig) -> RunConfig:
    """``config`` with the SDK's tool calls run as kinbox runs a model's: one function call
    at a time, in the model's order (each kinbox call committed before the next), unless it
    says how many run at once; and a call of a tool the agent lacks (a Focal-only tool on
    a plain session, a made-up name) answered to the model as an error it can act on, as
    kinbox's own refusals are, where the SDK's default fails the run (and so the attempt,
    and every retry of it) with ``ModelBehaviorError``."""
    execution = config.tool_execution or ToolExecutionConfig()
    if execution.max_function_tool_concurrency is None:
        execution = dataclasses.replace(execution, max_function_tool_concurrency=1)
    return dataclasses.replace(
        config, tool_execution=execution, tool_not_found_behavior="return_error_to_model"
    )


def openai_agents_brain(
    agent_for: Agent[Any] | AgentFor,
    *,
    run_config: RunConfig | None = None,
    trace: bool = False,
    max_turns: int | None = None,
    history: int = DEFAULT_HISTORY,
) -> Callable[[Turn], Any]:
    """An ``async def`` brain that runs ``agent_for`` (an agent, or a function of the turn)
    with ``Runner.run``: the session's kinbox tools added to the agent's own.

    ``run_config`` is passed on, with tracing disabled unless ``trace`` is True, one
    function call at a time unless it sets a concurrency, and a call of a tool the agent
    lacks answered to the model (see the module docstring);
    ``max_turns`` bounds the model calls of one kinbox turn (the SDK's default when None;
    one that is no whole number from 1 is a :class:`ConfigError` here); ``history`` how
    many of the session's earlier visible entries come before the prompt as input items
    (0: none, the prompt alone, as a string)."""
    size = history_size(history)
    config = _kinbox_tool_rules(run_config or RunConfig())
    if not trace:
        config = dataclasses.replace(config, tracing_disabled=True)
    limits: dict[str, Any] = (
        {} if max_turns is None else {"max_turns": count_from(max_turns, "max_turns", 1)}
    )

    async def brain(turn: Turn) -> None:
        agent = agent_for if isinstance(agent_for, Agent) else agent_for(turn)
        agent = with_kinbox_tools(agent, turn)
        earlier = await history_for(turn, size)
        prompt = await prompt_for(turn)
        given: str | list[Any] = prompt
        if earlier:
            given = [
                *({"role": r, "content": t} for r, t in earlier),
                {"role": "user", "content": prompt},
            ]
        try:
            stopped, result = await until_stopped(
                turn, Runner.run(agent, given, run_config=config, **limits)
            )
        except InputGuardrailTripwireTriggered as exc:
            # The application's guardrail refused the turn's input: every attempt gives it
            # the same input, so a retry only runs it (and the agent beside it) again.
            name = exc.guardrail_result.guardrail.get_name()
            raise PermanentFailure(
                f"the agent's input guardrail {name!r} refused the turn's input"
            ) from exc
        except Exception as exc:  # the SDK passes the openai client's errors on as raised
            failure = openai_failure(exc, turn.now())
            if failure is None:
                raise
            raise failure from exc
        if not stopped and result is not None:
            _refuse_interrupted(result)
            reply_with(turn, result.final_output)

    return brain


def _refuse_interrupted(result: Any) -> None:
    """PermanentFailure if the run paused for approval (a tool of the agent's with
    ``needs_approval``): the SDK returns it unfinished, the calls in ``interruptions`` and
    no output, to be resumed once approved. kinbox cannot resume it, and committing it
    acknowledged the message unanswered, with the writes of a run that never ended."""
    waiting = getattr(result, "interruptions", None)
    if waiting:
        names = sorted({str(getattr(item, "tool_name", None) or "?") for item in waiting})
        raise PermanentFailure(
            f"the run paused for approval of {', '.join(repr(n) for n in names)}, which "
            "kinbox cannot give: remove needs_approval from the agent's tools"
        )
