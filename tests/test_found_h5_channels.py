"""Found by helper 5 (bug hunt): an ``async def`` channel adapter that keeps its connection.

README ("Replies"): ``send`` "may be a plain function or a coroutine function". An async
adapter keeps one client and its pooled keep-alive connection to the platform (httpx's
``AsyncClient``, aiohttp's ``ClientSession``: the platforms' SDKs do). Here the platform is
a real HTTP/1.1 server on 127.0.0.1 and the client is the smallest keep-alive client:
one connection, opened on first use, reused for every post.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

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


@pytest.mark.timeout(60)
def test_an_async_channel_adapter_keeping_its_connection_sends_every_reply_once(
        make_runtime: MakeRuntime, platform: FakePlatform) -> None:
    rt = make_runtime(brain=SocialBrain())
    rt.social.allow("slack", ["U1"])
    rt.social.retry_delays = (0.0, 0.0, 0.0)
    client = KeepAliveClient(platform.port)
    rt.social.register_channel("slack", send=client.send)
    for text in ("one", "two"):
        rt.social.ingest(event(text))
        assert rt.social.wait_idle(10)
    outcomes = [(o["status"], o["attempts"]) for o in rt.social.outcomes]
    # Each reply posted once, and said sent at the first attempt. The second send ran its
    # coroutine on a new event loop (call_send's asyncio.run): the connection the first
    # send opened belongs to the first loop, closed since, so the post went out and its
    # answer could not be read; the send was retried on it, posting again each time.
    assert (platform.posts, outcomes) == (["echo: one", "echo: two"],
                                          [("sent", 1), ("sent", 1)])
