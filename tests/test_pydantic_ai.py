"""A real agent framework as the brain: pydantic-ai ``Agent``s with pydantic-ai's own
``FunctionModel`` (no network). Alice's model calls kinbox's ``agent_send``; the message is
committed to the journal and Bob runs his own pydantic-ai turn on it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kinbox.actors import Runtime, Turn
from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

from .framework_family import ask_for_review, assert_reviewed, pr_review_family

MakeRuntime = Callable[..., Runtime]


def tool_returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def test_a_model_issued_agent_send_lands_durably_and_wakes_a_pydantic_ai_turn(
    make_runtime: MakeRuntime,
) -> None:
    ids: dict[str, str] = {}
    seen_tools: list[list[str]] = []
    prompts: list[str] = []

    def alice_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen_tools.append(sorted(t.name for t in info.function_tools))
        returns = tool_returns(messages)
        if not returns:
            return ModelResponse(
                parts=[
                    ToolCallPart(
                        "agent_send", {"agent_id": ids["bob"], "message": "Please review PR 12"}
                    )
                ]
            )
        return ModelResponse(parts=[TextPart(f"asked Bob ({returns[0].content['status']})")])

    def bob_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts.append(str(messages[0].parts[-1].content))  # type: ignore[union-attr]
        return ModelResponse(parts=[TextPart("PR 12 looks good")])

    agents = {"alice": Agent(FunctionModel(alice_model)), "bob": Agent(FunctionModel(bob_model))}

    def agent_for(turn: Turn) -> Agent[None, str]:
        return agents["alice" if turn.session_id == ids["alice"] else "bob"]

    rt = make_runtime(brain=pydantic_ai_brain(agent_for))
    pr_review_family(rt, ids)
    ask_for_review(rt, ids)

    assert "agent_send" in seen_tools[0] and "schedule_wakeup" not in seen_tools[0]
    assert prompts == [f"agent_message from {ids['alice']}: Please review PR 12"]
    assert_reviewed(rt, ids, "asked Bob (pending)")


def test_a_refused_tool_call_comes_back_to_the_model_as_a_readable_error(
    make_runtime: MakeRuntime,
) -> None:
    errors: list[object] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = tool_returns(messages)
        if not returns:
            return ModelResponse(parts=[ToolCallPart("agent_read", {"agent_id": "chat-nope"})])
        errors.append(returns[0].content)
        return ModelResponse(parts=[TextPart("could not read it")])

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))))
    project = rt.create_project("solo")
    me = rt.create_session(project.id, "Me").id
    rt.post(me, "read chat-nope")
    rt.run_until_idle(timeout=30)
    assert errors == [
        {
            "error": "not_found",
            "message": "Agent 'chat-nope' is not available in the current project.",
        }
    ]
    assert rt.transcript(me)[-1].text == "could not read it"


@pytest.mark.timeout(60)
def test_an_answer_of_zero_is_the_reply(make_runtime: Callable[..., Runtime]) -> None:
    """``if output:`` dropped a falsy answer: an int output of 0 left no reply at all."""
    from pydantic_ai.models.test import TestModel

    agent = Agent(TestModel(call_tools=[], custom_output_args=0), output_type=int)
    rt = make_runtime(brain=pydantic_ai_brain(agent))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "how many PRs are open?")
    rt.run_until_idle()
    assert [(e.role, e.text) for e in rt.transcript(session)] == [
        ("user", "how many PRs are open?"),
        ("assistant", "0"),
    ]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "answer, replied",
    [
        ("col1\x00col2", "col1\\x00col2"),
        ("cut short \ud83d", "cut short \\ud83d"),
    ],
    ids=["nul", "lone_surrogate"],
)
def test_an_answer_no_database_holds_is_replied_escaped(
    make_runtime: Callable[..., Runtime], answer: str, replied: str
) -> None:
    """A model's answer with a NUL or a lone surrogate (an emoji cut in half) was handed to
    ``turn.reply``, which refuses such text: the attempt failed, the agent's whole run
    (its model calls, its tool calls) was thrown away and run again, and an answer that
    came back the same failed the message for good. The answer is the model's, not the
    application's: it is replied with those characters escaped, as kinbox records other
    text it did not choose."""
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(answer)])

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "export the table")
    rt.run_until_idle(timeout=30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("delivered", 0)
    assert [(e.role, e.text) for e in rt.transcript(session)] == [
        ("user", "export the table"),
        ("assistant", replied),
    ]


@pytest.mark.timeout(60)
def test_a_run_ending_in_deferred_tool_calls_fails_the_row_for_good(
    make_runtime: Callable[..., Runtime],
) -> None:
    """An agent with ``DeferredToolRequests`` among its output types ends its run with the
    calls that wait for approval (``requires_approval``) or an outside result, to be
    resumed once they have one. kinbox replied that object as JSON, the approval request
    for the user's answer, and acknowledged the message: nobody resumes the run. As
    without that output type (pydantic-ai's ``UserError``) and as the OpenAI Agents SDK's
    run paused for approval, the row fails for good, naming the tool, nothing committed."""
    from pydantic_ai import DeferredToolRequests

    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("delete_repo", {"name": "kinbox"})])

    agent = Agent(FunctionModel(model), output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    def delete_repo(name: str) -> str:
        ran.append(name)
        return "deleted"

    rt = make_runtime(brain=pydantic_ai_brain(agent))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "clean up")
    rt.run_until_idle(timeout=30)
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "PermanentFailure: " in row["last_error"] and "'delete_repo'" in row["last_error"]
    assert ran == [] and rt.transcript(session) == []


@pytest.mark.timeout(60)
def test_a_structured_output_is_replied_as_json(make_runtime: Callable[..., Runtime]) -> None:
    """An agent whose ``output_type`` is a model replied its ``str()``: ``title='PR 7'
    approved=True``, which nothing (a parent agent, a product's UI) could parse back."""
    import json

    from pydantic import BaseModel
    from pydantic_ai.models.test import TestModel

    class Review(BaseModel):
        title: str
        approved: bool

    agent = Agent(TestModel(call_tools=[], custom_output_args={"title": "PR 7",
                                                               "approved": True}),
                  output_type=Review)
    rt = make_runtime(brain=pydantic_ai_brain(agent))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "review PR 7")
    rt.run_until_idle()
    reply = rt.transcript(session)[-1]
    assert reply.role == "assistant"
    assert json.loads(reply.text) == {"title": "PR 7", "approved": True}


@pytest.mark.timeout(60)
def test_a_wrapped_agent_is_run_as_the_agent_not_called_as_a_factory(
    make_runtime: MakeRuntime,
) -> None:
    """A ``WrapperAgent`` (the base of pydantic-ai's durable-execution agents) is no
    ``Agent`` subclass: it was taken for a function of the turn and called, and every
    turn failed with 'object is not callable'."""
    from pydantic_ai.agent import WrapperAgent

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("wrapped and answering")])

    rt = make_runtime(brain=pydantic_ai_brain(WrapperAgent(Agent(FunctionModel(model)))))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "hello")
    rt.run_until_idle()
    assert rt.inbox()[0]["status"] == "delivered"
    assert rt.transcript(session)[-1].text == "wrapped and answering"


@pytest.mark.timeout(60)
def test_a_focal_turn_s_model_reads_the_global_context_and_no_other_turn_s_does(
    make_runtime: MakeRuntime,
) -> None:
    """FO3: every Focal turn carries the global context (projects, their sessions and tasks).
    The adapter built its prompt from the turn's messages alone, so a Focal agent run by
    pydantic-ai saw none of it."""
    prompts: dict[str, str] = {}

    def model_for(session_id: str) -> FunctionModel:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            prompts[session_id] = str(messages[0].parts[-1].content)  # type: ignore[union-attr]
            return ModelResponse(parts=[TextPart("noted")])

        return FunctionModel(model)

    rt = make_runtime(brain=pydantic_ai_brain(lambda turn: Agent(model_for(turn.session_id))))
    project = rt.create_project("website")
    worker = rt.create_session(project.id, "Build the landing page").id
    rt.tools_for(worker).task_create("landing page")
    focal = rt.get_or_create_focal_chat().id
    rt.post(focal, "what is going on?")
    rt.post(worker, "start")
    rt.run_until_idle()
    assert "Build the landing page" in prompts[focal] and "landing page" in prompts[focal]
    assert prompts[focal].endswith("user: what is going on?")
    assert prompts[worker] == "user: start"  # no context: the messages alone


@pytest.mark.timeout(60)
def test_agent_stop_cancels_the_running_model_call_at_once(make_runtime: MakeRuntime) -> None:
    """The stop reached the agent's run only as kinbox's cancel ``stop_grace`` seconds later
    (here on a clock that never moves): the model call ran on that long for nobody."""
    import asyncio
    import threading

    from .helpers import wait_for

    started = threading.Event()
    cancelled = threading.Event()

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        try:
            await asyncio.Event().wait()  # a model that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ModelResponse(parts=[TextPart("never")])

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))), stop_grace=600.0)
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
@pytest.mark.parametrize(
    "arguments, read_back",
    [
        ("[1, 2]", "agent_read takes its arguments as a JSON object, not list."),
        ('"chat-nope"', "agent_read takes its arguments as a JSON object, not str."),
        ("null", {"error": "invalid_argument", "message": "agent_read needs agent_id."}),
    ],
    ids=["list", "string", "null"],
)
def test_tool_arguments_that_are_no_json_object_come_back_to_the_model(
    make_runtime: MakeRuntime, arguments: str, read_back: object
) -> None:
    """pydantic-ai checked a call's arguments against nothing and unpacked them as keywords:
    a list or a string crashed the run (``argument after ** must be a mapping``) and
    ``null`` tripped an assertion, so the attempt failed and the model never learnt why.
    It reads the refusal, as for any argument kinbox refuses, and answers."""
    from pydantic_ai.messages import RetryPromptPart

    seen: list[object] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answers = [
            p
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart | RetryPromptPart)
        ]
        if not answers:
            return ModelResponse(parts=[ToolCallPart("agent_read", arguments)])
        content = answers[0].content
        seen.append(content[0]["msg"] if isinstance(content, list) else content)
        return ModelResponse(parts=[TextPart("fixed my call")])

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "read something")
    rt.run_until_idle(timeout=30)
    assert seen == [read_back]
    assert (rt.inbox()[0]["status"], rt.inbox()[0]["attempts"]) == ("delivered", 0)
    assert rt.transcript(me)[-1].text == "fixed my call"


@pytest.mark.timeout(60)
def test_tool_calls_of_one_response_commit_in_the_order_the_model_gave(
    make_runtime: MakeRuntime,
) -> None:
    """pydantic-ai runs the tool calls of one model response at once, and kinbox's ran on
    as many blocking workers: twelve ``agent_send`` calls "step 0" to "step 11" reached
    Bob's inbox shuffled ("step 10" before "step 8"). kinbox's tools run one at a time,
    in the model's order, as on autogen."""
    ids: dict[str, str] = {}
    steps = [f"step {i}" for i in range(12)]

    def alice_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if tool_returns(messages):
            return ModelResponse(parts=[TextPart("sent them all")])
        return ModelResponse(
            parts=[
                ToolCallPart("agent_send", {"agent_id": ids["bob"], "message": step}, f"c{i}")
                for i, step in enumerate(steps)
            ]
        )

    async def brain(turn: Turn) -> None:
        if turn.session_id == ids["alice"]:
            await alice(turn)

    alice = pydantic_ai_brain(Agent(FunctionModel(alice_model)))
    rt = make_runtime(brain=brain)
    pr_review_family(rt, ids)
    rt.post(ids["alice"], "send Bob the steps")
    rt.run_until_idle(timeout=30)
    assert rt.transcript(ids["alice"])[-1].text == "sent them all"
    assert [r["content"] for r in rt.inbox(target=ids["bob"])] == steps
    assert [e.text for e in rt.transcript(ids["bob"])] == steps


@pytest.mark.timeout(60)
def test_a_model_call_that_never_awaits_is_reported_naming_its_session(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """A model (a client's blocking call inside ``async def``) that holds the event loop is
    run in a task of the adapter's (its agent run, apart from the brain's task): the stall
    was logged as "a task on it never awaits", naming no session, though it is that
    session's brain that holds every async turn. It is named as a brain's own stall is."""
    import threading

    from .helpers import wait_for

    started, release = threading.Event(), threading.Event()

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        started.set()
        release.wait(30)  # never awaits: the loop is held until the test lets go
        return ModelResponse(parts=[TextPart("done")])

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))), stop_grace=0.5)
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    try:
        with caplog.at_level("WARNING", logger="kinbox.async"):
            rt.post(me, "hello")
            assert started.wait(20)
            wait_for(
                lambda: any("has not run for" in r.getMessage() for r in caplog.records),
                timeout=20,
                what="the stall's warning",
            )
        [stall] = [r.getMessage() for r in caplog.records if "has not run for" in r.getMessage()]
        assert f"the async brain of {me} never awaits" in stall
    finally:
        release.set()
    rt.run_until_idle(timeout=30)
    assert rt.transcript(me)[-1].text == "done"
