"""The rules of social ingress (SO1): validating, authorizing and routing channel events.

Pure: no threads, queues or clocks. A raw event from a chat platform is
normalized into a :class:`SocialEvent` (or refused with a precise
:class:`InvalidSocialEvent`); its sender is authorized by id against the
platform's allowlist (display names are ignored, an empty list denies);
its thread becomes the session ``social-<platform>-<thread>``; and
:func:`route` decides whether it starts a turn, steers the running one (same
sender) or waits for the chat's running turn to end (anyone else).

Errors::

    KinboxError
    └── SocialError
        ├── InvalidSocialEvent   .field, .reason: the event is malformed, nothing queued
        │                        (also a ConfigError)
        ├── SocialQueueFull      .bound, .refused: the ingress queue is full
        ├── UnknownPlatform      .platform: no channel registered for it
        ├── SocialUnavailable    this runtime runs no turns (send-only)
        ├── ChannelBusy          .retry_after: a channel adapter's platform asked to
        │                        wait (429, 5xx): retried, no sooner than it said
        └── ChannelRefused       .status: the platform refused a reply for good
                                 (a 4xx): not retried
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, KinboxError
from .social_envelope import envelope as envelope  # the turn's text, rendered there
from .validation import QUOTE_LIMIT, quoted, unstorable

PLATFORM_RE = re.compile(r"[a-z0-9_]{1,32}")
"""Platform names: lower-case, no dash (the dash separates platform and thread in ids)."""
SAFE_THREAD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
MAX_TEXT = 20_000
MAX_ATTACHMENTS = 10
ATTACHMENT_LIMITS = {"url": 2048, "name": 256, "mime_type": 128}
"""The most characters of each attachment field (a longer one is refused, never cut: a
cut pre-signed URL reaches the turn and fails there, far from the cause)."""
MAX_ID = 256
SOCIAL_PROJECT = "social"
MIN_SECRET_BYTES = 16
"""The shortest webhook signing secret (encoded): a shorter one is guessed by trying, and
whoever guesses it signs events as the platform (Slack's are 32 hex digits)."""


class SocialError(KinboxError):
    """Base class of the social ingress errors."""


class InvalidSocialEvent(SocialError, ConfigError):
    """A raw event is malformed; ``field`` names what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid social event {field}: {reason}", field)
        self.reason = reason


class SocialQueueFull(SocialError):
    """The ingress queue holds ``bound`` events already; this one was refused."""

    def __init__(self, bound: int, refused: int) -> None:
        super().__init__(f"the social ingress queue is full ({bound} events); "
                         f"try again later ({refused} refused so far)")
        self.bound = bound
        self.refused = refused


class UnknownPlatform(SocialError):
    """No channel is registered for this platform."""

    def __init__(self, platform: str) -> None:
        super().__init__(f"no social channel is registered for platform {quoted(platform)}")
        self.platform = platform


class SocialUnavailable(SocialError):
    """This runtime has no brain, so it cannot take social events."""

    def __init__(self) -> None:
        super().__init__("this runtime runs no turns (no brain); send social events to one "
                         "that does")


class ChannelBusy(SocialError):
    """Raised by a channel adapter's ``send``: the platform cannot take the reply now (429,
    408, 5xx); ``retry_after``: seconds it asked to wait (None: it did not say). The
    reply is tried again on the schedule, no sooner than that."""

    def __init__(self, retry_after: float | None, detail: str = "") -> None:
        wait = f"; it asked to wait {retry_after:g} s" if retry_after is not None else ""
        super().__init__(f"the platform is busy{wait}" + (f": {detail}" if detail else ""))
        self.retry_after = retry_after


class ChannelRefused(SocialError):
    """Raised by a channel adapter's ``send``: the platform refused the reply for good (a
    4xx: a channel the app may not post to, a revoked token); it is not tried again."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(f"the platform refused the reply ({status})"
                         + (f": {detail}" if detail else ""))
        self.status = status


@dataclass(frozen=True)
class Attachment:
    """A file that came with an event (referenced, not downloaded)."""

    url: str
    name: str = ""
    mime_type: str = ""


@dataclass(frozen=True)
class SocialEvent:
    """A validated, normalized channel event."""

    event_id: str
    platform: str
    sender_id: str
    sender_name: str
    thread_id: str
    text: str
    attachments: tuple[Attachment, ...] = ()
    reply_route: Mapping[str, Any] = field(default_factory=dict)
    """Where a reply goes (channel id, thread ts...): handed to the channel adapter as is."""


def _text_field(raw: Mapping[str, Any], name: str, *, required: bool,
                limit: int = MAX_ID) -> str:
    value = raw.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidSocialEvent(name, "give a non-empty string")
    if len(value) > limit:
        raise InvalidSocialEvent(name, f"at most {limit} characters")
    return _storable(name, value).strip()


def _one_line(name: str, text: str) -> str:
    """``text``, if it has no control character or line break: the envelope's first line
    names the sender from it, and a line break would let a display name write a line of
    its own (a forged sender id)."""
    for i, char in enumerate(text):
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            raise InvalidSocialEvent(name, f"one line: a control character or line break "
                                           f"{char!r} at position {i}")
    return text


def _storable(name: str, text: str) -> str:
    """``text``, if it can be stored (:func:`.validation.unstorable`)."""
    if (problem := unstorable(text)) is not None:
        raise InvalidSocialEvent(name, problem)
    return text


def _attachments(raw: object) -> tuple[Attachment, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidSocialEvent("attachments", "give a list of objects with a url")
    if len(raw) > MAX_ATTACHMENTS:
        raise InvalidSocialEvent("attachments", f"at most {MAX_ATTACHMENTS}")
    found = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("url"), str) \
                or not item["url"].startswith(("https://", "http://")):
            raise InvalidSocialEvent(f"attachments[{i}]", "give an object with an http(s) url")
        stray = [key for key in item if key not in ATTACHMENT_LIMITS]
        if stray:  # a misspelt one (mimeType) was dropped unread
            raise InvalidSocialEvent(f"attachments[{i}]", f"{quoted(stray[0])} is not a field "
                                     f"of an attachment; its fields are url, name, mime_type")
        name, mime = item.get("name", ""), item.get("mime_type", "")
        if not isinstance(name, str) or not isinstance(mime, str):
            raise InvalidSocialEvent(f"attachments[{i}]", "name and mime_type are strings")
        values = {"url": item["url"], "name": name, "mime_type": mime}
        for key, value in values.items():
            if len(value) > ATTACHMENT_LIMITS[key]:
                raise InvalidSocialEvent(f"attachments[{i}]", f"the {key} is at most "
                                         f"{ATTACHMENT_LIMITS[key]} characters")
            # On the envelope's attachment line: a line break would write a line of its
            # own (a forged header), and a URL holds no whitespace.
            _one_line(f"attachments[{i}]", _storable(f"attachments[{i}]", value))
        if any(char.isspace() for char in item["url"]):
            raise InvalidSocialEvent(f"attachments[{i}]", "a url holds no whitespace")
        found.append(Attachment(**values))
    return tuple(found)


EVENT_FIELDS = ("platform", "sender_id", "sender_name", "thread_id", "text", "attachments",
                "reply_route", "event_id")
"""The fields of a raw event: any other is a mistake (a misspelt ``event_id`` lost the
platform's retries their de-duplication), refused as ``POST /cron/jobs`` refuses one."""


def normalize(raw: object, event_id: str, platform: str | None = None) -> SocialEvent:
    """Validate a raw event (a JSON object); ``platform``, when given (the webhook's route),
    is the event's, and one the event names must be the same."""
    if not isinstance(raw, Mapping):
        raise InvalidSocialEvent("event", "give a JSON object")
    unknown = [key for key in raw if key not in EVENT_FIELDS]
    if unknown:
        key = unknown[0]
        name = key if isinstance(key, str) and len(key) <= QUOTE_LIMIT else quoted(key)
        raise InvalidSocialEvent(name, f"not a field of an event; its fields are "
                                       f"{', '.join(EVENT_FIELDS)}")
    if platform is not None and raw.get("platform", platform) != platform:
        raise InvalidSocialEvent("platform", f"the event names platform "
                                             f"{quoted(raw['platform'])}, its route {platform!r}")
    plat = platform if platform is not None else raw.get("platform")
    if not isinstance(plat, str) or not PLATFORM_RE.fullmatch(plat):
        raise InvalidSocialEvent("platform", "1-32 characters of a-z, 0-9 and _")
    sender_id = _one_line("sender_id", _text_field(raw, "sender_id", required=True))
    sender_name = _one_line("sender_name",
                            _text_field(raw, "sender_name", required=False)) or sender_id
    thread_id = _text_field(raw, "thread_id", required=True)
    text = _text_field(raw, "text", required=False, limit=MAX_TEXT)
    attachments = _attachments(raw.get("attachments"))
    if not text and not attachments:
        raise InvalidSocialEvent("text", "give text or at least one attachment")
    route = raw.get("reply_route")
    if route is None:  # absent, or null as every other optional field may be
        route = {}
    if not isinstance(route, Mapping):
        raise InvalidSocialEvent("reply_route", "give a JSON object")
    try:  # it is kept with the session and the reply as JSON, its keys sorted: every key
        # and value must be storable so (keys of two types cannot be sorted)
        stored = json.dumps(route, ensure_ascii=False, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        raise InvalidSocialEvent("reply_route", "give a JSON object") from None
    _storable("reply_route", stored)
    # As JSON gives it back: the adapter gets now what a restart gives it from the kept
    # reply (string keys, lists), not the caller's own objects.
    route = json.loads(stored)
    given_id = raw.get("event_id")
    if given_id is not None:
        if not isinstance(given_id, str) or not given_id.strip() or len(given_id) > 128:
            raise InvalidSocialEvent("event_id", "a non-empty string of at most 128 characters")
        _storable("event_id", given_id)
        event_id = f"social-{plat}-{given_id.strip()}"
    return SocialEvent(event_id, plat, sender_id, sender_name, thread_id, text, attachments,
                       dict(route))


def reply_text(replies: Iterable[str]) -> str:
    """What a turn's replies post to the platform: those with something to say, joined by
    a blank line; "" when none has (nothing is posted). A blank one (whitespace, or an
    empty ``turn.reply("")``) is dropped: every platform refuses an empty message (Slack's
    ``no_text``, Discord's and Telegram's 400), so it would only fail, or pad the others."""
    return "\n\n".join(text for text in replies if text.strip())


SESSION_PREFIX = "social-"
"""What every social thread's session id starts with."""


def session_id_for(platform: str, thread_id: str) -> str:
    """The session of a thread: ``social-<platform>-<thread>``, the thread kept when safe.

    A thread id with other characters (or one that could pass for a hashed
    one) becomes ``h_`` and 24 hex digits of its SHA-256, so two threads never share a
    session.
    """
    if SAFE_THREAD_RE.fullmatch(thread_id) and not thread_id.startswith("h_"):
        return f"{SESSION_PREFIX}{platform}-{thread_id}"
    digest = hashlib.sha256(thread_id.encode()).hexdigest()[:24]
    return f"{SESSION_PREFIX}{platform}-h_{digest}"


def allowed_sender(value: object) -> str:
    """``value`` as an allowlist entry: an id an event's sender can have (:func:`normalize`
    strips it and keeps it to one line), else :class:`InvalidSocialEvent`. One no event
    can carry (``" U2"``, from ``"U1, U2".split(",")``) denied its sender in silence."""
    if not isinstance(value, str) or not value:
        raise InvalidSocialEvent("sender_id", "allowlist entries are non-empty ids")
    if value != value.strip() or len(value) > MAX_ID:
        raise InvalidSocialEvent("sender_id", f"the allowlist entry {quoted(value)} is no "
                                              f"sender id an event can have (at most {MAX_ID} "
                                              "characters, no surrounding whitespace)")
    return _one_line("sender_id", _storable("sender_id", value))


def authorized(allowlist: Mapping[str, frozenset[str]], platform: str, sender_id: str) -> bool:
    """True when ``sender_id`` is on the platform's allowlist (an empty list denies)."""
    return sender_id in allowlist.get(platform, frozenset())


class Route(enum.Enum):
    """What an authorized event does to its chat."""

    START = "start"
    """The chat is idle: the event starts a turn."""
    STEER = "steer"
    """The same sender's turn is running: the event joins it."""
    QUEUE = "queue"
    """Someone else's turn is running: the event waits for it to end."""


def route(running_sender: str | None, sender_id: str) -> Route:
    """Route an event given who started the chat's running turn (None: none runs)."""
    if running_sender is None:
        return Route.START
    return Route.STEER if running_sender == sender_id else Route.QUEUE


STALL_PAUSE = 1.0
"""Seconds before a chat first tries again a turn that could not run at all (a database
error marking or creating its session, say): a brief hiccup passes."""
STALL_PAUSE_CAP = 30.0
"""The longest pause between tries: a lasting error is not hammered, and is still tried
twice a minute."""


def stall_pause(stalls: int) -> float:
    """Seconds a chat waits after its ``stalls``-th turn in a row that could not run: 1, 2,
    4, 8, 16, then 30 each time."""
    if stalls < 1:
        raise ValueError(f"stalls must be >= 1, got {stalls}")
    return min(STALL_PAUSE_CAP, STALL_PAUSE * 2.0 ** min(stalls - 1, 32))


COMMIT_ATTEMPTS = 5
"""How many times a social event's turn runs when the database refuses its commit each
time (as an inbox row's attempts): then its events fail, recorded ``turn_failed``. The
brain is a model call: a commit that can never succeed must not rerun it for ever."""
