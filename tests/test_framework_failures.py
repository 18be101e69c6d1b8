"""The framework brains map their model clients' error answers onto kinbox's brain
failures (:mod:`kinbox.actors.http_failure`): a refused key or request fails the row for
good after one attempt, a rate limit's ``Retry-After`` delays its retry, any other error is
an ordinary failed attempt. Each framework raises its own real exception: pydantic-ai's
``ModelHTTPError`` from its ``FunctionModel``; the openai client's, raised by the client
itself from a real HTTP answer of a server on 127.0.0.1, under the OpenAI Agents SDK's
chat-completions model and autogen-ext's OpenAI client."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kinbox.actors import ManualClock, Runtime, Turn

pytestmark = pytest.mark.timeout(120)

MakeRuntime = Callable[..., Runtime]
START = 1_700_000_000.0

# (id, status, headers, row status, attempts, seconds until the retry or None)
CASES: list[tuple[str, int, dict[str, str], str, int, float | None]] = [
    ("401 bad key", 401, {}, "failed", 1, None),
    ("403 forbidden", 403, {}, "failed", 1, None),
    ("400 refused", 400, {}, "failed", 1, None),
    ("404 unknown model", 404, {}, "failed", 1, None),
    ("422 unprocessable", 422, {}, "failed", 1, None),
    ("429 retry-after 120", 429, {"retry-after": "120"}, "pending", 1, 120.0),
    ("503 retry-after 30", 503, {"Retry-After": "30"}, "pending", 1, 30.0),
    ("429 without a wait: the backoff", 429, {}, "pending", 1, 2.0),
    ("500 without a wait: the backoff", 500, {}, "pending", 1, 2.0),
]
IDS = [case[0] for case in CASES]
PARAMS = [case[1:] for case in CASES]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


def one_turn(rt: Runtime) -> dict[str, Any]:
    """Post one message, run it, and return its row."""
    project = rt.create_project("p")
    session_id = rt.create_session(project.id, "A").id
    rt.post(session_id, "hello")
    rt.run_until_idle(timeout=60)
    return rt.inbox(target=session_id)[0]


def assert_row(
    row: dict[str, Any], status: str, attempts: int, wait: float | None, kind: str
) -> None:
    assert (row["status"], row["attempts"]) == (status, attempts)
    if wait is not None:
        assert row["available_at"] == START + wait
    assert kind in row["last_error"]


def kind_of(status: str, wait: float | None) -> str:
    """The exception the row's error ends with."""
    if status == "failed":
        return "PermanentFailure: "
    return "RetryLater: " if wait not in (None, 2.0) else "Error"


class ErrorServer(BaseHTTPRequestHandler):
    """Answers every POST with the server's ``answer``: (status, headers), an OpenAI-style
    error body."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.before_answer()  # type: ignore[attr-defined]
        status, headers = self.server.answer  # type: ignore[attr-defined]
        body = json.dumps({"error": {"message": "no", "type": "test", "code": None}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def error_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ErrorServer)
    server.answer = (500, {})  # type: ignore[attr-defined]
    server.before_answer = lambda: None  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def base_url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


@pytest.mark.parametrize("status, headers, row_status, attempts, wait", PARAMS, ids=IDS)
def test_pydantic_ai_model_http_errors(
    make_runtime: MakeRuntime,
    status: int,
    headers: dict[str, str],
    row_status: str,
    attempts: int,
    wait: float | None,
) -> None:
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # As pydantic-ai's OpenAI model raises it from the client's APIStatusError.
        raise ModelHTTPError(status, "test-model", {"error": "no"}, headers=headers)

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))))
    row = one_turn(rt)
    assert_row(row, row_status, attempts, wait, kind_of(row_status, wait))
    assert "ModelHTTPError: status_code: " in row["last_error"]  # the cause, kept


@pytest.mark.parametrize("category", [
    "ModelRequestRejectedError", "ModelAuthenticationError", "ModelContextWindowExceededError",
])
def test_pydantic_ai_request_rejected_without_a_status_fails_for_good(
    make_runtime: MakeRuntime, category: str
) -> None:
    """pydantic-ai raises a rejected request's category with no HTTP status where no answer
    came: before the request is sent (``OpenAIChatModel`` on a model that refuses tools
    while it reasons, which every kinbox turn sends), or as an error event in a stream. It
    is the same refusal a 400 or 401 is, which fails the row at once, but it was an
    ordinary failed attempt: the row waited through every backoff, failing the same way."""
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent
    from pydantic_ai import exceptions as pai_errors
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

    rejected = getattr(pai_errors, category, None)
    if rejected is None:
        pytest.skip(f"this pydantic-ai has no {category}")

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise rejected("test-model", "the provider will not take this request")

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))))
    row = one_turn(rt)
    assert_row(row, "failed", 1, None, "PermanentFailure: ")
    assert f"{category}: " in row["last_error"]  # the cause, kept


def test_pydantic_ai_request_rejected_with_a_status_outside_the_rule_fails_for_good(
    make_runtime: MakeRuntime,
) -> None:
    """pydantic-ai reads a 413 (the request too large: the same request is again) as a
    rejected request, as its models raise it (``ModelHTTPError.for_category``); kinbox's
    status rule alone has no word for 413, and the row was retried through every backoff.
    pydantic-ai's reading of the answer decides where the status does not."""
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent
    from pydantic_ai import exceptions as pai_errors
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

    rejected = getattr(pai_errors, "ModelRequestRejectedError", None)
    if rejected is None or not hasattr(ModelHTTPError, "for_category"):
        pytest.skip("this pydantic-ai has no error categories")

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelHTTPError.for_category(rejected, status_code=413, model_name="test-model")

    rt = make_runtime(brain=pydantic_ai_brain(Agent(FunctionModel(model))))
    row = one_turn(rt)
    assert_row(row, "failed", 1, None, "PermanentFailure: ")


@pytest.mark.parametrize(("answers", "row_status", "wait"), [
    ([(401, {}), (403, {})], "failed", None),
    ([(401, {}), (429, {"retry-after": "120"})], "pending", 120.0),
    ([(429, {"retry-after": "30"}), (503, {"retry-after": "90"})], "pending", 30.0),
    ([(401, {}), (500, {})], "pending", 2.0),
], ids=["every model refused", "one asked to wait", "the shortest wait", "one plain error"])
def test_pydantic_ai_fallback_model_errors(
    make_runtime: MakeRuntime,
    answers: list[tuple[int, dict[str, str]]],
    row_status: str,
    wait: float | None,
) -> None:
    """A ``FallbackModel`` whose every model failed raises a group of their
    ``ModelHTTPError``s, which the mapping of one error let through as an ordinary failure.
    The group is for good only when every model's answer is (a fallback model is there to
    get past one that refused), else it waits for the first model that asked to wait."""
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models.fallback import FallbackModel
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

    def failing(status: int, headers: dict[str, str]) -> FunctionModel:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            raise ModelHTTPError(status, f"model-{status}", {"error": "no"}, headers=headers)
        return FunctionModel(model)

    fallback = FallbackModel(*(failing(status, headers) for status, headers in answers))
    rt = make_runtime(brain=pydantic_ai_brain(Agent(fallback)))
    row = one_turn(rt)
    assert_row(row, row_status, 1, wait, kind_of(row_status, wait))


def openai_agents_on(server: ThreadingHTTPServer) -> Callable[[Turn], Any]:
    """An OpenAI Agents SDK brain whose chat-completions model asks ``server``."""
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from agents import Agent, OpenAIChatCompletionsModel
    from openai import AsyncOpenAI

    from kinbox.actors.openai_agents_brain import openai_agents_brain

    def agent_for(turn: Turn) -> Agent[Any]:
        client = AsyncOpenAI(api_key="sk-test", base_url=base_url(server), max_retries=0)
        return Agent(name="a", model=OpenAIChatCompletionsModel("gpt-test", client))

    return openai_agents_brain(agent_for)


def autogen_on(server: ThreadingHTTPServer) -> Callable[[Turn], Any]:
    """An autogen brain on autogen-core's client interface over the openai client asking
    ``server``, as autogen-ext's ``OpenAIChatCompletionClient`` is (that one needs
    tiktoken, no test extra): its ``create`` passes on what ``chat.completions.create``
    raises."""
    pytest.importorskip("autogen_ext.models.replay", reason="the autogen extra is not installed")
    from autogen_core.models import CreateResult
    from autogen_ext.models.replay import ReplayChatCompletionClient
    from openai import AsyncOpenAI

    from kinbox.actors.autogen_brain import autogen_brain

    class OpenAIClient(ReplayChatCompletionClient):
        def __init__(self) -> None:
            super().__init__([])
            self.openai = AsyncOpenAI(
                api_key="sk-test", base_url=base_url(server), max_retries=0
            )

        async def create(self, messages: Any, **kwargs: Any) -> CreateResult:
            await self.openai.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "hello"}]
            )
            raise AssertionError("the server answers every request with an error")

    return autogen_brain(OpenAIClient())


@pytest.mark.parametrize("brain_on", [openai_agents_on, autogen_on],
                         ids=["openai-agents", "autogen"])
@pytest.mark.parametrize("status, headers, row_status, attempts, wait", PARAMS, ids=IDS)
def test_openai_client_errors_under_the_agents_sdk_and_autogen(
    make_runtime: MakeRuntime,
    error_server: ThreadingHTTPServer,
    brain_on: Callable[[ThreadingHTTPServer], Callable[[Turn], Any]],
    status: int,
    headers: dict[str, str],
    row_status: str,
    attempts: int,
    wait: float | None,
) -> None:
    error_server.answer = (status, headers)  # type: ignore[attr-defined]
    rt = make_runtime(brain=brain_on(error_server))
    row = one_turn(rt)
    assert_row(row, row_status, attempts, wait, kind_of(row_status, wait))
    assert "openai." in row["last_error"]  # the client's own error, kept as the cause


@pytest.mark.parametrize("brain_on", [openai_agents_on, autogen_on],
                         ids=["openai-agents", "autogen"])
def test_an_http_date_to_retry_at_is_kept_however_long_the_model_took(
    make_runtime: MakeRuntime,
    error_server: ThreadingHTTPServer,
    clock: ManualClock,
    brain_on: Callable[[ThreadingHTTPServer], Callable[[Turn], Any]],
) -> None:
    """A ``Retry-After`` date was measured from the turn's start, not from the answer:
    a turn that waited 15 s on the model before a 429 saying "at START + 20 s" was retried
    at START + 35 s, 15 s past the time the API named."""
    error_server.before_answer = lambda: clock.advance(15.0)  # type: ignore[attr-defined]
    error_server.answer = (  # type: ignore[attr-defined]
        429, {"retry-after": "Tue, 14 Nov 2023 22:13:40 GMT"})  # START + 20 s
    rt = make_runtime(brain=brain_on(error_server))
    row = one_turn(rt)
    assert_row(row, "pending", 1, 20.0, "RetryLater: ")


# -- the pure rule they share ------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers, wait",
    [
        ({}, None),
        (None, None),
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": "Tue, 14 Nov 2023 22:13:40 GMT"}, 20.0),  # START + 20 s
        ({"retry-after": "whenever"}, None),
    ],
)
def test_the_wait_a_response_asks(headers: dict[str, str] | None, wait: float | None) -> None:
    from kinbox.actors.http_failure import headers_retry_after

    assert headers_retry_after(headers, START) == wait


@pytest.mark.parametrize(
    "status, retry_after, expected",
    [
        (400, None, "PermanentFailure"),
        (401, 60.0, "PermanentFailure"),
        (403, None, "PermanentFailure"),
        (404, None, "PermanentFailure"),
        (422, None, "PermanentFailure"),
        (408, 5.0, "RetryLater"),
        (429, 5.0, "RetryLater"),
        (502, 5.0, "RetryLater"),
        (429, None, None),
        (503, None, None),
        (409, 5.0, None),
    ],
)
def test_a_model_api_status_as_a_brain_failure(
    status: int, retry_after: float | None, expected: str | None
) -> None:
    from kinbox.actors.http_failure import model_http_failure

    failure = model_http_failure(status, retry_after, "the API")
    assert (type(failure).__name__ if failure is not None else None) == expected
    if expected == "RetryLater":
        assert failure.retry_after == retry_after  # type: ignore[union-attr]


def test_pydantic_ai_tool_name_clash_fails_for_good(make_runtime: MakeRuntime) -> None:
    """An agent with a tool of its own named as a kinbox tool fails every run the same way
    (pydantic-ai's ``UserError``, a mistake of the application's): retried, each attempt
    failed the same, and the row waited through five backoffs before it failed. A usage
    error of the framework is permanent: one attempt, the reason kept."""
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from kinbox.actors.pydantic_ai_brain import pydantic_ai_brain

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("hi")])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def agent_send(target: str, message: str) -> str:
        return "mine"

    rt = make_runtime(brain=pydantic_ai_brain(agent))
    row = one_turn(rt)
    assert_row(row, "failed", 1, None, "PermanentFailure: ")
    assert "UserError" in row["last_error"] and "agent_send" in row["last_error"]

