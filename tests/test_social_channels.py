"""A chat platform's answers to a reply (SO1): a stand-in platform served over HTTP on
127.0.0.1 answers 429, 5xx or 4xx, and :func:`.channels.deliver` waits as it was told,
retries what may pass and gives up at once on what never will."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from kinbox.actors import channels
from kinbox.actors import social_rules as rules
from kinbox.actors.channel_loop import ChannelLoop

from .social_helpers import PlatformServer, respond


class Platform(PlatformServer):
    """A chat platform's message endpoint: answers each post with the next scripted
    ``(status, headers)``, then 200; keeps the bodies it got."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]) -> None:
        self.script = list(script)
        self.posts: list[dict[str, Any]] = []
        super().__init__(self._answer)

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        self.posts.append(body)
        respond(handler, *(self.script.pop(0) if self.script else (200, {})))


@pytest.fixture
def platform_script() -> list[tuple[int, dict[str, str]]]:
    return []


@pytest.fixture
def platform(platform_script: list[tuple[int, dict[str, str]]]) -> Iterator[Platform]:
    served = Platform(platform_script)
    yield served
    served.close()


NOW = 1_800_000_000.0


def post_to(platform: Platform) -> channels.Send:
    """A product's channel adapter: post the reply; an error answer becomes the error
    kinbox decides on (:func:`.channels.platform_error`)."""

    def send(route: Mapping[str, Any], text: str) -> None:
        data = json.dumps({"channel": route["channel"], "text": text}).encode()
        request = urllib.request.Request(platform.url, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            error = channels.platform_error(exc.code, exc.headers.get("Retry-After"), NOW)
            raise (error or exc) from None
    return send


def deliver(platform: Platform, delays: tuple[float, ...] = (1.0, 2.0, 4.0)
            ) -> tuple[channels.DeliveryOutcome, list[float]]:
    waits: list[float] = []

    def wait(seconds: float) -> bool:  # no time passes: the test sees what was asked
        waits.append(seconds)
        return False
    loop = ChannelLoop()  # never started: the adapter is a plain function
    try:
        outcome = channels.deliver(post_to(platform), {"channel": "C9"}, "hi",
                                   retry_delays=delays, wait=wait, loop=loop)
    finally:
        loop.close()
    return outcome, waits


@pytest.mark.parametrize("platform_script", [[(429, {"Retry-After": "30"}),
                                               (503, {"Retry-After": "7"})]])
def test_a_platform_asking_to_wait_is_retried_no_sooner_than_it_said(
        platform: Platform) -> None:
    """A 429 (or 503) with ``Retry-After`` was retried after the fixed 1 and 2 s: a
    throttled app hammers the platform, and a wait longer than the schedule (7 s in all)
    lost the reply. The wait is now the longer of the two, capped."""
    outcome, waits = deliver(platform)
    assert outcome == channels.DeliveryOutcome("sent", 3)
    assert waits == [30.0, 7.0]
    assert len(platform.posts) == 3 and platform.posts[-1] == {"channel": "C9", "text": "hi"}


@pytest.mark.parametrize("platform_script", [[(429, {"Retry-After": "86400"})]])
def test_a_platform_asking_for_a_very_long_wait_is_capped(platform: Platform) -> None:
    """A chat's next turn waits for its reply: a day's wait is cut to the cap."""
    outcome, waits = deliver(platform)
    assert outcome.status == "sent" and waits == [channels.MAX_RETRY_AFTER]


@pytest.mark.parametrize("platform_script", [[(500, {}), (502, {})]])
def test_server_errors_are_retried_on_the_schedule(platform: Platform) -> None:
    outcome, waits = deliver(platform)
    assert outcome == channels.DeliveryOutcome("sent", 3) and waits == [1.0, 2.0]


@pytest.mark.parametrize("platform_script", [[(403, {}), (403, {})]])
def test_a_refusal_for_good_is_not_retried(platform: Platform) -> None:
    """A 4xx (a channel the app may not post to, a bad token) never passes: it was retried
    three times for nothing; it fails at once now, the status in the outcome."""
    outcome, waits = deliver(platform)
    assert (outcome.status, outcome.attempts, waits) == ("failed", 1, [])
    assert "403" in (outcome.error or "") and len(platform.posts) == 1


@pytest.mark.parametrize("status, retry_after, expected", [
    (200, None, None),
    (429, None, rules.ChannelBusy(None)),
    (429, "12", rules.ChannelBusy(12.0)),
    (503, format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True),
     rules.ChannelBusy(90.0)),
    (429, "soon", rules.ChannelBusy(None)),
    (429, "-5", rules.ChannelBusy(None)),
    (408, None, rules.ChannelBusy(None)),
    (500, None, rules.ChannelBusy(None)),
    (404, None, rules.ChannelRefused(404)),
])
def test_platform_answers_become_errors_to_decide_on(status: int, retry_after: str | None,
                                                     expected: rules.SocialError | None
                                                     ) -> None:
    error = channels.platform_error(status, retry_after, NOW)
    assert type(error) is type(expected)
    if isinstance(expected, rules.ChannelBusy):
        assert isinstance(error, rules.ChannelBusy)
        assert error.retry_after == expected.retry_after
    if isinstance(expected, rules.ChannelRefused):
        assert isinstance(error, rules.ChannelRefused) and error.status == expected.status
