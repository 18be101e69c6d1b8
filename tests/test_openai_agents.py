"""The OpenAI Agents SDK as the brain: ``Agent``s run by ``Runner.run`` on a ``Model`` of the
test's own (the SDK's model interface, answering from a script; no network). Alice's model
calls kinbox's ``agent_send``; the message is committed to the journal and Bob runs his own
Agents SDK turn on it. Each run kinbox starts sends no trace anywhere."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, Model, ModelResponse, ModelSettings, Tool, Usage, function_tool
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff, handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import ModelTracing
from agents.tracing import Span, Trace, TracingProcessor, setup
from agents.tracing.processors import BackendSpanExporter, BatchTraceProcessor
from agents.tracing.provider import DefaultTraceProvider
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from kinbox.actors import ConfigError, ManualClock, Runtime, Turn
from kinbox.actors.openai_agents_brain import openai_agents_brain

from .framework_family import REFUSED_TOOL_CALLS, ask_for_review, assert_reviewed, pr_review_family
from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]
Script = Callable[[list[TResponseInputItem], list[str]], Awaitable[list[TResponseOutputItem]]]


class ScriptModel(Model):
    """The SDK's ``Model`` interface answering from ``script(input items, tool names)``."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        items: list[TResponseInputItem] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else input
        )
        output = await self.script(items, [t.name for t in tools])
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("kinbox's adapter runs the agent without streaming")


def say(text: str) -> TResponseOutputItem:
    return ResponseOutputMessage(
        id="msg-1",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def call(
    name: str, arguments: dict[str, Any] | str, call_id: str = "call-1"
) -> TResponseOutputItem:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ResponseFunctionToolCall(
        id=call_id, call_id=call_id, type="function_call", name=name, arguments=text
    )


def tool_outputs(items: list[TResponseInputItem]) -> list[Any]:
    return [
        json.loads(str(i["output"]))
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]


def user_text(items: list[TResponseInputItem]) -> str:
    first = items[0]
    assert isinstance(first, dict)
    return str(first["content"])


class Recorder(TracingProcessor):
    """A trace processor that keeps what reached it: what an exporter would have sent."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_trace_start(self, trace: Trace) -> None:
        self.seen.append(f"trace {trace.name}")

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        self.seen.append(f"span {span.span_data.type}")

    def on_span_end(self, span: Span[Any]) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


class Ingest(BaseHTTPRequestHandler):
    """A trace-ingest endpoint on 127.0.0.1 standing in for OpenAI's: keeps each body."""

    bodies: list[bytes]

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Traces:
    """What the SDK's tracing did: the spans its processors saw, and the export requests
    its real exporter (``BackendSpanExporter``, as set up by default, but posting to a
    server on 127.0.0.1 with a made-up key) sent once flushed."""

    def __init__(
        self, recorder: Recorder, exporter: BatchTraceProcessor, bodies: list[bytes]
    ) -> None:
        self.recorder, self.exporter, self.bodies = recorder, exporter, bodies

    def sent(self) -> list[bytes]:
        self.exporter.force_flush()
        return self.bodies


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> Iterator[Traces]:
    """The SDK's global trace provider, for this test, with a recorder and the SDK's own
    exporter (to a local endpoint in place of OpenAI's), tracing switched on as it is by
    default: a run that traces reaches both."""
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    bodies: list[bytes] = []
    handler = type("Handler", (Ingest,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    exporter = BatchTraceProcessor(
        BackendSpanExporter(
            api_key="sk-not-a-key", endpoint=f"http://127.0.0.1:{server.server_port}/traces"
        )
    )
    recorder = Recorder()
    provider = DefaultTraceProvider()
    provider.register_processor(recorder)
    provider.register_processor(exporter)
    monkeypatch.setattr(setup, "GLOBAL_TRACE_PROVIDER", provider)
    yield Traces(recorder, exporter, bodies)
    exporter.shutdown()
    server.shutdown()
    server.server_close()
    serving.join(10)


def test_a_model_issued_agent_send_lands_durably_and_wakes_an_agents_sdk_turn(
    make_runtime: MakeRuntime, traces: Traces
) -> None:
    ids: dict[str, str] = {}
    seen_tools: list[list[str]] = []
    prompts: list[str] = []

    async def alice(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        seen_tools.append(sorted(tools))
        outputs = tool_outputs(items)
        if not outputs:
            return [call("agent_send", {"agent_id": ids["bob"], "message": "Please review PR 12"})]
        return [say(f"asked Bob ({outputs[0]['status']})")]

    async def bob(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        prompts.append(user_text(items))
        return [say("PR 12 looks good")]

    agents = {
        "alice": Agent(name="Alice", model=ScriptModel(alice)),
        "bob": Agent(name="Bob", model=ScriptModel(bob)),
    }

    def agent_for(turn: Turn) -> Agent[Any]:
        return agents["alice" if turn.session_id == ids["alice"] else "bob"]

    rt = make_runtime(brain=openai_agents_brain(agent_for))
    pr_review_family(rt, ids)
    ask_for_review(rt, ids)

    assert "agent_send" in seen_tools[0] and "schedule_wakeup" not in seen_tools[0]
    assert prompts == [f"agent_message from {ids['alice']}: Please review PR 12"]
    assert_reviewed(rt, ids, "asked Bob (pending)")
    # Three runs, one tool call: not one trace or span, and no export request.
    assert traces.recorder.seen == []
    assert traces.sent() == []


def test_tracing_is_on_only_when_the_caller_asks_for_it(
    make_runtime: MakeRuntime, traces: Traces
) -> None:
    """The checks above are no blind ones: with ``trace=True`` the same kind of turn reaches
    the SDK's trace processors, and its exporter posts the trace (to OpenAI's servers, by
    default)."""

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        return [say("hello")] if tool_outputs(items) else [call("task_list", {})]

    rt = make_runtime(
        brain=openai_agents_brain(Agent(name="A", model=ScriptModel(model)), trace=True)
    )
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "hi")
    rt.run_until_idle(timeout=30)
    assert rt.transcript(session)[-1].text == "hello"
    assert traces.recorder.seen[0] == "trace Agent workflow"
    assert {"span agent", "span function"} <= set(traces.recorder.seen)
    exported = [item for body in traces.sent() for item in json.loads(body)["data"]]
    assert {"trace", "trace.span"} <= {item["object"] for item in exported}


@pytest.mark.parametrize("arguments, expected", REFUSED_TOOL_CALLS)
def test_a_refused_tool_call_comes_back_to_the_model_as_a_readable_error(
    make_runtime: MakeRuntime, arguments: dict[str, Any] | str, expected: Any
) -> None:
    errors: list[object] = []

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        outputs = tool_outputs(items)
        if not outputs:
            return [call("agent_read", arguments)]
        errors.append(outputs[0])
        return [say("could not read it")]

    rt = make_runtime(brain=openai_agents_brain(Agent(name="Me", model=ScriptModel(model))))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "read chat-nope")
    rt.run_until_idle(timeout=30)
    assert errors == [expected]
    assert rt.transcript(me)[-1].text == "could not read it"
    assert rt.inbox()[0]["status"] == "delivered"


def test_a_raising_model_is_a_failed_attempt_retried_after_its_backoff(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    calls: list[float] = []

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        calls.append(clock.now())
        if len(calls) == 1:
            raise ConnectionError("model unreachable")
        return [say("second time lucky")]

    rt = make_runtime(brain=openai_agents_brain(Agent(name="A", model=ScriptModel(model))))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "work")
    rt.run_until_idle()
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "ConnectionError: model unreachable" in row["last_error"]
    assert rt.transcript(session) == []
    clock.advance(2)
    rt.run_until_idle()
    assert rt.inbox()[0]["status"] == "delivered"
    assert [c - calls[0] for c in calls] == [0, 2]
    assert [e.text for e in rt.transcript(session)] == ["work", "second time lucky"]


@pytest.mark.timeout(60)
def test_agent_stop_cancels_the_running_model_call_at_once(make_runtime: MakeRuntime) -> None:
    """The stop reaches the SDK's run as a cancel of its model call, and the turn commits as
    stopped: without it the turn would wait for kinbox's ``stop_grace`` (here on a clock
    that never moves)."""
    started = threading.Event()
    cancelled = threading.Event()

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        started.set()
        try:
            await asyncio.Event().wait()  # a model that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [say("never")]

    rt = make_runtime(
        brain=openai_agents_brain(Agent(name="B", model=ScriptModel(model))), stop_grace=600.0
    )
    project = rt.create_project("team")
    a = rt.create_session(project.id, "A").id
    b = rt.create_session(project.id, "B").id
    mid = rt.post(b, "long job", sender=a).message_id
    assert started.wait(10)
    assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
    wait_for(lambda: rt.inbox()[0]["status"] == "delivered", what="the stopped turn's commit")
    assert cancelled.is_set()
    assert rt.inbox()[0]["attempts"] == 0
    assert [e.text for e in rt.transcript(b)] == ["long job"]
    assert rt.marker_counts() == {mid: 1}


@pytest.mark.timeout(60)
def test_tool_calls_of_one_response_commit_in_the_order_the_model_gave(
    make_runtime: MakeRuntime,
) -> None:
    """The SDK runs the function calls of one model response at once, and kinbox's ran on
    as many blocking workers: twelve ``agent_send`` calls "step 0" to "step 11" reached
    Bob's inbox shuffled. kinbox's tools run one at a time, in the model's order, as on
    autogen."""
    ids: dict[str, str] = {}
    steps = [f"step {i}" for i in range(12)]

    async def alice_model(
        items: list[TResponseInputItem], tools: list[str]
    ) -> list[TResponseOutputItem]:
        if tool_outputs(items):
            return [say("sent them all")]
        return [
            call("agent_send", {"agent_id": ids["bob"], "message": step}, f"call-{i}")
            for i, step in enumerate(steps)
        ]

    async def brain(turn: Turn) -> None:
        if turn.session_id == ids["alice"]:
            await alice(turn)

    alice = openai_agents_brain(Agent(name="Alice", model=ScriptModel(alice_model)))
    rt = make_runtime(brain=brain)
    pr_review_family(rt, ids)
    rt.post(ids["alice"], "send Bob the steps")
    rt.run_until_idle(timeout=30)
    assert rt.transcript(ids["alice"])[-1].text == "sent them all"
    assert [r["content"] for r in rt.inbox(target=ids["bob"])] == steps
    assert [e.text for e in rt.transcript(ids["bob"])] == steps


@pytest.mark.timeout(60)
def test_a_call_of_a_tool_the_agent_lacks_comes_back_to_the_model(
    make_runtime: MakeRuntime,
) -> None:
    """A model calling a tool its agent does not have (a Focal-only ``schedule_wakeup`` on
    a plain session, a name it made up) raised the SDK's ``ModelBehaviorError``: the
    attempt failed, and every retry the same, where pydantic-ai and autogen hand the model
    an error it can act on. The SDK's runs answer it to the model now."""
    read_back: list[str] = []

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        outputs = [
            str(i["output"])
            for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        if not outputs:
            return [call("schedule_wakeup", {"kind": "reminder", "at": 0})]
        read_back.extend(outputs)
        return [say("no wake-ups for me, then")]

    rt = make_runtime(brain=openai_agents_brain(Agent(name="Me", model=ScriptModel(model))))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "remind me tomorrow")
    rt.run_until_idle(timeout=30)
    assert len(read_back) == 1 and "schedule_wakeup" in read_back[0]
    assert (rt.inbox()[0]["status"], rt.inbox()[0]["attempts"]) == ("delivered", 0)
    assert rt.transcript(me)[-1].text == "no wake-ups for me, then"


def own_handoff(agent: Agent[Any]) -> Handoff[Any, Any]:
    """A ``Handoff`` of one's own, no ``handoff()``: the SDK knows its agent only once its
    ``on_invoke_handoff`` returns it."""

    async def invoke(context: Any, arguments: str) -> Agent[Any]:
        return agent

    return Handoff(
        tool_name=Handoff.default_tool_name(agent),
        tool_description=f"Hand off to {agent.name}",
        input_json_schema={},
        on_invoke_handoff=invoke,
        agent_name=agent.name,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "as_handoff", [lambda a: a, handoff, own_handoff], ids=["agent", "handoff()", "Handoff"]
)
def test_an_agent_handed_off_to_has_kinbox_tools_too(
    make_runtime: MakeRuntime, as_handoff: Callable[[Agent[Any]], Any]
) -> None:
    """Only the top agent was given kinbox's tools: the agent Alice's model handed off to
    (``handoffs=[desk]``, ``handoff(desk)``, a ``Handoff`` of one's own) had no
    ``agent_send``, so its call came back as a tool not found and nothing reached Bob.
    Every agent reachable by handoff has them now, each cloned once (the desk hands back
    to Alice: a cycle), the user's agents unchanged."""
    ids: dict[str, str] = {}
    desk_tools: list[list[str]] = []

    async def alice_model(
        items: list[TResponseInputItem], tools: list[str]
    ) -> list[TResponseOutputItem]:
        return [call("transfer_to_review_desk", {}, "handoff-1")]

    async def desk_model(
        items: list[TResponseInputItem], tools: list[str]
    ) -> list[TResponseOutputItem]:
        desk_tools.append(sorted(tools))
        sent = [i for i in items if isinstance(i, dict) and i.get("call_id") == "send-1"]
        if len(sent) < 2:  # the call alone, no output of it yet
            send = {"agent_id": ids["bob"], "message": "Please review PR 12"}
            return [call("agent_send", send, "send-1")]
        return [say("asked Bob")]

    async def bob_model(
        items: list[TResponseInputItem], tools: list[str]
    ) -> list[TResponseOutputItem]:
        return [say("PR 12 looks good")]

    desk = Agent(name="Review desk", model=ScriptModel(desk_model))
    alice = Agent(name="Alice", model=ScriptModel(alice_model), handoffs=[as_handoff(desk)])
    desk.handoffs = [as_handoff(alice)]
    given = (alice.handoffs[0], desk.handoffs[0])
    bob = Agent(name="Bob", model=ScriptModel(bob_model))

    def agent_for(turn: Turn) -> Agent[Any]:
        return alice if turn.session_id == ids["alice"] else bob

    rt = make_runtime(brain=openai_agents_brain(agent_for))
    pr_review_family(rt, ids)
    ask_for_review(rt, ids)

    assert "agent_send" in desk_tools[0]
    assert_reviewed(rt, ids, "asked Bob")
    assert (alice.tools, desk.tools) == ([], [])
    assert alice.handoffs[0] is given[0] and desk.handoffs[0] is given[1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["top", "handed off to"])
def test_an_agents_own_tool_named_as_a_kinbox_tool_fails_the_row_for_good(
    make_runtime: MakeRuntime, where: str
) -> None:
    """An agent whose own tool bears a kinbox tool's name (``agent_send``) ran with both:
    the SDK only logs the collision and routes the model's call to one of them, so a
    model's ``agent_send`` could run the user's function and nothing was journaled. The
    clash is refused before the run, the row failed after one attempt (every retry would
    be the same), the reason naming the agent and the tool."""
    calls: list[str] = []

    @function_tool(name_override="agent_send")
    def own_send(agent_id: str, message: str) -> str:
        calls.append(message)
        return "sent my way"

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        return [say("done")]

    clashing = Agent(name="Desk", model=ScriptModel(model), tools=[own_send])
    agent = clashing
    if where == "handed off to":

        async def top_model(
            items: list[TResponseInputItem], tools: list[str]
        ) -> list[TResponseOutputItem]:
            return [call("transfer_to_desk", {}, "handoff-1")]

        agent = Agent(name="Top", model=ScriptModel(top_model), handoffs=[clashing])
    rt = make_runtime(brain=openai_agents_brain(agent))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "hello")
    rt.run_until_idle(timeout=30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "PermanentFailure: " in row["last_error"]
    assert "'Desk'" in row["last_error"] and "'agent_send'" in row["last_error"]
    assert clashing.tools == [own_send]  # the user's agent unchanged


def test_the_sdks_own_user_error_is_an_ordinary_failed_attempt(make_runtime: MakeRuntime) -> None:
    """The Agents SDK raises ``UserError`` for set-up mistakes and also for states that
    pass (an MCP server not connected yet): the attempt fails and is retried after its
    backoff, not failed for good as a kinbox tool-name clash is."""
    from agents.exceptions import UserError

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        raise UserError("Server not initialized. Make sure you call `connect()` first.")

    rt = make_runtime(brain=openai_agents_brain(Agent(name="Me", model=ScriptModel(model))))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "hello")
    rt.run_until_idle(timeout=30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "UserError" in row["last_error"] and "PermanentFailure" not in row["last_error"]


def test_an_input_guardrails_tripwire_fails_the_row_for_good(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    """An input guardrail that trips refuses the turn's input, and every attempt gives its
    guardrail the same input: the row was retried four times after its backoffs, each
    running the guardrail (and, run in parallel with it, the agent) again, and holding
    the session's next messages behind it, before it failed. It fails after one attempt,
    the guardrail named."""
    from agents import GuardrailFunctionOutput, input_guardrail

    checked: list[str] = []

    @input_guardrail(name="no_spam")
    async def no_spam(ctx: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
        checked.append("spam")
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered="spam" in str(given))

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        return [say("ok")]

    agent = Agent(name="Me", model=ScriptModel(model), input_guardrails=[no_spam])
    rt = make_runtime(brain=openai_agents_brain(agent))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "buy spam now")
    rt.post(me, "what is on today?")
    for _ in range(5):  # through every backoff a retried row would wait
        rt.run_until_idle(timeout=30)
        clock.advance(30)
    first, second = rt.inbox(target=me)
    assert (first["status"], first["attempts"]) == ("failed", 1)
    assert "PermanentFailure: " in first["last_error"] and "'no_spam'" in first["last_error"]
    assert "InputGuardrailTripwireTriggered" in first["last_error"]  # the cause, kept
    assert checked == ["spam", "spam"]  # once per message
    assert second["status"] == "delivered"


def test_a_run_paused_for_a_tools_approval_fails_the_row_for_good(
    make_runtime: MakeRuntime,
) -> None:
    """A tool of the agent's with ``needs_approval`` pauses the SDK's run: it returns with
    the call among its ``interruptions`` and no output, to be resumed once approved. The
    turn committed that as an answer of nothing: the message acknowledged unanswered, the
    approval asked of nobody, and the run's kinbox writes (a send before the pause)
    committed though the run never ended. kinbox cannot resume such a run (as with
    pydantic-ai, whose run refuses a deferred call it cannot hand back: a ``UserError``):
    the row fails for good after one attempt, naming the tool, and nothing of it commits."""
    ran: list[str] = []

    @function_tool(needs_approval=True)
    def delete_repo(name: str) -> str:
        ran.append(name)
        return "deleted"

    ids: dict[str, str] = {}

    async def model(items: list[TResponseInputItem], tools: list[str]) -> list[TResponseOutputItem]:
        if not tool_outputs(items):
            return [call("agent_send", {"agent_id": ids["bob"], "message": "deleting"}, "c1")]
        return [call("delete_repo", {"name": "kinbox"}, "c2")]

    agent = Agent(name="Ops", model=ScriptModel(model), tools=[delete_repo])
    rt = make_runtime(brain=openai_agents_brain(agent))
    project = rt.create_project("solo")
    me = rt.create_session(project.id, "Me").id
    ids["bob"] = rt.create_session(project.id, "Bob").id
    rt.post(me, "clean up")
    rt.run_until_idle(timeout=30)
    row = rt.inbox(target=me)[0]
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "PermanentFailure: " in row["last_error"] and "'delete_repo'" in row["last_error"]
    assert ran == []
    assert rt.inbox(target=ids["bob"]) == []  # the send went with the failed attempt
    assert rt.transcript(me) == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("max_turns", ["3", 0, -1, 2.5, True])
def test_a_bad_max_turns_is_refused_where_the_brain_is_built(max_turns: object) -> None:
    """``max_turns=0`` (or "3") was taken, and every turn then failed its attempt (the SDK's
    ``MaxTurnsExceeded`` before any model call, or a ``TypeError``) until its row failed for
    good."""
    with pytest.raises(ConfigError) as err:
        openai_agents_brain(Agent(name="A"), max_turns=max_turns)  # type: ignore[arg-type]
    assert err.value.field == "max_turns"
