"""``async def`` channel adapters (SO1): their sends run on one event loop for the runtime's
life, a send past its timeout is cancelled before its retry, a stop ends the loop.

README ("Replies"): ``send`` "may be a plain function or a coroutine function". An async
adapter keeps one client and its keep-alive connection to the platform (httpx's
``AsyncClient``, aiohttp's ``ClientSession``: the platforms' SDKs do). Here the platform
is a real HTTP/1.1 server on 127.0.0.1 and the client the smallest keep-alive one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kinbox.actors import ConfigError, RuntimeStateError
from kinbox.actors import social_rules as rules
from kinbox.actors.channel_loop import ChannelLoop

from .social_helpers import MakeRuntime, SocialBrain, event


class FakePlatform:
    """A chat platform's HTTP API: every ``POST`` body it got, answered 200, kept alive."""

    def __init__(self) -> None:
        self.posts: list[str] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as every platform API

            def do_POST(self) -> None:
                size = int(self.headers["Content-Length"])
                posts.append(self.rfile.read(size).decode())
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class KeepAliveClient:
    """An async platform client: one connection, opened on first use, reused."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def send(self, route: Mapping[str, Any], text: str) -> None:
        if self.conn is None:
            self.conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.conn
        body = text.encode()
        writer.write(b"POST /chat.postMessage HTTP/1.1\r\nHost: platform\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise ConnectionError(f"platform answered {status!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        await reader.readexactly(2)


@pytest.fixture
def platform() -> Iterator[FakePlatform]:
    fake = FakePlatform()
    yield fake
    fake.close()


def channel_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kinbox-channels"]


@pytest.mark.timeout(60)
def test_an_async_adapter_keeping_its_connection_sends_every_reply_once(
        make_runtime: MakeRuntime, platform: FakePlatform) -> None:
    """Each send ran on a new event loop (``asyncio.run``): the connection the first send
    opened belonged to a loop closed since, so the second post went out, its answer could
    not be read, and every retry posted again: four posts, recorded as failed."""
    rt = make_runtime(brain=SocialBrain())
    rt.social.allow("slack", ["U1"])
    rt.social.retry_delays = (0.0, 0.0, 0.0)
    client = KeepAliveClient(platform.port)
    rt.social.register_channel("slack", send=client.send)
    for text in ("one", "two"):
        rt.social.ingest(event(text))
        assert rt.social.wait_idle(10)
    outcomes = [(o["status"], o["attempts"]) for o in rt.social.outcomes]
    assert (platform.posts, outcomes) == (["echo: one", "echo: two"],
                                          [("sent", 1), ("sent", 1)])
    rt.stop()
    assert channel_threads() == []  # the loop ended with the runtime


@pytest.mark.timeout(60)
def test_an_async_send_past_its_timeout_is_cancelled_before_it_is_retried(
        make_runtime: MakeRuntime) -> None:
    """A send that never answered held its thread for good, and one cancelled but still
    running beside its retry would share the adapter's connection with it. The retry
    starts once the cancelled attempt has ended (it may have posted: at least once)."""
    rt = make_runtime(brain=SocialBrain())
    rt.social.allow("slack", ["U1"])
    rt.social.retry_delays = (0.0, 0.0, 0.0)
    rt.social.send_timeout = 0.2
    steps: list[str] = []

    async def send(route: Mapping[str, Any], text: str) -> None:
        attempt = sum(step.startswith("start") for step in steps) + 1
        steps.append(f"start {attempt}")
        try:
            if attempt == 1:
                await asyncio.Event().wait()  # a platform that never answers
        except asyncio.CancelledError:
            steps.append(f"cancelled {attempt}")
            raise
        steps.append(f"sent {attempt}")

    rt.social.register_channel("slack", send=send)
    rt.social.ingest(event("slow"))
    assert rt.social.wait_idle(10)
    assert steps == ["start 1", "cancelled 1", "start 2", "sent 2"]
    outcome = rt.social.outcomes[-1]
    assert (outcome["status"], outcome["attempts"]) == ("sent", 2)


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan"), float("inf"), True, "5"])
def test_a_send_timeout_is_a_finite_number_of_seconds(make_runtime: MakeRuntime,
                                                      seconds: Any) -> None:
    rt = make_runtime(brain=SocialBrain())
    with pytest.raises(ConfigError) as refused:
        rt.social.send_timeout = seconds
    assert refused.value.field == "send_timeout" and rt.social.send_timeout == 30.0


@pytest.mark.timeout(60)
def test_a_stop_cancels_a_send_still_running_and_ends_the_loop(
        make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=SocialBrain())
    rt.social.allow("slack", ["U1"])
    sending, cancelled = threading.Event(), threading.Event()

    async def send(route: Mapping[str, Any], text: str) -> None:
        sending.set()
        try:
            await asyncio.Event().wait()  # a platform that never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    rt.social.register_channel("slack", send=send)
    rt.social.ingest(event("stuck"))
    assert sending.wait(10)
    rt.stop(timeout=0.5)
    assert cancelled.is_set() and channel_threads() == []


@pytest.mark.timeout(30)
def test_the_channel_loop_keeps_the_adapters_error_types_and_refuses_sends_once_closed(
        ) -> None:
    """:func:`.channels.deliver` decides on the error's type (a refusal is not retried)."""
    loop = ChannelLoop()

    async def refused() -> None:
        raise rules.ChannelRefused(403)

    async def loop_of_send() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    async def own_timeout() -> None:
        raise TimeoutError("the platform's client gave up")

    async def slow() -> None:
        await asyncio.Event().wait()  # a platform that never answers (the send's limit ends it)

    try:
        with pytest.raises(rules.ChannelRefused):
            loop.run(refused(), 5)
        # The adapter's own TimeoutError keeps its words; the send's limit says its own.
        with pytest.raises(TimeoutError, match="client gave up"):
            loop.run(own_timeout(), 5)
        with pytest.raises(TimeoutError, match=r"within 0\.05 s: cancelled"):
            loop.run(slow(), 0.05)
        assert loop.run(loop_of_send(), 5) is loop.run(loop_of_send(), 5)
    finally:
        loop.close()
    assert not loop.running()
    late = loop_of_send()
    with pytest.raises(RuntimeStateError):
        loop.run(late, 5)
    assert inspect.getcoroutinestate(late) == inspect.CORO_CLOSED  # no "never awaited"


@pytest.mark.timeout(30)
def test_a_send_racing_the_stop_is_run_and_cancelled_or_refused_never_put_on_a_dead_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop's close (another thread) comes while a send is being scheduled. Before,
    the send took the loop under the lock and scheduled on it after letting go: a close
    in between left it on a closed loop (a bare ``RuntimeError``, its coroutine never
    awaited) or on a stopped one that never ran it (the sender waited out its timeout).
    The close now waits for the scheduling, so the send is on the loop before the
    close's cancel-all, or refused."""
    from kinbox.actors import channel_loop

    loop = ChannelLoop()
    assert loop.run(_answer(), 5) == "posted"  # the loop runs
    real_schedule = asyncio.run_coroutine_threadsafe
    closed = threading.Event()

    def close_meanwhile(coro: Any, target: asyncio.AbstractEventLoop) -> Any:
        monkeypatch.undo()  # once: the close schedules its own cancel-all
        closer = threading.Thread(target=lambda: (loop.close(), closed.set()))
        closer.start()
        # A close that can run now would end within this wait (it did, on the old code);
        # one that waits for the scheduling cannot.
        assert not closed.wait(0.5), "the close ran while a send was being scheduled"
        return real_schedule(coro, target)

    monkeypatch.setattr(channel_loop.asyncio, "run_coroutine_threadsafe", close_meanwhile)
    send = _answer()
    try:
        outcome: object = loop.run(send, 5)
    except (RuntimeStateError, concurrent.futures.CancelledError) as exc:
        outcome = type(exc)
    assert outcome in ("posted", RuntimeStateError, concurrent.futures.CancelledError)
    assert closed.wait(10) and not loop.running()
    assert inspect.getcoroutinestate(send) == inspect.CORO_CLOSED


async def _answer() -> str:
    return "posted"


@pytest.mark.parametrize("delays", [5, "1,2,4", (1.0, "2"), (float("nan"),), (float("inf"),),
                                    (-1.0,), (True,), [[1.0]]])
def test_retry_delays_are_finite_seconds_refused_otherwise(make_runtime: MakeRuntime,
                                                           delays: Any) -> None:
    """``(1, "2")`` (delays read from an environment variable) was taken as it was, and
    the first failed send then raised TypeError between its attempts: the reply was never
    retried, no outcome said why, and only a traceback in the log told of it."""
    rt = make_runtime(brain=SocialBrain())
    with pytest.raises(ConfigError) as refused:
        rt.social.retry_delays = delays
    assert refused.value.field == "retry_delays" and rt.social.retry_delays == (1.0, 2.0, 4.0)


def test_retry_delays_take_any_sequence_of_seconds(make_runtime: MakeRuntime) -> None:
    rt = make_runtime(brain=SocialBrain())
    rt.social.retry_delays = [0, 0.5, 3]
    assert rt.social.retry_delays == (0.0, 0.5, 3.0)
    rt.social.retry_delays = ()  # one attempt only
    assert rt.social.retry_delays == ()
