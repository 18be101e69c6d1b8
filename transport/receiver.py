"""The receiving side of an open peer link: frames in, actions out (pure).

After the handshake, every text the peer sends goes through
:meth:`ReceiverLink.receive`, which validates it, applies the grant's scopes
and the per-connection rate limit, and returns what the adapter must do:
commit a delivery (then send the ack it is given), answer a read or a stop,
or send an error. A bad frame is answered with an ``error`` frame and
touches nothing; too many of them, or too many frames too fast, close the
link. Time comes in as an argument.

Session names: a delivery without a name goes to the peer's dedicated
session ``suzent:<device_id>``; a streaming name ``[A-Za-z0-9_-]{1,64}``
becomes ``suzent:<device_id>:<name>``; anything else is rejected (P4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import frames as f
from .errors import FrameError
from .grants import allows

SESSION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def dedicated_session(device_id: str) -> str:
    """The session a paired device's messages wake on this side."""
    return f"suzent:{device_id}"


def session_for(device_id: str, name: str | None) -> str | None:
    """The local session for a delivery, or None when the name is not allowed."""
    if name is None:
        return dedicated_session(device_id)
    if SESSION_NAME.fullmatch(name) is None:
        return None
    return f"suzent:{device_id}:{name}"


def inbox_id(device_id: str, message_id: str) -> str:
    """The receiver's inbox id of a peer message: a repeat maps to the same row."""
    return f"peer-{device_id}-{message_id}"


@dataclass(frozen=True)
class Commit:
    """Commit this message to ``session`` as inbox row ``inbox_id``, then send ``ack``."""

    message_id: str
    inbox_id: str
    session: str
    text: str
    ack: str


@dataclass(frozen=True)
class Answer:
    """A read or stop request of the dedicated session."""

    req: str
    action: str


@dataclass(frozen=True)
class Send:
    """Send this encoded frame."""

    text: str


@dataclass(frozen=True)
class Close:
    """Close the link with this websocket code and reason."""

    code: int
    reason: str


Action = Commit | Answer | Send | Close


@dataclass
class RateLimit:
    """A token bucket: ``rate`` frames a second, bursts up to ``burst``."""

    rate: float = 5000.0
    burst: float = 10000.0
    tokens: float = -1.0
    at: float = 0.0

    def take(self, now: float) -> bool:
        """Spend one token at ``now``; False when the bucket is empty."""
        if self.tokens < 0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


BAD_FRAME_LIMIT = 100
"""Bad frames a connection may send before it is closed."""


class ReceiverLink:
    """One authenticated inbound link from ``device_id`` with ``scopes``."""

    def __init__(self, device_id: str, scopes: frozenset[str],
                 limit: RateLimit | None = None) -> None:
        self.device_id = device_id
        self.scopes = scopes
        self.limit = limit or RateLimit()
        self.bad_frames = 0
        self.closed = False

    def receive(self, data: bytes | str, now: float) -> list[Action]:
        """What to do about one message from the peer."""
        if self.closed:
            return []
        if not self.limit.take(now):
            return self._close(1008, "rate limit exceeded",
                               f.Error(None, "rate_limited", "too many frames"))
        try:
            frame = f.parse(data)
        except FrameError as exc:
            return self._bad_frame(exc.reason)
        return self._handle(frame)

    def _handle(self, frame: f.Frame) -> list[Action]:
        if isinstance(frame, f.Ping):
            return [Send(f.encode(f.Pong(frame.req)))]
        if isinstance(frame, f.Deliver):
            if not allows(self.scopes, "deliver"):
                return [Send(f.encode(f.Error(frame.id, "forbidden", "no deliver scope")))]
            session = session_for(self.device_id, frame.session)
            if session is None:
                return [Send(f.encode(f.Error(frame.id, "rejected",
                                              "session names are [A-Za-z0-9_-]{1,64}")))]
            if f.is_blank(frame.text):
                return [Send(f.encode(f.Error(frame.id, "rejected", "the message is empty")))]
            return [Commit(frame.id, inbox_id(self.device_id, frame.id), session, frame.text,
                           f.encode(f.Ack(frame.id)))]
        if isinstance(frame, f.Read | f.Stop):
            action = frame.TYPE
            if not allows(self.scopes, action):
                return [Send(f.encode(f.Error(None, "forbidden", f"no {action} scope")))]
            return [Answer(frame.req, action)]
        if isinstance(frame, f.Pong):
            return []
        return self._bad_frame(f"unexpected {frame.TYPE} frame")

    def _bad_frame(self, reason: str) -> list[Action]:
        """A frame off the format, or of a type an open link does not take: answered,
        and counted toward :data:`BAD_FRAME_LIMIT`, whichever it was."""
        self.bad_frames += 1
        if self.bad_frames > BAD_FRAME_LIMIT:
            return self._close(1008, "too many bad frames", f.Error(None, "bad_frame", reason))
        return [Send(f.encode(f.Error(None, "bad_frame", reason)))]

    def _close(self, code: int, reason: str, frame: f.Error) -> list[Action]:
        self.closed = True
        return [Send(f.encode(frame)), Close(code, reason)]
