"""Shared parts of the social tests: raw events, an echoing brain, a runtime with a
channel that records what it sent, a chat platform's endpoint served on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kinbox.actors import Runtime, Turn

MakeRuntime = Callable[..., Runtime]
SocialRt = tuple[Runtime, "SocialBrain", list[tuple[Any, str]]]


def event(text: str = "hello", sender: str = "U1", thread: str = "T1", **extra: Any
          ) -> dict[str, Any]:
    return {"platform": "slack", "sender_id": sender, "sender_name": f"name-{sender}",
            "thread_id": thread, "text": text, "reply_route": {"channel": "C9", "ts": thread},
            **extra}


class SocialBrain:
    """Echoes what it got; can hold its first turn open and take steering when released."""

    def __init__(self) -> None:
        self.turns: list[list[str]] = []
        self.hold = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.failing: str | None = None

    def __call__(self, turn: Turn) -> str:
        if self.failing:
            raise RuntimeError(self.failing)
        if self.hold.is_set():
            self.hold.clear()
            self.holding.set()
            assert self.release.wait(10)
            turn.steering()
        texts = [m.content.splitlines()[-1] for m in turn.all_messages]
        self.turns.append(texts)
        return "echo: " + " | ".join(texts)


def social_runtime(make_runtime: MakeRuntime) -> SocialRt:
    """A runtime with a :class:`SocialBrain`, U1 and U2 allowed on slack, and a slack
    channel that records what it sends (retrying at once)."""
    brain = SocialBrain()
    rt = make_runtime(brain=brain)
    sent: list[tuple[Any, str]] = []
    rt.social.allow("slack", ["U1", "U2"])
    rt.social.register_channel("slack", send=lambda route, text: sent.append((route, text)))
    rt.social.retry_delays = (0.0, 0.0, 0.0)
    return rt, brain, sent


Answer = Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]
"""How a stand-in platform answers a post: ``answer(handler, json_body)``."""


class PlatformServer:
    """A chat platform's message endpoint served over HTTP on 127.0.0.1: each POST's JSON
    body goes to ``answer``, which answers it (:func:`respond`) or leaves it unanswered."""

    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                answer(self, json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/chat.postMessage"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def respond(handler: BaseHTTPRequestHandler, status: int,
            headers: dict[str, str] | None = None) -> None:
    """Answer a post with ``status`` and ``headers``, and no body."""
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", "0")
    handler.end_headers()
