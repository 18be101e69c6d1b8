"""autogen-core as the brain: the tool-use loop on a ``ChatCompletionClient``, here
autogen-ext's ``ReplayChatCompletionClient`` (scripted completions, no network), which
also records what each ``create`` was given. Alice's model calls kinbox's ``agent_send``;
the message is committed to the journal and Bob runs his own autogen turn on it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("autogen_core", reason="the autogen extra is not installed")
pytest.importorskip("autogen_ext.models.replay", reason="the autogen extra is not installed")

from autogen_core import FunctionCall
from autogen_core.models import (
    CreateResult,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    RequestUsage,
)
from autogen_ext.models.replay import ReplayChatCompletionClient

from kinbox.actors import ConfigError, ManualClock, Runtime, Turn
from kinbox.actors.autogen_brain import autogen_brain

from .framework_family import (
    NESTED_TOO_DEEPLY,
    REFUSED_TOOL_CALLS,
    TOO_MANY_DIGITS,
    ask_for_review,
    assert_reviewed,
    pr_review_family,
)
from .helpers import wait_for

MakeRuntime = Callable[..., Runtime]


def calls(*made: tuple[str, dict[str, Any] | str]) -> CreateResult:
    """A completion calling tools: (name, arguments) each."""
    return CreateResult(
        finish_reason="function_calls",
        cached=False,
        usage=RequestUsage(0, 0),
        content=[
            FunctionCall(
                id=f"call-{i}", name=name, arguments=a if isinstance(a, str) else json.dumps(a)
            )
            for i, (name, a) in enumerate(made)
        ],
    )


def results(client: ReplayChatCompletionClient) -> list[FunctionExecutionResult]:
    """What the tools gave back, as the client's last ``create`` saw it."""
    messages: Sequence[LLMMessage] = client.create_calls[-1]["messages"]
    return [r for m in messages if isinstance(m, FunctionExecutionResultMessage) for r in m.content]


def test_a_model_issued_agent_send_lands_durably_and_wakes_an_autogen_turn(
    make_runtime: MakeRuntime,
) -> None:
    ids: dict[str, str] = {}
    script: dict[str, ReplayChatCompletionClient] = {}

    def client_for(turn: Turn) -> ReplayChatCompletionClient:
        return script["alice" if turn.session_id == ids["alice"] else "bob"]

    rt = make_runtime(brain=autogen_brain(client_for, system_message="You get PRs reviewed."))
    pr_review_family(rt, ids)
    script["alice"] = ReplayChatCompletionClient(
        [
            calls(("agent_send", {"agent_id": ids["bob"], "message": "Please review PR 12"})),
            "asked Bob",
        ]
    )
    script["bob"] = ReplayChatCompletionClient(["PR 12 looks good"])
    ask_for_review(rt, ids)

    alice, bob = script["alice"], script["bob"]
    tools = [t["name"] for t in alice.create_calls[0]["tools"]]
    assert "agent_send" in tools and "schedule_wakeup" not in tools
    [receipt] = results(alice)
    assert (receipt.name, receipt.is_error, json.loads(receipt.content)["status"]) == (
        "agent_send",
        False,
        "pending",
    )
    system, prompt = bob.create_calls[0]["messages"]
    assert system.content == "You get PRs reviewed."
    assert prompt.content == f"agent_message from {ids['alice']}: Please review PR 12"
    assert_reviewed(rt, ids, "asked Bob")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "arguments, expected", [*REFUSED_TOOL_CALLS, NESTED_TOO_DEEPLY, TOO_MANY_DIGITS]
)
def test_a_refused_tool_call_comes_back_to_the_model_as_a_readable_error(
    make_runtime: MakeRuntime, arguments: dict[str, Any] | str, expected: Any
) -> None:
    client = ReplayChatCompletionClient([calls(("agent_read", arguments)), "could not read it"])
    rt = make_runtime(brain=autogen_brain(client))
    me = rt.create_session(rt.create_project("solo").id, "Me").id
    rt.post(me, "read chat-nope")
    rt.run_until_idle(timeout=30)
    [result] = results(client)
    assert (result.is_error, json.loads(result.content)) == (True, expected)
    assert rt.transcript(me)[-1].text == "could not read it"
    assert rt.inbox()[0]["status"] == "delivered"


class Failing(ReplayChatCompletionClient):
    """A replayed client whose first ``create`` raises, as an unreachable model does."""

    def __init__(self, completions: list[str]) -> None:
        super().__init__(completions)
        self.tries = 0

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        self.tries += 1
        if self.tries == 1:
            raise ConnectionError("model unreachable")
        return await super().create(messages, **kwargs)


def test_a_raising_client_is_a_failed_attempt_retried_after_its_backoff(
    make_runtime: MakeRuntime, clock: ManualClock
) -> None:
    rt = make_runtime(brain=autogen_brain(Failing(["second time lucky"])))
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
    assert [e.text for e in rt.transcript(session)] == ["work", "second time lucky"]


def test_a_model_that_never_stops_calling_tools_fails_the_attempt_and_is_asked_last_without_tools(
    make_runtime: MakeRuntime,
) -> None:
    client = ReplayChatCompletionClient([calls(("task_list", {}))] * 3)
    rt = make_runtime(brain=autogen_brain(client, max_tool_rounds=2))
    session = rt.create_session(rt.create_project("p").id, "A").id
    rt.post(session, "loop")
    rt.run_until_idle()
    row = rt.inbox()[0]
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "ToolRoundsExceeded: the model still called tools after 2 rounds" in row["last_error"]
    assert [len(c["tools"]) > 0 for c in client.create_calls] == [True, True, False]
    assert rt.transcript(session) == []


class Silent(ReplayChatCompletionClient):
    """A client whose ``create`` never answers; it records the cancel it gets."""

    def __init__(self) -> None:
        super().__init__([])
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.token_cancelled = threading.Event()

    async def create(self, messages: Sequence[LLMMessage], **kwargs: Any) -> CreateResult:
        token = kwargs["cancellation_token"]
        token.add_callback(self.token_cancelled.set)
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("never answers")


@pytest.mark.timeout(60)
def test_agent_stop_cancels_the_running_model_call_at_once(make_runtime: MakeRuntime) -> None:
    """The stop reaches the loop as a cancel of its ``create`` (and of its
    ``CancellationToken``), and the turn commits as stopped: without it the turn would wait
    for kinbox's ``stop_grace`` (here on a clock that never moves)."""
    client = Silent()
    rt = make_runtime(brain=autogen_brain(client), stop_grace=600.0)
    project = rt.create_project("team")
    a = rt.create_session(project.id, "A").id
    b = rt.create_session(project.id, "B").id
    mid = rt.post(b, "long job", sender=a).message_id
    assert client.started.wait(10)
    assert rt.tools_for(a).agent_stop(b)["status"] == "stop_requested"
    wait_for(lambda: rt.inbox()[0]["status"] == "delivered", what="the stopped turn's commit")
    assert client.cancelled.is_set() and client.token_cancelled.is_set()
    assert rt.inbox()[0]["attempts"] == 0
    assert [e.text for e in rt.transcript(b)] == ["long job"]
    assert rt.marker_counts() == {mid: 1}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rounds", ["2", -1, 2.5, True, None])
def test_a_bad_max_tool_rounds_is_refused_where_the_brain_is_built(rounds: object) -> None:
    """``max_tool_rounds="2"`` was taken, and every turn then failed its attempt with a
    ``TypeError`` from ``range()`` until its row failed for good; -1 asked the model once,
    without tools, as if 0 had been given."""
    with pytest.raises(ConfigError) as err:
        autogen_brain(ReplayChatCompletionClient([]), max_tool_rounds=rounds)  # type: ignore[arg-type]
    assert err.value.field == "max_tool_rounds"
